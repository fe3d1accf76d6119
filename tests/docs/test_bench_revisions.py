"""The before/after comparison reads each benchmark's ratios from its real output and flags a slower revision."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_revisions.py"
spec = importlib.util.spec_from_file_location("bench_revisions", SCRIPT)
assert spec is not None and spec.loader is not None
bench_revisions = importlib.util.module_from_spec(spec)
sys.modules["bench_revisions"] = bench_revisions
spec.loader.exec_module(bench_revisions)

FS = """scratch /tmp/bench-fs-x, 4 threads, 32 MiB per case, best of 1, o_direct auto, 1 blocks per job
   block  path  store GB/s  load GB/s
   256Ki   raw       0.260      0.581
   256Ki  tier       0.432      0.634
   256Ki ratio       1.66x      1.09x  (128 blocks, cold loads)
"""
S3 = """endpoint http://127.0.0.1:51857, concurrency 8, 1 rounds (median)
    size blocks   op  tier MB/s  raw MB/s  ratio
 256 KiB     32  put       48.9      52.3   0.94
   2 MiB      8  get      121.6     117.5   1.04
"""
REDIS = (
    "  256 KiB x   64: store tier 0.19 GB/s raw 0.14 GB/s ratio 1.29 (1/1 pairs >= 0.9) | "
    "load tier 0.25 GB/s raw 0.17 GB/s ratio 1.46 (1/1 pairs >= 0.9)\n"
)
NATIVE = """## 256KiB x 64, jobs of 16, busy scheduler
ours/vllm: store 0.87x (0/1 pairs >= 1.2), load 1.01x (1/1 pairs >= 1)
user CPU per block ours/vllm: store 0.09x (1/1 pairs <= 1.5), load 0.83x (1/1 pairs <= 1.5)
ours/raw: store 1.60x (1/1 pairs >= 0.95), load 3.24x (1/1 pairs >= 0.95)
"""


def test_parsers_read_every_ratio_of_real_outputs() -> None:
    assert bench_revisions._fs(FS) == {"fs 256Ki store/raw": 1.66, "fs 256Ki load/raw": 1.09}
    assert bench_revisions._s3(S3) == {"s3 256 KiB put/raw": 0.94, "s3 2 MiB get/raw": 1.04}
    assert bench_revisions._redis(REDIS) == {"redis 256 KiB store/raw": 1.29, "redis 256 KiB load/raw": 1.46}
    assert bench_revisions._vllm_native(NATIVE) == {
        "vllm-native 256KiB x 64, jobs of 16, busy scheduler ours/vllm store": 0.87,
        "vllm-native 256KiB x 64, jobs of 16, busy scheduler ours/vllm load": 1.01,
        "vllm-native 256KiB x 64, jobs of 16, busy scheduler ours/raw store": 1.60,
        "vllm-native 256KiB x 64, jobs of 16, busy scheduler ours/raw load": 3.24,
    }


def test_report_flags_a_figure_below_the_tolerance_and_a_missing_one(capsys) -> None:
    results = {
        "before": {"a": [1.0, 1.2, 1.1], "b": [2.0, 2.0], "c": [1.0]},
        "after": {"a": [1.05, 1.0, 1.1], "b": [1.7, 1.8]},
    }
    assert bench_revisions.report(results, 0.10) == 1
    out = capsys.readouterr().out
    assert "b" in out and "0.88x  below tolerance" in out
    assert "missing" in out
    assert "2 figure(s) more than 10% below" in out
    assert bench_revisions.report({"before": {"a": [1.0]}, "after": {"a": [0.95]}}, 0.10) == 0

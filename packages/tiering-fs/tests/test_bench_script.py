"""scripts/bench_fs.py runs with the packages' runtime dependencies only (no pytest)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "bench_fs.py"

RUN_WITHOUT_PYTEST = """
import runpy, sys
sys.modules["pytest"] = None  # any import of pytest now raises ImportError
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_bench_fs_runs_without_pytest(tmp_path):
    argv = ["--dir", str(tmp_path), "--sizes-kib", "64", "--total-mib", "1", "--threads", "2", "--repeat", "1"]
    run = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_PYTEST, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    ratio = [line for line in run.stdout.splitlines() if "ratio" in line]
    assert len(ratio) == 1 and ratio[0].split()[2].endswith("x"), run.stdout

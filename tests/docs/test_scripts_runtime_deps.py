"""The benchmark scripts need the packages' runtime dependencies only: none imports pytest (or a module that does)."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

IMPORT_WITHOUT_PYTEST = """
import runpy, sys
sys.modules["pytest"] = None  # any import of pytest now raises ImportError
sys.path.insert(0, sys.argv[2])  # scripts import each other's helpers
try:
    runpy.run_path(sys.argv[1], run_name="imported_without_pytest")  # module level only: main() does not run
except ImportError as exc:  # an optional engine (torch, vLLM) missing here is not what this test is about
    if getattr(exc, "name", None) == "pytest" or "pytest" in str(exc):
        raise
    print(f"SKIP {getattr(exc, 'name', None) or exc}")
    raise SystemExit(0)
"""


@pytest.mark.parametrize("script", sorted(SCRIPTS.glob("bench_*.py")), ids=lambda p: p.name)
def test_benchmark_imports_without_pytest(script):
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_WITHOUT_PYTEST, str(script), str(SCRIPTS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    if run.stdout.startswith("SKIP"):
        pytest.skip(f"{script.name} needs {run.stdout.removeprefix('SKIP ').strip()}, not installed here")

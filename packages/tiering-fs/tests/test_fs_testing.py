"""tiering.fs.testing without pytest: the import error names the distribution that brings it."""

import subprocess
import sys


def test_importing_the_fixtures_without_pytest_names_the_distribution():
    code = "import sys; sys.modules['pytest'] = None; import tiering.fs.testing"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: tiering.fs.testing (test fixtures) runs under pytest"), last
    assert "pip install tiering-testing" in last

"""The conformance suites' dependency is declared: the ``testing`` extra, named by the import error."""

import subprocess
import sys
from importlib.metadata import requires


def test_the_testing_extra_brings_pytest():
    wanted = [
        r
        for r in requires("tiering-core") or []
        if r.startswith("pytest") and r.replace('"', "'").endswith("'testing'")
    ]
    assert wanted, requires("tiering-core")


def test_importing_the_suites_without_pytest_names_the_extra():
    code = "import sys; sys.modules['pytest'] = None; import tiering.core.testing"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: tiering.core.testing (the conformance suites) runs under pytest"), last
    assert "pip install 'tiering-core[testing]'" in last

"""The suites' dependencies are declared: tiering-testing brings pytest; the old import path still works, warned."""

import subprocess
import sys
from importlib.metadata import requires


def test_the_distribution_requires_core_and_pytest():
    wanted = {r.split(">")[0].split("<")[0].split("=")[0].strip() for r in requires("tiering-testing") or []}
    assert {"tiering-core", "pytest"} <= wanted, requires("tiering-testing")


def test_core_ships_no_test_code():
    import tiering.core

    old = __import__("pathlib").Path(tiering.core.__file__).parent / "testing"
    assert [p.name for p in old.iterdir() if p.suffix == ".py"] == ["__init__.py"]  # the deprecated alias only
    assert "forward(__name__" in (old / "__init__.py").read_text()


def test_the_old_import_path_warns_and_gives_the_same_suite():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    import tiering.core.testing\nexcept DeprecationWarning as w:\n    print('warned:', w)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "warned: tiering.core.testing moved to tiering.testing (distribution tiering-testing)" in proc.stdout, (
        proc.stdout + proc.stderr
    )
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import tiering.core.testing as old

    import tiering.testing

    assert old.TierConformanceTests is tiering.testing.TierConformanceTests
    assert old.make_key is tiering.testing.make_key

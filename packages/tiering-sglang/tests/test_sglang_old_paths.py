"""The old import path of the adapter (tiering.core.sglang) still works for one release, with a DeprecationWarning."""

import subprocess
import sys
import warnings


def test_the_old_package_path_warns_and_is_the_new_package():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    import tiering.core.sglang\nexcept DeprecationWarning as w:\n    print('warned:', w)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "warned: tiering.core.sglang moved to tiering.sglang (distribution tiering-sglang)" in proc.stdout, (
        proc.stdout + proc.stderr
    )


def test_the_old_module_path_gives_the_same_classes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from tiering.core.sglang import storage as old

    from tiering.sglang import storage as new

    assert old is new
    assert old.TieringHiCacheStorage is new.TieringHiCacheStorage

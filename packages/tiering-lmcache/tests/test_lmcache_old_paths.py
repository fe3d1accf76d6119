"""The old import path of the adapter (tiering.core.lmcache) still works for one release, with a DeprecationWarning."""

import subprocess
import sys
import warnings


def test_the_old_package_path_warns_and_is_the_new_package():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    import tiering.core.lmcache\nexcept DeprecationWarning as w:\n    print('warned:', w)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "warned: tiering.core.lmcache moved to tiering.lmcache (distribution tiering-lmcache)" in proc.stdout, (
        proc.stdout + proc.stderr
    )


def test_the_old_module_path_gives_the_same_classes():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from tiering.core.lmcache import adapter as old

    from tiering.lmcache import adapter as new

    assert old is new
    assert old.TieringL2Adapter is new.TieringL2Adapter

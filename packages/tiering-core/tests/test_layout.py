"""The PEP 420 namespace guardrail: no distribution may ship tiering/__init__.py."""

from pathlib import Path

import tiering

REPO = Path(__file__).resolve().parents[3]


def test_no_package_ships_a_tiering_init():
    packages = sorted((REPO / "packages").glob("tiering-*"))
    assert packages, "no packages found"
    offenders = [p for p in packages if (p / "src" / "tiering" / "__init__.py").exists()]
    assert offenders == []


def test_tiering_is_a_namespace_package():
    assert getattr(tiering, "__file__", None) is None
    assert len(list(tiering.__path__)) >= 1


def test_core_imports_without_torch_or_vllm():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['vllm'] = None\n"
        "import tiering.core, tiering.core.runtime.manager, tiering.core.store.tier\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"

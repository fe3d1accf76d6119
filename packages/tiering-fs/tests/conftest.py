"""Fixtures of the fs tier tests; also makes fs_test_helpers importable (pytest runs with --import-mode=importlib)."""

import sys
import uuid
from pathlib import Path

import fsspec
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fs_test_helpers import make_spec

from tiering.core.primary import allocate_host_buffer
from tiering.fs import FsspecSecondaryTierManager, native


@pytest.fixture
def python_io(monkeypatch):
    """The pure-Python block I/O path, for tests that inject faults by patching ``os`` or the back end."""
    monkeypatch.setenv(native.ENV_VAR, "0")


@pytest.fixture(params=["native", "python"])
def io_path(request, monkeypatch):
    """Run a test on both block I/O paths (modules opt in with ``pytestmark = pytest.mark.usefixtures("io_path")``).

    The native run is skipped when the library is not built (``python packages/tiering-fs/hatch_build.py``
    builds it; test_fs_native.py fails when a C compiler is there and the library is not).
    """
    if request.param == "python":
        monkeypatch.setenv(native.ENV_VAR, "0")
    elif "python_io" in request.fixturenames:
        pytest.skip("injects faults into the pure-Python path")
    elif native._load()[0] is None:
        pytest.skip(f"native library not built: {native._load()[1]}")
    else:
        monkeypatch.delenv(native.ENV_VAR, raising=False)
    return request.param


@pytest.fixture
def open_tier():
    """Factory: open_tier(root, spec=None, num_blocks=16, **config) -> (tier, view); all shut down at teardown."""
    opened = []

    def _open(root, spec=None, num_blocks=16, **config):
        spec = spec or make_spec()
        view = allocate_host_buffer(num_blocks, spec.block_bytes)
        tier = FsspecSecondaryTierManager(spec, view, "fs", root=str(root), **config)
        opened.append(tier)
        return tier, view

    yield _open
    for tier in opened:
        tier.shutdown()


@pytest.fixture
def memroot():
    root = f"memory://tiering-test-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)

"""Fixtures of the fs tier tests; also makes fs_test_helpers importable (pytest runs with --import-mode=importlib)."""

import sys
import uuid
from pathlib import Path

import fsspec
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fs_test_helpers import make_spec

from tiering.core.primary import allocate_host_buffer
from tiering.fs import FsspecSecondaryTierManager


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

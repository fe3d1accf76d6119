"""An fs tier on an fsspec chained cache root (``filecache::``, ``simplecache::``): every load verified, none missed."""

import uuid

import pytest

from tiering.fs.io import open_backend
from tiering.fs.io.remote import FsspecBackend, SerializedFsspecBackend
from tiering.testing.harness import load_blocks, make_key, make_spec, store_blocks

BLOCKS = 64


def _root(tmp_path, cache, target):
    if target == "memory":
        return f"{cache}::memory://tiering-c33-{uuid.uuid4().hex}"
    return f"{cache}::file://{tmp_path}/blocks"


@pytest.mark.parametrize("cache", ["filecache", "simplecache"])
@pytest.mark.parametrize("target", ["file", "memory"])
def test_c33_restarts_on_a_chained_cache_root_load_every_block_with_eight_read_threads(
    open_tier, tmp_path, cache, target
):
    root = _root(tmp_path, cache, target)
    spec = make_spec(block_bytes=4096, num_blocks=BLOCKS)
    keys = [make_key(i, b"c33") for i in range(BLOCKS)]
    tier, view = open_tier(root, spec, BLOCKS, n_read_threads=8)
    assert store_blocks(tier, view, keys)
    tier.shutdown()
    for run in range(10):  # each a restart: the tier learns the blocks from its scan, then loads all at once
        tier, view = open_tier(root, spec, BLOCKS, n_read_threads=8)
        assert load_blocks(tier, view, keys), f"run {run}: {tier.stats()}"  # verified against each key's payload
        stats = tier.stats()
        assert not {k: v for k, v in stats.items() if k.startswith("load_failed") and v}, f"run {run}"
        tier.shutdown()


def test_c33_a_chained_cache_backend_makes_every_filesystem_call_under_the_filesystems_lock(tmp_path):
    backend, root = open_backend(f"filecache::file://{tmp_path}/root", {})
    assert isinstance(backend, SerializedFsspecBackend)
    again, _ = open_backend(f"filecache::file://{tmp_path}/root", {})
    assert again._lock is backend._lock  # one lock per filesystem instance, whoever opened it
    calls = []
    real = backend.fs

    class Watched:
        """Every filesystem method the back end calls: recorded with whether the lock was held."""

        def __getattr__(self, name):
            method = getattr(real, name)

            def call(*args, **kwargs):
                calls.append((name, backend._lock._is_owned()))
                return method(*args, **kwargs)

            return call

    backend.fs = Watched()
    backend.makedirs(root)
    backend.write_small_atomic(f"{root}/a.tmp", f"{root}/a", b"bytes")
    payload, trailer = bytearray(3), bytearray(2)
    assert backend.read_block(f"{root}/a", memoryview(payload), memoryview(trailer), 5) == 5
    assert bytes(payload + trailer) == b"bytes" and backend.read_small(f"{root}/a") == b"bytes"
    assert backend.size(f"{root}/a") == 5 and [f.name for f in backend.scan(root)] == ["a"]
    assert backend.remove(f"{root}/a")
    assert {name for name, _ in calls} >= {"makedirs", "open", "mv", "cat_file", "size", "find", "rm_file"}
    assert all(held for _, held in calls), calls


def test_c33_a_plain_fsspec_root_is_not_serialized():
    backend, _ = open_backend(f"memory://tiering-c33-{uuid.uuid4().hex}", {})
    assert type(backend) is FsspecBackend

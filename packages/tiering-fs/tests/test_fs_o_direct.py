"""O_DIRECT on the local fast path."""

import os
import shutil
import uuid
from pathlib import Path

import pytest

from tiering.core.base import block_view
from tiering.core.format import BlockFormatError
from tiering.fs import FsspecSecondaryTierManager
from tiering.fs.errors import DirectIONotUsableError
from tiering.fs.io.local import LocalBackend
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.testing import BB, load, loads_exact, make_spec, store, store_many
from tiering.testing import block_payload, make_key

pytestmark = pytest.mark.usefixtures("io_path")

# -- O_DIRECT ------------------------------------------------------------------------------


def _direct_or_skip(directory):
    reason = LocalBackend.probe_direct(str(directory))
    if reason is not None:
        pytest.skip(f"O_DIRECT not usable in {directory}: {reason}")


def _record_open_flags(monkeypatch):
    """Record the flags every block file (final or temporary) is opened with."""
    flags = []
    real = os.open

    def recording(path, flag, *args, **kwargs):
        if ".kvb" in os.fspath(path):
            flags.append(flag)
        return real(path, flag, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording)
    return flags


@pytest.mark.usefixtures("python_io")
def test_o_direct_is_used_on_a_local_disk_with_aligned_slots(tmp_path, open_tier, monkeypatch):
    _direct_or_skip(tmp_path)
    tier, view = open_tier(tmp_path)
    assert tier.o_direct is True and tier.o_direct_reason == "" and tier.stats()["o_direct"] == 1
    flags = _record_open_flags(monkeypatch)
    keys = [make_key(i, b"direct") for i in range(8)]
    assert store_many(tier, view, keys)
    assert loads_exact(tier, view, keys)
    assert len(flags) == 16 and all(f & os.O_DIRECT for f in flags)
    for key in keys:
        data = Path(tier.block_path(key)).read_bytes()
        assert data[:BB] == block_payload(key, BB) and data[BB : BB + 4] == b"TKVB"


def test_blocks_written_buffered_load_with_o_direct_and_back(tmp_path, open_tier):
    _direct_or_skip(tmp_path)
    buffered, view_b = open_tier(tmp_path, o_direct=False)
    assert buffered.o_direct is False and "o_direct: false" in buffered.o_direct_reason
    keys = [make_key(i, b"mixed") for i in range(6)]
    assert store_many(buffered, view_b, keys[:3])
    direct, view_d = open_tier(tmp_path, o_direct=True)
    assert direct.o_direct is True
    assert store_many(direct, view_d, keys[3:])
    assert loads_exact(direct, view_d, keys) and loads_exact(buffered, view_b, keys)


@pytest.mark.usefixtures("python_io")
def test_block_bytes_not_a_page_multiple_falls_back_to_buffered(tmp_path, open_tier, monkeypatch):
    bb = 3 * 4096 + 100
    spec = make_spec(block_bytes=bb)
    tier, view = open_tier(tmp_path, spec=spec)
    assert tier.o_direct is False and "not a multiple of 4096" in tier.o_direct_reason
    assert tier.stats()["o_direct"] == 0
    flags = _record_open_flags(monkeypatch)
    keys = [make_key(i, b"odd") for i in range(8)]
    assert store_many(tier, view, keys)
    assert loads_exact(tier, view, keys)
    assert flags and not any(f & getattr(os, "O_DIRECT", 0) for f in flags)
    (path,) = {Path(tier.block_path(keys[0]))}
    data = path.read_bytes()
    assert len(data) == bb + TRAILER_BYTES and data[:bb] == block_payload(keys[0], bb)
    with pytest.raises(DirectIONotUsableError, match=r"o_direct is true.*not a multiple of 4096"):
        open_tier(tmp_path / "strict", spec=spec, o_direct=True)


def test_unaligned_primary_buffer_falls_back_to_buffered(tmp_path):
    import mmap

    n = 4
    region = mmap.mmap(-1, n * BB + 512)
    flat = memoryview(region)[512 : 512 + n * BB]
    view = flat.cast("B", (n, BB))
    tier = FsspecSecondaryTierManager(make_spec(num_blocks=n), view, "fs", root=str(tmp_path))
    try:
        assert tier.o_direct is False and "aligned" in tier.o_direct_reason
        keys = [make_key(i, b"unaligned") for i in range(n)]
        assert store(tier, view, keys)
        assert loads_exact(tier, view, keys)
    finally:
        tier.shutdown()
        del flat, view
    with pytest.raises(DirectIONotUsableError):
        region2 = mmap.mmap(-1, n * BB + 512)
        v2 = memoryview(region2)[512 : 512 + n * BB].cast("B", (n, BB))
        FsspecSecondaryTierManager(make_spec(num_blocks=n), v2, "fs", root=str(tmp_path / "b"), o_direct=True)


def test_o_direct_true_on_tmpfs_raises_a_clear_error(open_tier):
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    root = Path(f"/dev/shm/tiering-odirect-{uuid.uuid4().hex}")
    try:
        root.mkdir()
        if LocalBackend.probe_direct(str(root)) is None:
            pytest.skip("O_DIRECT works on this tmpfs")
        with pytest.raises(DirectIONotUsableError) as info:
            open_tier(root, o_direct=True)
        assert str(root) in str(info.value) and "O_DIRECT" in str(info.value)
        tier, view = open_tier(root)  # "auto": buffered, same layout
        assert tier.o_direct is False and "probe failed" in tier.o_direct_reason
        keys = [make_key(i, b"shm-root") for i in range(4)]
        assert store(tier, view, keys) and loads_exact(tier, view, keys)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_round_trip_from_a_dev_shm_primary_buffer(tmp_path, monkeypatch):
    import mmap

    from tiering.core.primary import as_block_view

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    n, bb = 8, 256 * 1024
    shm = f"/dev/shm/tiering-test-{uuid.uuid4().hex}"
    fd = os.open(shm, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, n * bb)
        region = mmap.mmap(fd, n * bb)
    finally:
        os.close(fd)
        os.unlink(shm)
    view = as_block_view(memoryview(region), n, bb)
    tier = FsspecSecondaryTierManager(make_spec(block_bytes=bb, num_blocks=n), view, "fs", root=str(tmp_path))
    try:
        assert tier.o_direct is (LocalBackend.probe_direct(str(tmp_path)) is None)
        keys = [make_key(i, b"shm") for i in range(n)]
        assert store(tier, view, keys)
        for slot in range(n):
            block_view(view, slot)[:] = bytes(bb)
        assert load(tier, view, keys, list(range(n)))
        for slot, key in enumerate(keys):
            assert block_view(view, slot).tobytes() == block_payload(key, bb)
    finally:
        tier.shutdown()


def test_o_direct_read_of_a_truncated_file_is_short_not_an_error(tmp_path):
    import mmap

    from tiering.fs.io.posix import preadv_all as _preadv_all

    _direct_or_skip(tmp_path)
    path = tmp_path / "short"
    path.write_bytes(b"x" * (4096 + 100))
    payload, trailer = mmap.mmap(-1, 8192), mmap.mmap(-1, TRAILER_BYTES)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        assert _preadv_all(fd, [memoryview(payload), memoryview(trailer)], 0, direct=True) == 4096 + 100
    finally:
        os.close(fd)
    # Through the back end: a file shorter than it should be is a truncation, never EINVAL.
    backend = LocalBackend(direct=True)
    with pytest.raises(BlockFormatError, match="expected"):
        backend.read_block(str(path), memoryview(payload), memoryview(trailer), 8192 + TRAILER_BYTES)


def test_o_direct_config_values(tmp_path, memroot, open_tier):
    with pytest.raises(ValueError, match="o_direct"):
        open_tier(tmp_path, o_direct="yes")
    with pytest.raises(TypeError, match="o_direct"):
        open_tier(tmp_path, o_direct=1)
    tier, _ = open_tier(memroot)
    assert tier.o_direct is False and "not a local" in tier.o_direct_reason
    with pytest.raises(DirectIONotUsableError, match="not a local"):
        open_tier(memroot, o_direct=True)

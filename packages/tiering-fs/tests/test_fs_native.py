"""The native batch path (libblockio.so through ctypes) against the pure-Python path: same files, same refusals."""

import ctypes
import errno
import mmap
import os
import resource
import shutil
import signal
from pathlib import Path

import pytest
import xxhash

from tiering.core.base import block_view
from tiering.fs import FsspecSecondaryTierManager, native
from tiering.fs.blocks import BlockFiles
from tiering.fs.io.local import LocalBackend
from tiering.fs.layout import TRAILER_BYTES, temp_namer
from tiering.fs.testing import BB, CTX, load, make_spec, store, temp_files
from tiering.testing import block_payload, make_key

LIB, WHY_NOT = native._load()
needs_lib = pytest.mark.skipif(LIB is None, reason=f"native library not built: {WHY_NOT}")


def _compiler() -> str | None:
    return shutil.which((os.environ.get("CC") or "cc").split()[0])


def test_library_is_built_wherever_a_compiler_is():
    """An install (editable or wheel) with a working C compiler must carry the library: no silent fallback."""
    if _compiler() is None or os.environ.get("TIERING_FS_BUILD_NATIVE", "") == "0":
        pytest.skip("no C compiler here: the pure-Python path is expected")
    assert LIB is not None, WHY_NOT
    assert LIB.tkvb_abi_version() == native.ABI_VERSION


def test_status_follows_the_environment_variable(monkeypatch, tmp_path, open_tier):
    monkeypatch.setenv(native.ENV_VAR, "0")
    assert native.status() == "pure-Python block I/O (TIERING_FS_NATIVE=0)" and native.library() is None
    tier, _ = open_tier(tmp_path / "off")
    assert tier.stats()["native_io"] == 0 and tier.files.native is None and "TIERING_FS_NATIVE=0" in tier.block_io
    assert tier.pool.min_batch == 1  # per block in Python: an idle pool spreads a job one block per thread
    assert "pure-Python block I/O" in FsspecSecondaryTierManager.probe({"type": "fs", "root": str(tmp_path)})
    monkeypatch.delenv(native.ENV_VAR)
    tier, _ = open_tier(tmp_path / "on")
    assert tier.stats()["native_io"] == int(LIB is not None)
    assert tier.pool.min_batch == (native.NATIVE_MIN_SHARE if LIB is not None else 1)
    assert tier.block_io == native.status()


def test_missing_library_means_the_python_path(monkeypatch):
    monkeypatch.setattr(native, "LIBRARY_NAME", "libdoesnotexist.so")
    lib, reason = native._load.__wrapped__()
    assert lib is None and "libdoesnotexist.so not built" in reason


def test_memory_root_never_takes_the_native_path(memroot, open_tier):
    tier, view = open_tier(memroot)
    assert tier.files.native is None and "not a local filesystem" in tier.block_io
    assert store(tier, view, [make_key(1, b"mem")])


@needs_lib
@pytest.mark.parametrize("size", [0, 1, 16, 17, 128, 129, 240, 241, 1024, 4096, BB, 256 * 1024, 2 << 20])
def test_checksum_equals_python_xxhash(size):
    data = os.urandom(size)
    assert LIB.tkvb_xxh3_64(data, size) == xxhash.xxh3_64_intdigest(data)


@needs_lib
@pytest.mark.parametrize("writer", ["native", "python"])
def test_files_are_byte_identical_and_read_by_the_other_path(tmp_path, open_tier, monkeypatch, writer):
    keys = [make_key(i, b"x") for i in range(12)] + [b"k", bytes(64)]  # short and full-width keys too
    monkeypatch.setenv(native.ENV_VAR, "0" if writer == "python" else "1")
    w, view_w = open_tier(tmp_path / "w", num_blocks=16)
    assert (w.files.native is not None) == (writer == "native")
    assert store(w, view_w, keys)
    monkeypatch.setenv(native.ENV_VAR, "1" if writer == "python" else "0")
    r, view_r = open_tier(tmp_path / "w", num_blocks=16)
    assert (r.files.native is None) == (writer == "native")
    assert load(r, view_r, keys)
    for slot, key in enumerate(keys):
        assert block_view(view_r, slot).tobytes() == block_payload(key, BB)
    # The other path writes the very same bytes for the same key.
    other, view_o = open_tier(tmp_path / "o", num_blocks=16)
    assert store(other, view_o, keys)
    for key in keys:
        a = Path(w.block_path(key)).read_bytes()
        assert len(a) == BB + TRAILER_BYTES and a == Path(other.block_path(key)).read_bytes()


def _damage(tier, keys, how, tmp_path, open_tier):
    path = Path(tier.block_path(keys[0]))
    data = bytearray(path.read_bytes())
    if how == "payload_byte":
        data[BB // 2] ^= 0x01
    elif how == "header_byte":
        data[BB + 50] ^= 0x01
    elif how == "short":
        data = data[: BB + 100]
    elif how == "wrong_key":
        data = bytearray(Path(tier.block_path(keys[1])).read_bytes())
    elif how == "wrong_namespace":  # the same key stored by another model, under the same root
        alien, view = open_tier(tmp_path, spec=make_spec(model="alien"))
        assert alien.namespace_dir != tier.namespace_dir
        assert store(alien, view, [keys[0]])
        data = bytearray(Path(alien.block_path(keys[0])).read_bytes())
    path.write_bytes(bytes(data))


@needs_lib
@pytest.mark.parametrize(
    ("how", "cause"),
    [
        ("payload_byte", "checksum"),
        ("header_byte", "checksum"),
        ("short", "truncated"),
        ("wrong_key", "foreign"),
        ("wrong_namespace", "foreign"),
    ],
)
def test_native_loader_refuses_damaged_blocks(tmp_path, open_tier, how, cause):
    tier, view = open_tier(tmp_path)
    assert tier.files.native is not None
    keys = [make_key(i, b"bad") for i in range(3)]
    assert store(tier, view, keys)
    _damage(tier, keys, how, tmp_path, open_tier)
    for slot in range(8, 11):
        block_view(view, slot)[:] = bytes(BB)
    assert load(tier, view, keys, [8, 9, 10]) is False
    stats = tier.stats()
    assert stats[f"load_failed_{cause}"] == 1 and stats["load_failures"] == 1
    assert not os.path.exists(tier.block_path(keys[0]))  # a bad file is removed, as on the Python path
    assert tier.lookup(keys[0], CTX) is False
    assert load(tier, view, keys[1:], [9, 10])  # the intact ones are still served
    assert block_view(view, 9).tobytes() == block_payload(keys[1], BB)


@needs_lib
def test_native_path_never_follows_symlinks(tmp_path, open_tier):
    tier, view = open_tier(tmp_path / "root")
    k1, k2 = make_key(1, b"sym"), make_key(2, b"sym")
    outside = tmp_path / "outside"
    # A block-named symlink to a valid block file outside the root: refused, neither file removed.
    elsewhere, view_e = open_tier(outside)
    assert store(elsewhere, view_e, [k1])
    link = Path(tier.block_path(k1))
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(elsewhere.block_path(k1))
    assert load(tier, view, [k1], [5]) is False
    assert tier.stats()["load_failed_foreign"] == 1 and link.is_symlink() and os.path.exists(elsewhere.block_path(k1))
    # A shard directory replaced by a symlink to a directory outside the root: neither written nor read through.
    shard = Path(tier.block_path(k2)).parent
    if shard.exists():
        shutil.rmtree(shard)
    target = tmp_path / "target"
    target.mkdir()
    shard.symlink_to(target, target_is_directory=True)
    assert store(tier, view, [k2]) is False
    assert load(tier, view, [k2], [6]) is False
    assert list(target.iterdir()) == []


@needs_lib
def test_store_hitting_a_real_file_size_limit_fails_cleanly(tmp_path, open_tier):
    """A real EFBIG (RLIMIT_FSIZE below one block) inside the native call: no_space, nothing left behind."""
    tier, view = open_tier(tmp_path, n_write_threads=1, n_read_threads=1)
    keys = [make_key(i, b"efbig") for i in range(3)]
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (BB // 2, old_limit[1]))
    try:
        ok = store(tier, view, keys)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert ok is False
    stats = tier.stats()
    assert stats["store_failed_no_space"] == 3 and stats["blocks_stored"] == 0 and stats["used_bytes"] == 0
    assert temp_files(tmp_path) == [] and not any(os.path.exists(tier.block_path(k)) for k in keys)
    assert [tier.lookup(k, CTX) for k in keys] == [False] * 3
    assert store(tier, view, keys)  # and the tier works on


@needs_lib
@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")
@pytest.mark.parametrize("direction", ["store", "load"])
def test_o_direct_refused_at_run_time_is_redone_buffered(tmp_path, direction):
    """O_DIRECT from a misaligned buffer fails with EINVAL: the block is redone buffered, O_DIRECT given up."""
    if LocalBackend.probe_direct(str(tmp_path)) is not None:
        pytest.skip("O_DIRECT not usable here")
    ns = tmp_path / "ns"
    ns.mkdir()
    raw = mmap.mmap(-1, 2 * BB + 4096)
    base = ctypes.addressof(ctypes.c_char.from_buffer(raw)) + 1  # misaligned: O_DIRECT transfers are refused
    key = make_key(7, b"direct")
    payload = block_payload(key, BB)
    raw[1 : 1 + BB] = payload
    backend = LocalBackend(direct=direction == "store")
    files = BlockFiles(backend, str(ns), b"d" * 16, BB, fsync=False)
    files.native = native.NativeBlockIO(LIB, str(ns), b"d" * 16, base, 2, BB)
    slot = lambda i: memoryview(raw)[1 + i * BB : 1 + (i + 1) * BB]  # noqa: E731
    try:
        assert files.write_many([key], [0], slot) == [None]
        assert Path(files.path(key)).read_bytes()[:BB] == payload and temp_files(tmp_path) == []
        if direction == "load":
            backend.direct = True
            assert files.read_many([key], [1], slot) == [None]
            assert raw[1 + BB : 1 + 2 * BB] == payload
        if backend.direct:
            pytest.skip("this filesystem accepts misaligned O_DIRECT buffers")
        assert f"O_DIRECT {'write' if direction == 'store' else 'read'} failed at run time" in backend.direct_lost
    finally:
        files.close()


@needs_lib
def test_out_of_range_block_id_fails_that_block_only(tmp_path):
    ns = tmp_path / "ns"
    ns.mkdir()
    raw = mmap.mmap(-1, 2 * BB)
    io = native.NativeBlockIO(LIB, str(ns), b"d" * 16, ctypes.addressof(ctypes.c_char.from_buffer(raw)), 2, BB)
    try:
        codes, lost = io.store([b"a", b"b", b"c"], [0, 2, -1], temp_namer.prefix, direct=False, fsync=False)
        assert (codes, lost) == ([0, native.BAD_SLOT, native.BAD_SLOT], 0)
        codes, _ = io.load([b"a", b"zz"], [1, 1], direct=False)
        assert codes == [0, errno.ENOENT]
    finally:
        io.close()


@needs_lib
def test_native_store_with_fsync_publishes_every_block(tmp_path, open_tier):
    tier, view = open_tier(tmp_path, fsync=True)
    assert tier.files.native is not None
    keys = [make_key(i, b"fsync") for i in range(6)]
    assert store(tier, view, keys)
    assert load(tier, view, keys, list(range(8, 14)))
    assert all(block_view(view, 8 + i).tobytes() == block_payload(k, BB) for i, k in enumerate(keys))
    assert temp_files(tmp_path) == []

import errno
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import fsspec
import pytest

import tiering.fs.blocks as fs_blocks
from tiering.core import (
    JobMetadata,
    OffloadingSpec,
    ReqContext,
    SecondaryTierFactory,
    TieringManager,
    TieringOffloadingSpec,
)
from tiering.core.base import block_view
from tiering.core.factory import create_secondary_tier
from tiering.core.format import HEADER_SIZE, BlockFormatError, checksum
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import Namespace
from tiering.core.testing import block_payload, make_key, wait_for_jobs, wait_for_lookup
from tiering.core.toolkit.config import (
    InvalidTypeError,
    InvalidValueError,
    MissingKeyError,
    TierConfigError,
)
from tiering.fs import FsspecSecondaryTierManager
from tiering.fs.errors import DirectIONotUsableError, RootNotUsableError
from tiering.fs.io.local import LocalBackend
from tiering.fs.layout import HOST, TRAILER_BYTES

WORKER = Path(__file__).with_name("fs_worker.py")
BB = 16 * 1024
CTX = ReqContext("test")
_ids = itertools.count(1)


def make_spec(block_bytes=BB, num_blocks=16, **extra):
    return OffloadingSpec(
        {"cpu_bytes_to_use": num_blocks * block_bytes, "block_bytes": block_bytes, "model": "fs-test", **extra}
    )


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


def store(tier, view, keys, slots=None, timeout=30):
    slots = list(range(len(keys))) if slots is None else slots
    for key, slot in zip(keys, slots):
        block_view(view, slot)[:] = block_payload(key, tier.block_bytes)
    job = JobMetadata(next(_ids), list(keys), slots, False, CTX)
    tier.submit_store(job)
    return wait_for_jobs(tier, [job.job_id], timeout)[job.job_id]


def store_many(tier, view, keys):
    n = view.shape[0]
    return all(store(tier, view, keys[i : i + n]) for i in range(0, len(keys), n))


def load(tier, view, keys, slots=None):
    slots = list(range(len(keys))) if slots is None else slots
    job = JobMetadata(next(_ids), list(keys), slots, True, CTX)
    tier.submit_load(job)
    return wait_for_jobs(tier, [job.job_id])[job.job_id]


def loads_exact(tier, view, keys):
    """Load keys in batches of the primary size; True when every batch succeeds byte-exact."""
    n = view.shape[0]
    for i in range(0, len(keys), n):
        batch = keys[i : i + n]
        for slot in range(len(batch)):
            block_view(view, slot)[:] = bytes(tier.block_bytes)
        if not load(tier, view, batch):
            return False
        for slot, key in enumerate(batch):
            if block_view(view, slot).tobytes() != block_payload(key, tier.block_bytes):
                return False
    return True


def block_files(root):
    return sorted(p for p in Path(root).rglob("*.kvb"))


def temp_files(root):
    return sorted(p for p in Path(root).rglob("*.tmp.*"))


def run_worker(cfg, **popen):
    return subprocess.Popen([sys.executable, str(WORKER), json.dumps(cfg)], stdout=subprocess.PIPE, text=True, **popen)


# -- config and construction ----------------------------------------------------------


def test_entry_point_resolves_and_unknown_key_is_named(tmp_path):
    assert SecondaryTierFactory.get_class("fs") is FsspecSecondaryTierManager
    assert SecondaryTierFactory.provider("fs") == "tiering-fs 0.1.0"
    spec = make_spec()
    view = allocate_host_buffer(4, BB)
    with pytest.raises(TypeError, match="root_dir"):
        create_secondary_tier({"type": "fs", "root_dir": str(tmp_path)}, view, spec)
    tier = create_secondary_tier({"type": "fs", "root": str(tmp_path), "n_read_threads": 1}, view, spec)
    try:
        assert tier.tier_type == "fs" and isinstance(tier, FsspecSecondaryTierManager)
        assert tier.n_read_threads == 1 and tier.n_write_threads == 4 and tier.fsync is False
    finally:
        tier.shutdown()


@pytest.mark.parametrize(
    ("config", "exc", "match"),
    [
        ({"n_read_threads": 0}, InvalidValueError, "n_read_threads: must be an integer >= 1, got 0"),
        ({"n_write_threads": "4"}, InvalidTypeError, "n_write_threads"),
        ({"fsync": 1}, InvalidTypeError, "fsync"),
        ({"capacity_bytes": 100}, InvalidValueError, "capacity_bytes 100 is smaller than one stored block"),
        ({"capacity_bytes": 1.5e9}, InvalidTypeError, "capacity_bytes"),
        ({"lookup_fallback": "sometimes"}, InvalidValueError, "lookup_fallback"),
        ({"o_direct": "yes"}, InvalidValueError, "o_direct"),
        ({"o_direct": 1}, InvalidTypeError, "o_direct"),
        ({"stale_temp_s": -1}, InvalidValueError, "stale_temp_s"),
        ({"startup_scan_wait_s": "2"}, InvalidTypeError, "startup_scan_wait_s"),
        ({"startup_scan_wait_s": -1}, InvalidValueError, "startup_scan_wait_s"),
        ({"storage_options": "x"}, InvalidTypeError, "storage_options"),
        ({"root": ""}, InvalidValueError, "root: must be a non-empty string"),
        ({"root": None}, MissingKeyError, "root: required"),
        ({"root": "nosuchproto://x"}, ValueError, "nosuchproto"),
    ],
)
def test_bad_config_values_are_named(tmp_path, config, exc, match):
    kwargs = {"root": str(tmp_path), **config}
    with pytest.raises(exc, match=match) as info:
        FsspecSecondaryTierManager(make_spec(), allocate_host_buffer(2, BB), "fs", **kwargs)
    if isinstance(info.value, TierConfigError):
        # The factory labels it with the entry: secondary_tiers[N].<key>.
        assert info.value.with_entry("secondary_tiers[0]").args[0].startswith(f"secondary_tiers[0].{info.value.key}:")


def test_schema_declares_every_constructor_key():
    import inspect

    params = set(inspect.signature(FsspecSecondaryTierManager).parameters) - {
        "offloading_spec",
        "primary_kv_view",
        "tier_type",
    }
    assert set(FsspecSecondaryTierManager.config_schema.keys) == params
    assert FsspecSecondaryTierManager.config_schema.secret_keys == {"storage_options"}
    with pytest.raises(MissingKeyError, match=r"secondary_tiers\[0\]\.root: required"):
        FsspecSecondaryTierManager.config_schema.validate({"type": "fs"}, entry="secondary_tiers[0]")


def test_root_that_cannot_be_created_names_path_and_reason(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(RootNotUsableError) as info:
        FsspecSecondaryTierManager(make_spec(), allocate_host_buffer(2, BB), "fs", root=str(blocker / "kv"))
    message = str(info.value)
    assert str(blocker / "kv") in message and "cannot create directory" in message


def test_read_only_root_fails_at_construction(tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(RootNotUsableError, match="not writable: Read-only file system") as info:
        FsspecSecondaryTierManager(make_spec(), allocate_host_buffer(2, BB), "fs", root=str(tmp_path))
    assert str(tmp_path) in str(info.value)
    assert info.value.errno == errno.EROFS


def test_namespace_json_lists_every_field_and_layout_is_sharded(tmp_path, open_tier):
    tier, view = open_tier(tmp_path)
    key = make_key(1, b"layout")
    assert store(tier, view, [key])
    ns = tier.namespace
    ns_file = tmp_path / ns.digest / "namespace.json"
    assert json.loads(ns_file.read_text()) == dict(ns.to_dict(), digest=ns.digest)
    for field in (
        "model",
        "revision",
        "kv_dtype",
        "kv_layout",
        "block_size",
        "block_bytes",
        "rank",
        "world_size",
        "format_version",
    ):
        assert f'"{field}"' in ns_file.read_text()
    (path,) = block_files(tmp_path)
    rel = path.relative_to(tmp_path).as_posix()
    assert rel == f"{ns.digest}/{checksum(key) & 0xFF:02x}/{key.hex()}.kvb", rel
    data = path.read_bytes()
    assert len(data) == BB + TRAILER_BYTES and data[BB : BB + 4] == b"TKVB"
    assert data[:BB] == block_payload(key, BB)
    assert data[BB + HEADER_SIZE :] == bytes(TRAILER_BYTES - HEADER_SIZE)
    assert temp_files(tmp_path) == []


def test_file_url_root_uses_the_local_fast_path(tmp_path, open_tier):
    tier, view = open_tier(f"file://{tmp_path}")
    assert isinstance(tier.backend, LocalBackend) and tier.lookup_fallback == "stat"
    assert store(tier, view, [make_key(0)])
    assert len(block_files(tmp_path)) == 1


def test_stats_has_every_counter(tmp_path, open_tier):
    tier, view = open_tier(tmp_path, capacity_bytes=10 * (BB + TRAILER_BYTES))
    assert store(tier, view, [make_key(i) for i in range(3)])
    assert load(tier, view, [make_key(0)], [5])
    assert tier.lookup(make_key(0), CTX) is True and tier.lookup(make_key(99), CTX) is False
    s = tier.stats()
    expected = {
        "lookups_hit": 1,
        "lookups_miss": 1,
        "blocks_stored": 3,
        "bytes_stored": 3 * BB,
        "blocks_loaded": 1,
        "bytes_loaded": BB,
        "resident_blocks": 3,
        "resident_bytes": 3 * (BB + TRAILER_BYTES),
        "capacity_bytes": 10 * (BB + TRAILER_BYTES),
        "in_flight_jobs": 0,
        "load_failed_checksum": 0,
        "load_failed_truncated": 0,
        "load_failed_foreign": 0,
        "load_failed_io_error": 0,
        "store_failed_no_space": 0,
        "store_failed_io_error": 0,
    }
    assert {k: s[k] for k in expected} == expected
    assert s["evictions"] == 0 and s["lookups_pending"] == 0


# -- restart, capacity -------------------------------------------------------------------


def test_C04_restart_in_new_process_reuses_every_block(tmp_path, open_tier, caplog):
    bb = 256 * 1024
    worker = run_worker({"root": str(tmp_path), "block_bytes": bb, "n": 100, "salt": "c04"})
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0 and "stored" in out
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in block_files(tmp_path)}
    assert len(before) == 100
    with caplog.at_level(logging.INFO, logger="tiering.fs.tier"):
        tier, view = open_tier(tmp_path, spec=make_spec(block_bytes=bb))
        assert tier.wait_for_scan(10)
    assert re.search(r"startup scan of .* took [0-9.]+ s: 100 blocks", caplog.text)
    s = tier.stats()
    assert (s["resident_blocks"], s["resident_bytes"]) == (100, 100 * (bb + TRAILER_BYTES))
    keys = [make_key(i, b"c04") for i in range(100)]
    assert all(tier.lookup(k, CTX) is True for k in keys)
    assert store_many(tier, view, keys)
    assert tier.stats()["blocks_stored"] == 0 and tier.stats()["stores_already_present"] == 100
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in block_files(tmp_path)} == before
    assert loads_exact(tier, view, keys)


def test_cap_holds_across_restart(tmp_path, open_tier):
    stored = BB + TRAILER_BYTES
    tier, view = open_tier(tmp_path, capacity_bytes=10 * stored)
    keys = [make_key(i, b"cap") for i in range(15)]
    for key in keys:  # one at a time: a defined recency order
        assert store(tier, view, [key])
    assert tier.stats()["evictions"] == 5 and len(block_files(tmp_path)) == 10
    assert [tier.lookup(k, CTX) for k in keys] == [False] * 5 + [True] * 10
    tier.shutdown()

    tier2, view2 = open_tier(tmp_path, capacity_bytes=10 * stored)
    assert tier2.wait_for_scan(10)
    assert tier2.stats()["resident_bytes"] == 10 * stored
    more = [make_key(i, b"cap-more") for i in range(3)]
    assert store(tier2, view2, more)
    assert len(block_files(tmp_path)) == 10 and tier2.stats()["evictions"] == 3
    tier2.shutdown()

    # A smaller cap at restart evicts at once, oldest files first (mtime order after a restart).
    tier3, _ = open_tier(tmp_path, capacity_bytes=4 * stored)
    assert tier3.wait_for_scan(10)
    assert tier3.stats()["resident_blocks"] == 4 and len(block_files(tmp_path)) == 4
    assert all(tier3.lookup(k, CTX) for k in more)


@pytest.mark.parametrize("where", ["file", "memory"])
def test_C05_cap_of_20_blocks_never_refuses_500_stores(tmp_path, memroot, open_tier, where):
    bb = 4096
    root = str(tmp_path) if where == "file" else memroot
    tier, view = open_tier(root, spec=make_spec(block_bytes=bb), capacity_bytes=20 * (bb + TRAILER_BYTES))
    keys = [make_key(i, b"c05") for i in range(500)]
    assert store_many(tier, view, keys)
    s = tier.stats()
    assert (s["blocks_stored"], s["evictions"], s["resident_blocks"]) == (500, 480, 20)
    if where == "file":
        assert len(block_files(root)) == 20
    else:
        files = [p for p in fsspec.filesystem("memory").find(root) if p.endswith(".kvb")]
        assert len(files) == 20
    assert all(tier.lookup(k, CTX) for k in keys[-20:])
    assert loads_exact(tier, view, keys[-16:])


def test_cap_is_enforced_per_directory_by_rescans(tmp_path, open_tier):
    stored = BB + TRAILER_BYTES
    config = {"capacity_bytes": 10 * stored, "rescan_interval_s": 0.1}
    a, view_a = open_tier(tmp_path, **config)
    b, view_b = open_tier(tmp_path, **config)
    assert store(a, view_a, [make_key(i, b"proc-a") for i in range(10)])
    assert store(b, view_b, [make_key(i, b"proc-b") for i in range(10)])
    deadline = time.monotonic() + 10
    while len(block_files(tmp_path)) > 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(block_files(tmp_path)) <= 10
    assert a.stats()["scans"] >= 2


# -- verification on load ------------------------------------------------------------------


def _count_reads(monkeypatch, tier):
    counts = {}
    real = tier.backend.read_block

    def counting(path, payload, trailer, expected):
        counts[path] = counts.get(path, 0) + 1
        return real(path, payload, trailer, expected)

    monkeypatch.setattr(tier.backend, "read_block", counting)
    return counts


def test_C06_truncated_file_is_a_miss_once(tmp_path, open_tier, monkeypatch):
    bb = 256 * 1024
    tier, view = open_tier(tmp_path, spec=make_spec(block_bytes=bb), n_read_threads=2, n_write_threads=1)
    keys = [make_key(i, b"c06") for i in range(8)]
    assert store(tier, view, keys)
    assert [tier.lookup(k, CTX) for k in keys] == [True] * 8
    k4 = tier.block_path(keys[3])
    os.truncate(k4, 100)
    reads = _count_reads(monkeypatch, tier)
    for slot in range(8, 16):
        block_view(view, slot)[:] = bytes(bb)
    assert load(tier, view, keys, list(range(8, 16))) is False
    for i in range(3):  # K1..K3 were read and verified into their slots
        assert block_view(view, 8 + i).tobytes() == block_payload(keys[i], bb)
    assert reads[k4] == 1 and max(reads.values()) == 1
    assert not os.path.exists(k4)
    assert tier.lookup(keys[3], CTX) is False
    s = tier.stats()
    assert (s["load_failed_truncated"], s["bad_blocks_removed"], s["load_jobs_failed"]) == (1, 1, 1)
    # The intact blocks stay: a job without K4 succeeds.
    assert load(tier, view, keys[4:], list(range(8, 12)))
    assert block_view(view, 8).tobytes() == block_payload(keys[4], bb)


def _manager_store(manager, keys, bb, deadline):
    ctx = ReqContext("store")
    alloc = manager.prepare_store(keys, ctx)
    for key, slot in zip(alloc.keys, alloc.block_ids):
        block_view(manager.primary.kv_view, slot)[:] = block_payload(key, bb)
    manager.complete_store(alloc.keys, ctx)
    while manager.has_pending_work() and time.monotonic() < deadline:
        manager.get_finished()
        time.sleep(0.005)


def test_C06_through_the_manager_k1_to_k3_load_k4_on_are_misses(tmp_path):
    bb = 256 * 1024
    spec = TieringOffloadingSpec(
        {
            "cpu_bytes_to_use": 8 * bb,
            "block_bytes": bb,
            "secondary_tiers": [{"type": "fs", "root": str(tmp_path), "n_read_threads": 4}],
        }
    )
    manager = spec.get_manager()
    tier = manager.secondary_tiers[0]
    keys = [make_key(i, b"c06m") for i in range(8)]
    deadline = time.monotonic() + 30
    try:
        _manager_store(manager, keys, bb, deadline)
        _manager_store(manager, [make_key(i, b"c06-other") for i in range(8)], bb, deadline)
        assert not any(manager.primary.lookup(k) for k in keys)  # evicted: loads come from fs
        ctx = ReqContext("load")
        assert manager.lookup(keys, ctx) == 8
        os.truncate(tier.block_path(keys[3]), 100)
        manager.prepare_load(keys, ctx)
        results = []
        while not results and time.monotonic() < deadline:
            results = manager.get_finished()
            time.sleep(0.005)
        (result,) = results
        assert result.keys == keys[:3]
        for key, slot in zip(result.keys, result.block_ids):
            assert block_view(manager.primary.kv_view, slot).tobytes() == block_payload(key, bb)
        manager.complete_load(ctx)
        assert tier.lookup(keys[3], ctx) is False
        assert manager.lookup(keys, ctx) == 3  # K4 is now a miss for this request: no second read
        assert tier.stats()["load_failed_truncated"] == 1
    finally:
        manager.shutdown()


@pytest.mark.parametrize(
    ("damage", "cause"),
    [
        ("payload_bit_flip", "checksum"),
        ("header_bit_flip", "checksum"),
        ("zero_length", "truncated"),
        ("extra_bytes", "truncated"),
        ("other_key", "foreign"),
    ],
)
def test_damaged_file_is_a_removed_miss(tmp_path, open_tier, damage, cause):
    tier, view = open_tier(tmp_path)
    key, other = make_key(1, b"damage"), make_key(2, b"damage")
    assert store(tier, view, [key, other])
    path = Path(tier.block_path(key))
    data = bytearray(path.read_bytes())
    if damage == "payload_bit_flip":
        data[1000] ^= 0x10
    elif damage == "header_bit_flip":
        data[BB + 30] ^= 0x01
    elif damage == "zero_length":
        data = bytearray()
    elif damage == "extra_bytes":
        data += b"\0"
    else:
        data = bytearray(Path(tier.block_path(other)).read_bytes())
    path.write_bytes(bytes(data))
    block_view(view, 9)[:] = bytes(BB)
    assert load(tier, view, [key], [9]) is False
    s = tier.stats()
    assert s[f"load_failed_{cause}"] == 1 and s["bad_blocks_removed"] == 1
    assert not path.exists()
    assert tier.lookup(key, CTX) is False
    # A second attempt is a plain miss, not another verification failure.
    assert load(tier, view, [key], [9]) is False
    assert tier.stats()[f"load_failed_{cause}"] == 1 and tier.stats()["load_failed_missing"] == 1
    assert load(tier, view, [other], [9]) and block_view(view, 9).tobytes() == block_payload(other, BB)


def test_C01_namespace_changes_are_misses(tmp_path, open_tier):
    base = {"model": "m", "model_revision": "r1", "kv_dtype": "bfloat16", "block_size": 16}
    bb = 64 * 1024
    keys = [make_key(i, b"c01") for i in range(20)]
    tier, view = open_tier(tmp_path, spec=make_spec(block_bytes=bb, num_blocks=20, **base), num_blocks=20)
    assert store(tier, view, keys)
    src_file = tier.block_path(keys[0])
    tier.shutdown()
    variants = [
        (dict(base, model_revision="r2"), bb),
        (dict(base, kv_layout="layer-major/kv-hnd"), bb),
        (dict(base, kv_dtype="float8_e4m3fn"), 32 * 1024),
    ]
    digests = {tier.namespace.digest}
    for extra, vbb in variants:
        t, v = open_tier(tmp_path, spec=make_spec(block_bytes=vbb, num_blocks=4, **extra), num_blocks=4)
        assert t.wait_for_scan(10) and t.stats()["resident_blocks"] == 0
        assert [t.lookup(k, CTX) for k in keys] == [False] * 20
        assert load(t, v, keys[:4]) is False
        digests.add(t.namespace.digest)
        if vbb != bb:
            # A block of the wrong length placed where this namespace looks: never returned.
            os.makedirs(os.path.dirname(t.block_path(keys[0])), exist_ok=True)
            shutil.copyfile(src_file, t.block_path(keys[0]))
            assert t.lookup(keys[0], CTX) is False
            assert load(t, v, keys[:1]) is False
            assert t.stats()["load_failed_truncated"] == 1
            assert not os.path.exists(t.block_path(keys[0]))
    assert len(digests) == 4
    for digest in digests:
        fields = json.loads((tmp_path / digest / "namespace.json").read_text())
        assert set(fields) == set(Namespace.__dataclass_fields__) | {"digest"} and fields["digest"] == digest
        assert fields["model"] == "m" and fields["block_size"] == 16


def test_same_length_block_of_another_namespace_is_foreign(tmp_path, open_tier):
    key = make_key(7, b"ns")
    t1, v1 = open_tier(tmp_path, spec=make_spec(model_revision="r1"))
    assert store(t1, v1, [key])
    t2, v2 = open_tier(tmp_path, spec=make_spec(model_revision="r2"))
    os.makedirs(os.path.dirname(t2.block_path(key)), exist_ok=True)
    # Publish the copy atomically, as a writer would: the start-up scan may be
    # running and removes final files of the wrong size (a half-copied one).
    shutil.copyfile(t1.block_path(key), t2.block_path(key) + ".copy")
    os.replace(t2.block_path(key) + ".copy", t2.block_path(key))
    assert t2.lookup(key, CTX) is True  # right size: only the header can tell
    assert load(t2, v2, [key]) is False
    assert t2.stats()["load_failed_foreign"] == 1
    assert t2.lookup(key, CTX) is False and not os.path.exists(t2.block_path(key))
    assert t1.lookup(key, CTX) is True and load(t1, v1, [key], [3])


# -- atomic publish, concurrency, crashes ---------------------------------------------------


def test_C02_throttled_write_is_never_served_partially(tmp_path, open_tier, monkeypatch):
    bb = 8 * 1024 * 1024
    tier, view = open_tier(tmp_path, spec=make_spec(block_bytes=bb, num_blocks=2), num_blocks=2)
    key = make_key(0, b"c02")
    final = tier.block_path(key)
    real = os.pwritev

    def throttled(fd, bufs, offset):  # at most 1 MiB per call, 20 MiB/s
        time.sleep(0.05)
        first = memoryview(bufs[0])[: 1024 * 1024]
        return real(fd, [first], offset)

    monkeypatch.setattr(os, "pwritev", throttled)
    block_view(view, 0)[:] = block_payload(key, bb)
    sentinel = b"\xab" * bb
    block_view(view, 1)[:] = sentinel
    job = JobMetadata(next(_ids), [key], [0], False, CTX)
    tier.submit_store(job)
    verdicts, partial_seen, load_result = set(), False, None
    results = {}
    while job.job_id not in results:
        for r in tier.get_finished():
            results[r.job_id] = r.success
        if job.job_id in results:
            break
        verdicts.add(tier.lookup(key, CTX))
        temps = temp_files(tmp_path)
        if temps and not os.path.exists(final):
            partial_seen = partial_seen or any(0 < p.stat().st_size < bb + TRAILER_BYTES for p in temps)
        if load_result is None and partial_seen:
            load_job = JobMetadata(next(_ids), [key], [1], True, CTX)
            tier.submit_load(load_job)
            load_result = load_job.job_id
        time.sleep(0.01)
    assert results[job.job_id] is True
    assert verdicts == {None}
    assert partial_seen
    assert load_result is not None
    if load_result not in results:
        results.update(wait_for_jobs(tier, [load_result]))
    assert results[load_result] is False
    assert block_view(view, 1).tobytes() == sentinel  # no partial bytes delivered
    assert tier.lookup(key, CTX) is True and os.path.getsize(final) == bb + TRAILER_BYTES
    monkeypatch.undo()
    assert load(tier, view, [key], [1]) and block_view(view, 1).tobytes() == block_payload(key, bb)


def test_C07_eight_processes_open_the_same_new_root_at_once(tmp_path, open_tier):
    root = tmp_path / "new" / "root"
    go = tmp_path / "go"
    salts = ["shared", "shared"] + [f"p{i}" for i in range(2, 8)]
    procs = [
        run_worker(
            {
                "root": str(root),
                "block_bytes": BB,
                "n": 50,
                "salt": s,
                "go_file": str(go),
                "tier": {"n_write_threads": 2, "n_read_threads": 1},
            }
        )
        for s in salts
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    go.touch()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, outs
    assert temp_files(root) == []
    tier, view = open_tier(root)
    keys = [make_key(i, s.encode()) for s in sorted(set(salts)) for i in range(50)]
    assert len(block_files(root)) == len(keys) == 350
    assert all(tier.lookup(k, CTX) for k in keys)
    assert loads_exact(tier, view, keys)


def test_kill_9_mid_store_leaves_nothing_servable(tmp_path, open_tier):
    worker = run_worker({"root": str(tmp_path), "block_bytes": BB, "n": 5, "salt": "k9", "hang": True})
    lines = [worker.stdout.readline().strip() for _ in range(3)]
    assert lines == ["ready", "stored", "hanging"]
    temps = temp_files(tmp_path)
    assert len(temps) == 1 and temps[0].stat().st_size == 4096
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)  # reaped: the pid is gone, so its temporaries are removed at once
    tier, view = open_tier(tmp_path)
    assert tier.wait_for_scan(10)
    assert temp_files(tmp_path) == [] and tier.stats()["temps_removed"] == 1
    hung = make_key(0, b"hang")
    assert tier.lookup(hung, CTX) is False
    assert load(tier, view, [hung]) is False
    assert loads_exact(tier, view, [make_key(i, b"k9") for i in range(5)])


def test_stale_temporaries_are_removed_only_when_safe(tmp_path, open_tier):
    tier, _ = open_tier(tmp_path)
    shard = Path(tier.namespace_dir) / "ab" / "cd"
    shard.mkdir(parents=True)
    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    host = HOST
    names = {
        "dead_owner": f"aa.kvb.tmp.{host}.{dead_pid.pid}.1f",
        "live_owner": f"bb.kvb.tmp.{host}.{os.getppid()}.2f",
        "other_host_young": "cc.kvb.tmp.elsewhere.1.3f",
        "other_host_old": "dd.kvb.tmp.elsewhere.1.4f",
    }
    for name in names.values():
        (shard / name).write_bytes(b"x" * 10)
    old = time.time() - 3600
    os.utime(shard / names["other_host_old"], (old, old))
    tier.shutdown()
    tier2, _ = open_tier(tmp_path, stale_temp_s=600)
    assert tier2.wait_for_scan(10)
    left = {p.name for p in shard.iterdir()}
    assert left == {names["live_owner"], names["other_host_young"]}
    assert tier2.stats()["temps_removed"] == 2


# -- lookups -----------------------------------------------------------------------------------


def test_local_lookup_finds_blocks_of_another_process_at_once(tmp_path, open_tier):
    a, view_a = open_tier(tmp_path)
    b, view_b = open_tier(tmp_path)
    key = make_key(3, b"shared-root")
    assert store(a, view_a, [key])
    assert b.lookup(key, CTX) is True
    assert load(b, view_b, [key], [4]) and block_view(view_b, 4).tobytes() == block_payload(key, BB)


def test_memory_lookup_probes_asynchronously(memroot, open_tier):
    a, view_a = open_tier(memroot)
    b, _ = open_tier(memroot)
    assert b.lookup_fallback == "async"
    key, absent = make_key(1, b"probe"), make_key(2, b"probe")
    assert store(a, view_a, [key])
    assert b.lookup(key, CTX) is None
    assert wait_for_lookup(b, key, CTX) is True
    assert b.lookup(absent, CTX) is None
    assert wait_for_lookup(b, absent, CTX) is False
    assert b.stats()["lookups_pending"] >= 2


def test_lookup_fallback_off_answers_from_the_index_only(tmp_path, open_tier):
    a, view_a = open_tier(tmp_path)
    key = make_key(1, b"off")
    assert store(a, view_a, [key])
    b, _ = open_tier(tmp_path, lookup_fallback="off")
    assert b.wait_for_scan(10)
    assert b.lookup(key, CTX) is True  # found by the start-up scan
    later = make_key(2, b"off")
    assert store(a, view_a, [later])
    assert b.lookup(later, CTX) is False


def test_construction_waits_for_the_startup_scan(tmp_path, open_tier):
    a, view_a = open_tier(tmp_path)
    keys = [make_key(i, b"restart") for i in range(12)]
    assert store(a, view_a, keys)
    b, _ = open_tier(tmp_path, lookup_fallback="off")  # index only: a hit proves the scan is done
    assert b.stats()["scan_done"] == 1
    assert [b.lookup(k, CTX) for k in keys] == [True] * 12


def test_slow_startup_scan_does_not_block_construction_or_lookups(tmp_path, open_tier, monkeypatch):
    a, view_a = open_tier(tmp_path)
    key = make_key(1, b"slow-scan")
    assert store(a, view_a, [key])
    release = threading.Event()
    real_scan = LocalBackend.scan

    def slow_scan(self, directory):
        release.wait(10)
        yield from real_scan(self, directory)

    monkeypatch.setattr(LocalBackend, "scan", slow_scan)
    started = time.monotonic()
    b, view_b = open_tier(tmp_path, startup_scan_wait_s=0.2)
    assert 0.2 <= time.monotonic() - started < 2.0  # waited 0.2 s for the scan, then went on
    assert b.stats()["scan_done"] == 0
    assert b.lookup(key, CTX) is True
    assert load(b, view_b, [key], [2])
    release.set()
    assert b.wait_for_scan(10) and b.stats()["resident_blocks"] == 1


# -- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("err", "cause"), [(errno.ENOSPC, "no_space"), (errno.EIO, "io_error"), (errno.EACCES, "permission")]
)
def test_injected_write_errors_fail_the_job_and_remove_the_temp(tmp_path, open_tier, monkeypatch, err, cause):
    tier, view = open_tier(tmp_path)
    keys = [make_key(i, b"enospc") for i in range(3)]

    def failing(fd, bufs, offset):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "pwritev", failing)
    assert store(tier, view, keys) is False
    s = tier.stats()
    assert s[f"store_failed_{cause}"] == 3 and s["store_jobs_failed"] == 1 and s["blocks_stored"] == 0
    assert temp_files(tmp_path) == [] and block_files(tmp_path) == []
    assert [tier.lookup(k, CTX) for k in keys] == [False] * 3
    monkeypatch.undo()
    assert store(tier, view, keys) and loads_exact(tier, view, keys)


def test_permission_denied_creating_the_temp_fails_cleanly(tmp_path, open_tier, monkeypatch):
    tier, view = open_tier(tmp_path)
    real_open = os.open

    def deny(path, flags, *args, **kwargs):
        if ".tmp." in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny)
    assert store(tier, view, [make_key(1)]) is False
    assert tier.stats()["store_failed_permission"] == 1


def test_injected_eio_on_read_fails_the_load_and_keeps_the_file(tmp_path, open_tier, monkeypatch):
    tier, view = open_tier(tmp_path)
    key = make_key(1, b"eio")
    assert store(tier, view, [key])

    def eio(fd, bufs, offset):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "preadv", eio)
    assert load(tier, view, [key], [5]) is False
    assert tier.stats()["load_failed_io_error"] == 1 and tier.stats()["bad_blocks_removed"] == 0
    assert os.path.exists(tier.block_path(key))  # an I/O error is not proof of a bad file
    monkeypatch.undo()
    assert load(tier, view, [key], [5]) and block_view(view, 5).tobytes() == block_payload(key, BB)


def test_vanished_file_is_a_failed_load(tmp_path, open_tier):
    tier, view = open_tier(tmp_path)
    key = make_key(1, b"vanish")
    assert store(tier, view, [key])
    os.unlink(tier.block_path(key))
    assert load(tier, view, [key], [5]) is False
    assert tier.stats()["load_failed_vanished"] == 1
    assert tier.lookup(key, CTX) is False


def test_unexpected_exception_fails_the_job_and_workers_survive(tmp_path, open_tier, monkeypatch):
    tier, view = open_tier(tmp_path, n_write_threads=1)

    def boom(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(fs_blocks, "encode_header", boom)
    assert store(tier, view, [make_key(1)]) is False
    assert tier.stats()["store_failed_internal"] == 1
    monkeypatch.undo()
    assert store(tier, view, [make_key(2)]) is True
    assert all(t.is_alive() for t in tier.pool._threads)


def test_fsync_option_syncs_file_and_directory(tmp_path, open_tier, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd) or real(fd))
    tier, view = open_tier(tmp_path / "a")
    calls.clear()
    assert store(tier, view, [make_key(1), make_key(2)])
    assert calls == []
    synced, sview = open_tier(tmp_path / "b", fsync=True)
    calls.clear()
    assert store(synced, sview, [make_key(1), make_key(2)])
    assert len(calls) == 4  # file + directory per block


def test_loads_are_served_while_stores_queue(tmp_path, open_tier, monkeypatch):
    tier, view = open_tier(tmp_path, n_read_threads=1, n_write_threads=1)
    ready = make_key(0, b"prefer")
    assert store(tier, view, [ready])
    real = os.pwritev

    def slow(fd, bufs, offset):
        time.sleep(0.02)
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "pwritev", slow)
    stores = []
    for i in range(15):
        job = JobMetadata(next(_ids), [make_key(i + 1, b"prefer")], [i], False, CTX)
        tier.submit_store(job)
        stores.append(job.job_id)
    load_job = JobMetadata(next(_ids), [ready], [15], True, CTX)
    tier.submit_load(load_job)
    order = []
    deadline = time.monotonic() + 30
    while len(order) < 16 and time.monotonic() < deadline:
        order += [r.job_id for r in tier.get_finished() if r.success]
        time.sleep(0.002)
    assert order.index(load_job.job_id) < 5


def test_a_worker_takes_a_share_of_a_long_queue_and_shutdown_skips_the_rest(tmp_path, open_tier, monkeypatch):
    tier, _ = open_tier(tmp_path, num_blocks=64, n_read_threads=1, n_write_threads=1)
    real = os.pwritev
    written = []

    def slow(fd, bufs, offset):
        time.sleep(0.05)
        written.append(fd)
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "pwritev", slow)
    keys = [make_key(i, b"share") for i in range(64)]
    job = JobMetadata(next(_ids), keys, list(range(64)), False, CTX)
    tier.submit_store(job)
    deadline = time.monotonic() + 10
    while not written and time.monotonic() < deadline:  # the writer has taken its tasks once one is written
        time.sleep(0.005)
    queued = tier.pool.pending()
    # The only writer took 16 blocks (its share, capped) at once (the idle reader helps one block at a
    # time, 50 ms each: taking one task at a time, the two could not have taken 16 by now).
    assert queued <= 64 - 16
    tier.shutdown()
    results = list(tier.get_finished())
    assert [(r.job_id, r.success) for r in results] == [(job.job_id, False)]  # reported once, failed
    assert 1 <= len(written) < 16  # blocks taken but not started when the tier stopped were skipped
    assert list(tier.get_finished()) == []


def test_idle_readers_help_with_stores(tmp_path, open_tier, monkeypatch):
    tier, view = open_tier(tmp_path, num_blocks=40, n_read_threads=2, n_write_threads=1)
    real = os.pwritev
    threads = set()

    def slow(fd, bufs, offset):
        threads.add(threading.current_thread().name)
        time.sleep(0.02)
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "pwritev", slow)
    keys = [make_key(i, b"help") for i in range(40)]  # more than the writer's share (16 at most)
    assert store(tier, view, keys)
    assert {n.rsplit("-", 1)[0] for n in threads} == {"tiering-fs-read", "tiering-fs-write"}
    assert tier.stats()["blocks_stored"] == 40


def test_works_under_the_tiering_manager(tmp_path):
    from tiering.core.primary import CPUPrimaryTier, LRUCachePolicy

    spec = make_spec()
    primary = CPUPrimaryTier(4, BB, LRUCachePolicy(4))
    tier = FsspecSecondaryTierManager(spec, primary.kv_view, "fs", root=str(tmp_path))
    manager = TieringManager(primary, [tier])
    try:
        keys = [make_key(i, b"mgr") for i in range(8)]
        for key in keys:
            alloc = manager.prepare_store([key], CTX)
            for k, slot in zip([key], alloc.block_ids):
                block_view(primary.kv_view, slot)[:] = block_payload(k, BB)
            manager.complete_store([key], CTX)
            deadline = time.monotonic() + 10
            while manager.has_pending_work() and time.monotonic() < deadline:
                manager.get_finished()
                time.sleep(0.002)
        assert len(block_files(tmp_path)) == 8
        assert manager.lookup(keys[:2], CTX) == 2
    finally:
        manager.shutdown()


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

    from tiering.fs.io.local import _preadv_all

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

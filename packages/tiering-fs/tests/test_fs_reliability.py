"""Fault kinds of issue 13 on the fs tier: each case a test named after its id; faults by monkeypatching os."""

import errno
import itertools
import logging
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tiering.core import JobMetadata, OffloadingSpec, ReqContext
from tiering.core.base import block_view
from tiering.core.events import BlockRemoved, BlockStored, TierCleared
from tiering.core.primary import allocate_host_buffer
from tiering.fs import FsspecSecondaryTierManager, RootNotUsableError
from tiering.fs.inspection import FsInspector
from tiering.fs.layout import HOST, TRAILER_BYTES, shard_of, temp_namer
from tiering.testing import block_payload, make_key, wait_for_jobs

pytestmark = pytest.mark.usefixtures("io_path")

BB = 16 * 1024
STORED = BB + TRAILER_BYTES
CTX = ReqContext("reliability")
_ids = itertools.count(1)


def make_spec(**extra):
    return OffloadingSpec({"cpu_bytes_to_use": 16 * BB, "block_bytes": BB, "model": "fs-reliability", **extra})


@pytest.fixture
def open_tier():
    opened = []

    def _open(root, **config):
        view = allocate_host_buffer(16, BB)
        tier = FsspecSecondaryTierManager(make_spec(), view, "fs", root=str(root), **config)
        opened.append(tier)
        return tier, view

    yield _open
    for tier in opened:
        tier.shutdown()


def submit_store(tier, view, keys, slots=None):
    slots = list(range(len(keys))) if slots is None else slots
    for key, slot in zip(keys, slots):
        block_view(view, slot)[:] = block_payload(key, BB)
    job = JobMetadata(next(_ids), list(keys), slots, False, CTX)
    tier.submit_store(job)
    return job.job_id


def store(tier, view, keys, slots=None):
    job_id = submit_store(tier, view, keys, slots)
    return wait_for_jobs(tier, [job_id])[job_id]


def load(tier, view, keys, slots):
    job = JobMetadata(next(_ids), list(keys), slots, True, CTX)
    tier.submit_load(job)
    return wait_for_jobs(tier, [job.job_id])[job.job_id]


def disk_bytes(tier):
    return sum(p.stat().st_size for p in Path(tier.namespace_dir).rglob("*.kvb"))


def rescan(tier):
    before = tier.stats()["scans"]
    tier._rescanner.wake()
    deadline = time.monotonic() + 10
    while tier.stats()["scans"] == before:
        assert time.monotonic() < deadline, "no rescan"
        time.sleep(0.01)


# -- kind 2 / C13: eviction, load and adoption agree ---------------------------------------------
@pytest.mark.usefixtures("python_io")
def test_C13_load_racing_an_eviction_never_reindexes_the_key(tmp_path, open_tier, monkeypatch):
    tier, view = open_tier(tmp_path, capacity_bytes=4 * STORED, n_read_threads=1, n_write_threads=1)
    keys = [make_key(i, b"c13") for i in range(4)]
    assert store(tier, view, keys)
    k0 = keys[0]
    reading, release = threading.Event(), threading.Event()
    real = os.preadv

    def slow_read(fd, bufs, offset):
        if not reading.is_set():
            reading.set()
            assert release.wait(10)
        return real(fd, bufs, offset)

    monkeypatch.setattr(os, "preadv", slow_read)
    job = JobMetadata(next(_ids), [k0], [8], True, CTX)
    tier.submit_load(job)
    assert reading.wait(10)  # K0's file is open, its read is stalled
    new = [make_key(i, b"c13-new") for i in range(4)]
    assert store(tier, view, new, [4, 5, 6, 7])  # evicts K0 (LRU) while it is read
    assert not os.path.exists(tier.block_path(k0))
    release.set()
    loaded = wait_for_jobs(tier, [job.job_id])[job.job_id]
    if loaded:  # the read kept its open file: the bytes must be K0's, verified
        assert block_view(view, 8).tobytes() == block_payload(k0, BB)
    assert tier.lookup(k0, CTX) is False
    s = tier.stats()
    assert s["resident_bytes"] == s["used_bytes"] == disk_bytes(tier) == 4 * STORED
    assert s["resident_blocks"] == 4 and all(tier.lookup(k, CTX) is True for k in new)


def test_C13_lookup_fallback_adoption_loses_to_an_eviction(tmp_path, open_tier, monkeypatch):
    """A lookup probe that saw the file before an eviction deleted it must not put the key back."""
    other, other_view = open_tier(tmp_path)
    key = make_key(0, b"adopt")
    assert store(other, other_view, [key])  # written by another instance: not in `tier`'s index
    tier, view = open_tier(tmp_path, capacity_bytes=4 * STORED, startup_scan_wait_s=0)
    assert tier.wait_for_scan(10)
    os.utime(tier.block_path(key), (1, 1))  # oldest block of the directory: the first to evict
    tier.index.remove(key, delete=False)  # as if it had never been indexed
    real_size = tier.files.size
    raced = []

    def size_then_evict(k):
        size = real_size(k)
        if k == key and not raced:
            raced.append(k)
            rescan(tier)  # the rescan indexes it ...
            assert store(tier, view, [make_key(i, b"fill") for i in range(4)])  # ... and it is evicted
            assert not os.path.exists(tier.block_path(key))
        return size

    monkeypatch.setattr(tier.files, "size", size_then_evict)
    assert tier.lookup(key, CTX) is False  # the probe saw the file, but the eviction came after its ticket
    assert raced == [key]
    assert tier.lookup(key, CTX) is False
    s = tier.stats()
    assert s["resident_blocks"] == 4 and s["resident_bytes"] == disk_bytes(tier) == 4 * STORED


# -- kind 3 / C16: failed deletes ----------------------------------------------------------------


def test_C16_failed_unlink_keeps_bytes_counted_and_is_retried(tmp_path, open_tier, monkeypatch):
    tier, view = open_tier(tmp_path, capacity_bytes=4 * STORED, rescan_interval_s=3600)
    real_unlink = os.unlink

    def failing_unlink(path, *args, **kwargs):
        if str(path).endswith(".kvb"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", failing_unlink)
    keys = [make_key(i, b"c16") for i in range(10)]
    outcomes = [store(tier, view, [key]) for key in keys]
    assert outcomes[:4] == [True] * 4 and not all(outcomes)  # beyond the cap, with no delete working: refused
    s = tier.stats()
    assert disk_bytes(tier) == 4 * STORED  # the failed deletes left every old file in place
    assert s["used_bytes"] >= disk_bytes(tier)  # never fewer bytes reported than the tier holds
    assert s["used_bytes"] <= tier.capacity_bytes and s["failed_deletes"] >= 1
    assert s["resident_bytes"] + s["pending_delete_bytes"] == s["used_bytes"]
    assert all(tier.lookup(k, CTX) is False for k in keys[:4] if k not in tier.index)
    undeleted = next(k for k in keys[:4] if tier.lookup(k, CTX) is False)
    assert store(tier, view, [undeleted]) is False  # its old copy is still being deleted: refused, not a hang
    monkeypatch.undo()  # deletes work again
    rescan(tier)  # one rescan retries them
    s = tier.stats()
    assert s["pending_delete_bytes"] == 0 and s["used_bytes"] == s["resident_bytes"] == disk_bytes(tier)
    assert disk_bytes(tier) <= tier.capacity_bytes
    assert store(tier, view, [make_key(99, b"c16")]) and disk_bytes(tier) <= tier.capacity_bytes


def test_C16_unremovable_bad_block_answers_false_and_stays_counted(tmp_path, open_tier, monkeypatch):
    tier, view = open_tier(tmp_path, capacity_bytes=8 * STORED, rescan_interval_s=3600)
    key = make_key(1, b"bad")
    assert store(tier, view, [key])
    path = tier.block_path(key)
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"\xff")  # payload bit flip
    real_unlink = os.unlink
    monkeypatch.setattr(os, "unlink", lambda p, *a, **k: (_ for _ in ()).throw(PermissionError(errno.EPERM, "no")))
    assert load(tier, view, [key], [3]) is False
    assert os.path.exists(path) and tier.lookup(key, CTX) is False
    s = tier.stats()
    assert (s["failed_deletes"], s["pending_delete_bytes"], s["used_bytes"]) == (1, STORED, STORED)
    monkeypatch.setattr(os, "unlink", real_unlink)
    rescan(tier)
    assert not os.path.exists(path) and tier.stats()["used_bytes"] == 0


def test_c21_the_cap_holds_on_disk_when_unlinks_start_failing(tmp_path, open_tier, monkeypatch):
    """Case C21 (a): unlink works at first, then fails; 8 threads keep storing under a 4-block cap.

    Rescans run every 20 ms and retry the failed deletes: while a retry is in flight its bytes are still
    on disk and must not be handed to a new store.
    """
    tier, view = open_tier(tmp_path, capacity_bytes=4 * STORED, rescan_interval_s=0.02, n_write_threads=8)
    real_unlink, unlinks = os.unlink, itertools.count()
    peak, watching = [0], threading.Event()

    def unlink_failing_after_two(path, *args, **kwargs):
        if str(path).endswith(".kvb") and next(unlinks) >= 2:
            time.sleep(0.002)  # a slow, failing file system
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_unlink(path, *args, **kwargs)

    def watch():
        while not watching.is_set():
            peak[0] = max(peak[0], disk_bytes(tier))

    monkeypatch.setattr(os, "unlink", unlink_failing_after_two)
    watcher = threading.Thread(target=watch)
    watcher.start()
    outcomes: dict[int, bool] = {}
    try:
        for batch in range(5):
            jobs = [submit_store(tier, view, [make_key(batch * 8 + i, b"c21")], [i]) for i in range(8)]
            outcomes.update(wait_for_jobs(tier, jobs))
    finally:
        watching.set()
        watcher.join()
    s = tier.stats()
    assert peak[0] <= tier.capacity_bytes  # at no instant more than the cap on disk
    assert not all(outcomes.values()) and s["store_failed_no_space"] >= 1  # refused as no space, counted
    assert disk_bytes(tier) <= s["used_bytes"] <= tier.capacity_bytes  # never fewer bytes counted than on disk
    monkeypatch.undo()  # unlinks work again: a rescan settles the failed deletes
    rescan(tier)
    rescan(tier)
    s = tier.stats()
    assert s["used_bytes"] == s["resident_bytes"] == disk_bytes(tier) <= tier.capacity_bytes
    assert (s["room_wait_bytes"], s["reserved_bytes"]) == (0, 0)


# -- kind 4: O_DIRECT refused at run time --------------------------------------------------------


@pytest.mark.usefixtures("python_io")
@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")
@pytest.mark.parametrize("direction", ["store", "load"])
def test_kind4_o_direct_einval_at_run_time_falls_back_without_losing_the_block(
    tmp_path, open_tier, monkeypatch, caplog, direction
):
    # One reader: with several, another read may open its file with O_DIRECT before the first refusal switched.
    tier, view = open_tier(tmp_path, n_read_threads=1)
    keys = [make_key(i, b"k4") for i in range(6)]
    if direction == "load":
        assert store(tier, view, keys)
    tier.backend.direct = True  # as if the start-up probe had found O_DIRECT usable
    real_open = os.open
    refused = []

    def no_direct(path, flags, *args, **kwargs):
        if flags & os.O_DIRECT:
            refused.append(path)
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_direct)
    caplog.set_level(logging.WARNING, logger="tiering.fs")
    if direction == "store":
        assert store(tier, view, keys)
    for slot in range(8, 14):
        block_view(view, slot)[:] = bytes(BB)
    assert load(tier, view, keys, list(range(8, 14)))
    assert [block_view(view, 8 + i).tobytes() for i in range(6)] == [block_payload(k, BB) for k in keys]
    assert len(refused) == 1  # the first refusal switched the tier to buffered I/O for good
    assert tier.o_direct is False and "failed at run time" in tier.o_direct_reason
    assert tier.stats()["o_direct"] == 0 and tier.stats()[f"{direction}_failures"] == 0
    assert len([r for r in caplog.records if "O_DIRECT" in r.getMessage()]) == 1


# -- kind 5 / C11: symlinks ------------------------------------------------------------------------


def _key_in_other_shard(*avoid, salt=b"c11"):
    for i in itertools.count():
        key = make_key(i, salt)
        if shard_of(key) not in {shard_of(k) for k in avoid}:
            return key
    raise AssertionError


def test_C11_symlinks_below_the_root_are_never_followed(tmp_path, open_tier, capsys):
    root, outside = tmp_path / "kv", tmp_path / "outside"
    outside.mkdir()
    tier, view = open_tier(root)
    # A shard directory this instance already used, replaced by a symlink to a directory outside the root.
    k1 = make_key(1, b"c11")
    assert store(tier, view, [k1])
    shard = Path(tier.block_path(k1)).parent
    shutil.rmtree(shard)
    shard.symlink_to(outside, target_is_directory=True)
    k1b = next(make_key(i, b"c11-same") for i in itertools.count() if shard_of(make_key(i, b"c11-same")) == shard.name)
    assert store(tier, view, [k1b]) is False  # fails cleanly ...
    assert list(outside.iterdir()) == []  # ... and nothing was created outside the root
    assert tier.lookup(k1b, CTX) is False and tier.stats()["store_failed_io_error"] == 1
    assert tier.lookup(k1, CTX) is True  # still indexed: its shard was swapped behind the tier's back
    assert load(tier, view, [k1], [10]) is False  # not read through the symlinked shard ...
    assert tier.lookup(k1, CTX) is False  # ... and forgotten
    # A block-named symlink to a valid block file that lives outside the root.
    k2 = _key_in_other_shard(k1)
    other_root = tmp_path / "elsewhere"
    other, other_view = open_tier(other_root)
    assert store(other, other_view, [k2])
    target = outside / "valid.kvb"
    shutil.copy(other.block_path(k2), target)
    link = Path(tier.block_path(k2))
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(target)
    assert tier.lookup(k2, CTX) is False  # the lookup fallback does not follow it
    assert load(tier, view, [k2], [9]) is False  # nor does a load: a miss, the bytes are never served
    assert tier.stats()["load_failed_foreign"] == 2
    assert block_view(view, 9).tobytes() != block_payload(k2, BB)
    assert link.is_symlink() and target.read_bytes()[:BB] == block_payload(k2, BB)  # neither removed
    # A restart's scan indexes neither; ls / verify report both as foreign.
    tier.shutdown()
    tier, _ = open_tier(root)
    assert tier.wait_for_scan(10) and tier.lookup(k2, CTX) is False and tier.stats()["resident_blocks"] == 0
    inspector = FsInspector.from_config({"root": str(root)})
    assert sorted(inspector.foreign()) == sorted([str(shard), str(link)])
    assert [b.key for b in inspector.blocks(tier.namespace.digest)] == []


# -- kind 6 / C15: temporaries and probes ---------------------------------------------------------


def test_C15_stale_temps_and_probes_are_removed_and_live_ones_counted(tmp_path, open_tier):
    tier, _ = open_tier(tmp_path)
    ns = Path(tier.namespace_dir)
    tier.shutdown()
    dead = subprocess.Popen(["true"])
    dead.wait()
    shard = ns / "ab"
    shard.mkdir()
    old = time.time() - 2 * 3600
    stale = {
        # this process's pid, two hours old (another nonce: an earlier process that had this pid)
        shard / f"{'11' * 32}.kvb.tmp.{HOST}.{os.getpid()}.0badc0de.7": old,
        # this process's pid and another nonce, young: pid reuse, provably not a live writer
        shard / f"{'22' * 32}.kvb.tmp.{HOST}.{os.getpid()}.0badc0de.8": None,
        # probe files of a dead process
        ns / f".probe.tmp.{HOST}.{dead.pid}.12345678.0": None,
        ns / f".odirect-probe.tmp.{HOST}.{dead.pid}.12345678.1": None,
    }
    live = shard / f"{'33' * 32}.kvb.tmp.{HOST}.{os.getppid()}.87654321.0"  # a live writer
    for path, mtime in stale.items():
        path.write_bytes(b"x" * 100)
        if mtime:
            os.utime(path, (mtime, mtime))
    live.write_bytes(b"y" * 1000)
    tier, view = open_tier(tmp_path, capacity_bytes=4 * STORED)
    assert tier.wait_for_scan(10)
    assert not any(p.exists() for p in stale) and live.exists()
    s = tier.stats()
    assert s["temps_removed"] == 4 and s["resident_blocks"] == 0  # none counted as a block
    assert s["temp_bytes"] == 1000 and s["used_bytes"] == 1000  # the live one counts against the cap
    keys = [make_key(i, b"c15") for i in range(4)]
    assert store(tier, view, keys)  # 4 blocks + 1000 bytes do not fit 4 blocks: one was evicted
    assert disk_bytes(tier) + 1000 <= tier.capacity_bytes


@pytest.mark.usefixtures("python_io")
def test_temp_names_carry_a_per_process_nonce_and_cost_no_syscall(tmp_path, open_tier, monkeypatch):
    tier, view = open_tier(tmp_path, o_direct=False)
    names, real_open = [], os.open

    def recording(path, flags, *args, **kwargs):
        if ".tmp." in str(path):
            names.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    calls = []

    def counting(name, real):
        def call(*args, **kwargs):
            if name == "urandom" or ".kvb" in str(args[0]):
                calls.append(name)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(os, "open", recording)
    for name in ("urandom", "stat", "lstat"):
        monkeypatch.setattr(os, name, counting(name, getattr(os, name)))
    keys = [make_key(i, b"nonce") for i in range(8)]
    assert store(tier, view, keys)
    assert calls == []  # no random draw and no stat of a final path per block
    owner = f".tmp.{HOST}.{os.getpid()}.{temp_namer.nonce}."
    assert len(names) == 8 and all(owner in n for n in names) and len(set(names)) == 8


# -- KV events ------------------------------------------------------------------------------------


def test_kv_events_for_stores_evictions_and_removals_seen_by_a_rescan(tmp_path, open_tier):
    tier, view = open_tier(tmp_path, capacity_bytes=2 * STORED, rescan_interval_s=3600)
    keys = [make_key(i, b"ev") for i in range(3)]
    assert all(store(tier, view, [key]) for key in keys)  # one job each: a known LRU order
    events = tier.take_events()
    assert events[0] == TierCleared("storage", "startup", "fs", "local")
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert {(e.medium, e.cause, e.tier, e.locality) for e in stored} == {("storage", "store", "fs", "local")}
    assert sorted(k for e in stored for k in e.keys) == sorted(keys)  # one event per share settled
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert removed == [BlockRemoved((keys[0],), "storage", "eviction", "fs", "local")]
    os.unlink(tier.block_path(keys[1]))  # removed behind the tier's back (another process, tiering gc)
    rescan(tier)
    assert tier.take_events() == [BlockRemoved((keys[1],), "storage", "vanished", "fs", "local")]
    assert tier.lookup(keys[1], CTX) is False and tier.take_events() == []


# -- issue 15: probes and constructor errors -------------------------------------------------------


def test_probe_creates_nothing_where_there_was_nothing(tmp_path):
    before = sorted(tmp_path.rglob("*"))
    text = FsspecSecondaryTierManager.probe({"type": "fs", "root": str(tmp_path / "mnt" / "kv")})
    assert "does not exist; would be created in" in text and "probe file written and removed" in text
    assert sorted(tmp_path.rglob("*")) == before
    (tmp_path / "kv").mkdir()
    text = FsspecSecondaryTierManager.probe({"type": "fs", "root": str(tmp_path / "kv")})
    assert "exists, writable" in text and list((tmp_path / "kv").iterdir()) == []


def test_probe_and_constructor_name_the_root_key_when_it_is_unusable(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(RootNotUsableError) as info:
        FsspecSecondaryTierManager.probe({"type": "fs", "root": str(blocker / "kv")})
    assert info.value.key == "root" and str(blocker) in str(info.value)
    with pytest.raises(RootNotUsableError) as info:
        FsspecSecondaryTierManager(make_spec(), allocate_host_buffer(2, BB), "fs", root=str(blocker / "kv"))
    labelled = info.value.with_entry("secondary_tiers[1]")
    assert str(labelled).startswith("secondary_tiers[1].root: ") and "cannot create directory" in str(labelled)
    assert labelled.errno == info.value.errno == errno.ENOTDIR and isinstance(labelled, OSError)
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(RootNotUsableError, match=r"root: .*not writable: Read-only file system"):
        FsspecSecondaryTierManager.probe({"type": "fs", "root": str(tmp_path)})


def test_default_local_config_is_a_capped_fs_entry(tmp_path, open_tier):
    entry = FsspecSecondaryTierManager.default_local_config(str(tmp_path))
    assert entry["type"] == "fs" and entry["root"] == str(tmp_path) and entry["capacity_bytes"] > 0
    FsspecSecondaryTierManager.config_schema.validate(entry)
    assert FsspecSecondaryTierManager.medium == "storage"

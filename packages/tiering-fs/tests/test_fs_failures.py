"""Injected failures, the worker pool and the manager on top."""

import errno
import os
import threading
import time

import pytest

import tiering.fs.blocks as fs_blocks
from tiering.core import (
    JobMetadata,
    TieringManager,
)
from tiering.core.base import block_view
from tiering.fs import FsspecSecondaryTierManager
from tiering.fs.testing import BB, CTX, block_files, load, loads_exact, make_spec, store, temp_files
from tiering.testing import block_payload, make_key
from tiering.testing.harness import next_job_id

pytestmark = pytest.mark.usefixtures("python_io")

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
        job = JobMetadata(next_job_id(), [make_key(i + 1, b"prefer")], [i], False, CTX)
        tier.submit_store(job)
        stores.append(job.job_id)
    load_job = JobMetadata(next_job_id(), [ready], [15], True, CTX)
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
    job = JobMetadata(next_job_id(), keys, list(range(64)), False, CTX)
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

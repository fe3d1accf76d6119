"""Lookups: index, filesystem fallbacks and the start-up scan."""

import threading
import time

import pytest

from tiering.core import JobMetadata
from tiering.core.base import block_view
from tiering.fs.io.local import LocalBackend
from tiering.fs.testing import BB, CTX, hold_every_thread, load, store
from tiering.testing import block_payload, make_key, wait_for_jobs, wait_for_lookup

pytestmark = pytest.mark.usefixtures("io_path")

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


# -- stores queued, not yet taken by a worker ------------------------------------------------------


def test_a_queued_store_reserves_nothing_and_is_answered_none_until_written(tmp_path, open_tier):
    # Submitting only queues the blocks (the scheduler thread touches no index); the share reserves them when a
    # worker takes it. Meanwhile lookup still answers None (a store is in flight), never False, and nothing is
    # reserved; a queued store failed by the shutdown leaves no "in flight" answer behind.
    tier, view = open_tier(tmp_path, n_read_threads=1, n_write_threads=1)
    queued, dropped = make_key(1, b"queued"), make_key(2, b"dropped")
    block_view(view, 0)[:] = block_payload(queued, BB)
    readers, writers = hold_every_thread(tier)
    job = JobMetadata(501, [queued], [0], False, CTX)
    tier.submit_store(job)
    assert tier.lookup(queued, CTX) is None
    assert tier.stats()["reserved_bytes"] == 0 and tier.pool.pending() == 1
    for gate in readers + writers:
        gate.set()
    assert wait_for_jobs(tier, [job.job_id]) == {job.job_id: True}
    assert tier.lookup(queued, CTX) is True and tier.stats()["reserved_bytes"] == 0

    readers, writers = hold_every_thread(tier)
    late = JobMetadata(502, [dropped], [1], False, CTX)
    tier.submit_store(late)
    assert tier.lookup(dropped, CTX) is None
    closing = threading.Thread(target=tier.shutdown)
    closing.start()
    for gate in readers + writers:
        gate.set()
    closing.join(10)
    results = {r.job_id: r for r in tier.get_finished()}
    assert results[late.job_id].success is False
    assert tier.lookup(dropped, CTX) is False  # not "in flight" for ever


def test_a_share_that_raises_releases_every_reservation(tmp_path, open_tier, monkeypatch):
    tier, view = open_tier(tmp_path)
    keys = [make_key(i, b"raises") for i in range(3)]
    real = tier.files.write_many

    def broken(*args, **kwargs):
        raise RuntimeError("injected: the batch write itself raised")

    monkeypatch.setattr(tier.files, "write_many", broken)
    assert store(tier, view, keys) is False
    assert tier.stats()["reserved_bytes"] == 0
    assert [tier.lookup(k, CTX) for k in keys] == [False] * 3
    monkeypatch.setattr(tier.files, "write_many", real)
    assert store(tier, view, keys) is True  # no reservation left behind for a new store to join
    assert [tier.lookup(k, CTX) for k in keys] == [True] * 3

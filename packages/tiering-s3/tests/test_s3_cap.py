"""The cap holds on the bucket at every instant while deletes are refused, slow or sent one by one (case C21).

A lister thread counts the namespace's block objects while the tier stores; the cap's stated bound on
overshoot is 0: a block is PUT only once the victims evicted for it are gone.
"""

import itertools
import logging
import threading
import time

import pytest
from s3_helpers import CTX, OBJ, build, load, make_spec, store, wait_until
from test_s3_faults import hooks, server_error  # noqa: F401  (hooks is a fixture)

from tiering.core import JobMetadata
from tiering.core.base import block_view
from tiering.testing import block_payload, make_key

JOB_IDS = itertools.count(50_000)


class BucketWatch:
    """Lists the tier's namespace every ``every_s`` seconds in a thread; ``peak`` is the most block objects seen."""

    def __init__(self, env, tier, every_s):
        self.env, self.prefix, self.every_s = env, tier.object_key(b"\0" * 32).rsplit("/", 2)[0] + "/", every_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self):
        return sum(1 for name in self.env.list_keys(self.prefix) if not name.endswith(".json"))

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.count())
            self._stop.wait(self.every_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.count())


def settle(tier, env, watch):
    """Wait until no delete is in flight; then the stats must equal the bucket."""
    wait_until(lambda: tier.stats()["pending_delete_bytes"] == 0 and tier.stats()["in_flight_stores"] == 0)
    stats = tier.stats()
    assert stats["used_bytes"] == stats["resident_bytes"] == watch.count() * OBJ


def test_c21_batch_deletes_refused_after_start_up_fall_back_and_the_cap_holds(s3, hooks):  # noqa: F811
    """(a) DeleteObjects works for the start-up probe, then answers 400 MissingContentMD5; cap 4, store 10."""
    if not s3.batch_delete():
        pytest.skip("the server has no batch delete to refuse later (test_c21_no_batch_delete covers it)")
    batches = itertools.count()
    singles = []
    hooks.add(
        "before-call.s3.DeleteObjects",
        lambda **_: server_error(400, "MissingContentMD5") if next(batches) >= 1 else None,
    )
    hooks.add("before-call.s3.DeleteObject", lambda **_: singles.append(1))
    tier, view = build(s3.tier_config(capacity_bytes=4 * OBJ))
    try:
        assert tier.features.batch_delete is True  # the start-up probe's DeleteObjects went through
        keys = [make_key(i, b"c21a") for i in range(10)]
        with BucketWatch(s3, tier, 0.002) as watch:
            for start in range(0, 10, 2):
                assert store(tier, view, keys[start : start + 2], [start, start + 1])
            settle(tier, s3, watch)
        assert watch.peak <= 4  # the cap plus its stated bound (0) at every listing
        stats = tier.stats()
        assert stats["batch_delete_supported"] == 0 and stats["failed_deletes"] == 0
        assert stats["objects_deleted"] == 6 == len(singles) and stats["store_failures"] == 0
        assert stats["resident_blocks"] == 4 and watch.count() == 4
    finally:
        tier.shutdown()


def test_c21_no_batch_delete_8_threads_and_a_20_block_cap(localbucket):
    """(b) localbucket has no DeleteObjects: 300 store requests from 8 threads, listing every 50 ms."""
    cap = 20
    spec = make_spec(num_blocks=64)
    tier, view = build(localbucket.tier_config(capacity_bytes=cap * OBJ, max_concurrency=8), spec)
    submit_lock, done = threading.Lock(), threading.Event()
    finished: dict[int, bool] = {}
    try:
        assert tier.features.batch_delete is False

        def collect():  # the engine's part: one thread takes the finished jobs
            while not done.is_set():
                for result in tier.get_finished():
                    finished[result.job_id] = result.success
                time.sleep(0.001)

        requests = itertools.count()

        def client(worker):
            slots = [worker * 2, worker * 2 + 1]
            while (n := next(requests)) < 300:
                keys = [make_key(n * 2 + i, b"c21b") for i in range(2)]
                for key, slot in zip(keys, slots):
                    block_view(view, slot)[:] = block_payload(key, view.shape[1])
                job = JobMetadata(next(JOB_IDS), keys, slots, False, CTX)
                with submit_lock:  # one scheduler thread submits, as in the engine
                    tier.submit_store(job)
                wait_until(lambda job_id=job.job_id: job_id in finished, 60.0)

        collector = threading.Thread(target=collect, daemon=True)
        collector.start()
        with BucketWatch(localbucket, tier, 0.05) as watch:
            threads = [threading.Thread(target=client, args=(w,)) for w in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            settle(tier, localbucket, watch)
        stats = tier.stats()
        assert watch.peak <= cap  # the cap plus its stated bound (0) at every listing
        assert len(finished) == 300 and stats["blocks_stored"] > cap and stats["evictions"] > 0
        assert stats["objects_deleted"] == stats["delete_requests"] > 0  # one DeleteObject per key
        assert stats["store_failures"] == stats.get("store_failed_no_space", 0)  # refused only for want of room
    finally:
        done.set()
        tier.shutdown()


def test_c21_single_deletes_are_sent_in_parallel(s3, hooks):  # noqa: F811
    """A server refusing DeleteObjects gets one DeleteObject per key, several at once (not one deleter thread)."""
    lock, running, most = threading.Lock(), [0], [0]

    def slow_single_delete(**_):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1

    hooks.add("before-call.s3.DeleteObjects", lambda **_: server_error(501, "NotImplemented"))
    hooks.add("before-call.s3.DeleteObject", slow_single_delete)
    tier, view = build(s3.tier_config(capacity_bytes=4 * OBJ, max_concurrency=4))
    try:
        assert tier.features.batch_delete is False
        keys = [make_key(i, b"c21-parallel") for i in range(8)]
        assert store(tier, view, keys[:4])
        assert store(tier, view, keys[4:], [4, 5, 6, 7])  # 4 victims, each PUT waits for its room
        assert most[0] >= 2  # the deletes overlapped
        wait_until(lambda: tier.stats()["objects_deleted"] == 4)
    finally:
        tier.shutdown()


def test_c21_a_batch_refused_after_start_up_is_sent_again_one_per_request_in_parallel(s3, hooks, caplog):  # noqa: F811
    """Victims of one batch refused (MissingContentMD5) after start-up are deleted singly, several at once."""
    if not s3.batch_delete():
        pytest.skip("the server has no batch delete to refuse later")
    lock, running, most, batches = threading.Lock(), [0], [0], itertools.count()

    def slow_single_delete(**_):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1

    hooks.add(
        "before-call.s3.DeleteObjects",
        lambda **_: server_error(400, "MissingContentMD5") if next(batches) >= 1 else None,
    )
    hooks.add("before-call.s3.DeleteObject", slow_single_delete)
    caplog.set_level(logging.WARNING)
    # Two delete threads for four victims: each takes a batch of two, which the server refuses.
    tier, view = build(s3.tier_config(capacity_bytes=4 * OBJ, max_concurrency=2))
    try:
        assert tier.features.batch_delete is True  # the start-up probe's DeleteObjects went through
        keys = [make_key(i, b"c21-refused-later") for i in range(8)]
        with BucketWatch(s3, tier, 0.002) as watch:
            assert store(tier, view, keys[:4])
            assert store(tier, view, keys[4:], [4, 5, 6, 7])  # 4 victims in one batch, refused: sent again singly
            settle(tier, s3, watch)
        assert most[0] >= 2  # the single deletes overlapped
        assert watch.peak <= 4
        assert not [r for r in caplog.records if "cannot delete" in r.getMessage()]  # sent again, not failed
        stats = tier.stats()
        assert stats["batch_delete_supported"] == 0 and stats["objects_deleted"] == 4 == stats["delete_requests"]
        assert stats["failed_deletes"] == 0 and stats["store_failures"] == 0
    finally:
        tier.shutdown()


def test_c27_a_store_refused_for_room_that_queued_writes_hold_fails_after_the_room_wait(s3):
    """Reservations made on the scheduler thread hold the whole cap and no thread writes them (as when they are
    queued behind every busy I/O thread): a store needing that room fails as no space within the room wait."""
    tier, view = build(s3.tier_config(capacity_bytes=OBJ, max_concurrency=8))
    try:
        assert tier.reserve_on_scheduler
        held = make_key(0, b"c27-held")
        assert tier.index.reserve(held, OBJ).ready  # the cap, reserved, never written
        key = make_key(1, b"c27")
        assert store(tier, view, [key], [0]) is False  # wait_for_jobs raises if the job never ends
        assert tier.stats()["store_failed_no_space"] == 1
        tier.index.commit(held, False)  # the holder ends
        assert store(tier, view, [key], [0])
        stats = tier.stats()
        assert stats["used_bytes"] == stats["resident_bytes"] == OBJ and stats["reserved_bytes"] == 0
        assert load(tier, view, [key], [1])
    finally:
        tier.shutdown()


def test_a_replay_with_batch_deletes_refused_and_50_ms_single_deletes_finishes_and_settles(s3, hooks):  # noqa: F811
    """Cap 20, 8 I/O threads, DeleteObjects refused after start-up and each DeleteObject 50 ms; 300 requests
    storing two blocks and loading earlier ones from 8 clients: every request finishes, none waits without a bound,
    and the account returns to what the bucket holds."""
    if not s3.batch_delete():
        pytest.skip("the server has no batch delete to refuse")
    batches = itertools.count()
    hooks.add(
        "before-call.s3.DeleteObjects",
        lambda **_: server_error(400, "MissingContentMD5") if next(batches) >= 1 else None,
    )
    hooks.add("before-call.s3.DeleteObject", lambda **_: time.sleep(0.05))
    cap = 20
    spec = make_spec(num_blocks=64)
    tier, view = build(s3.tier_config(capacity_bytes=cap * OBJ, max_concurrency=8), spec)
    submit_lock, done = threading.Lock(), threading.Event()
    finished: dict[int, bool] = {}
    try:

        def collect():
            while not done.is_set():
                for result in tier.get_finished():
                    finished[result.job_id] = result.success
                time.sleep(0.001)

        requests = itertools.count()

        def client(worker):
            slots = [worker * 4, worker * 4 + 1]
            while (n := next(requests)) < 300:
                keys = [make_key(n * 2 + i, b"c27") for i in range(2)]
                for key, slot in zip(keys, slots):
                    block_view(view, slot)[:] = block_payload(key, view.shape[1])
                jobs = [JobMetadata(next(JOB_IDS), keys, slots, False, CTX)]
                if n >= 8:  # and load two blocks of an earlier request (a hit or a miss, never wrong bytes)
                    jobs.append(JobMetadata(next(JOB_IDS), [make_key((n - 8) * 2 + i, b"c27") for i in range(2)],
                                            [worker * 4 + 2, worker * 4 + 3], True, CTX))  # fmt: skip
                with submit_lock:  # one scheduler thread submits, as in the engine
                    for job in jobs:
                        (tier.submit_load if job.is_promotion else tier.submit_store)(job)
                for job in jobs:
                    wait_until(lambda job_id=job.job_id: job_id in finished, 60.0)

        collector = threading.Thread(target=collect, daemon=True)
        collector.start()
        threads = [threading.Thread(target=client, args=(w,), daemon=True) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads)
        wait_until(lambda: tier.stats()["pending_delete_bytes"] == 0 and tier.stats()["in_flight_stores"] == 0, 60)
        stats = tier.stats()
        assert stats["used_bytes"] == stats["resident_bytes"] <= cap * OBJ and stats["reserved_bytes"] == 0
        assert stats["blocks_stored"] > cap
    finally:
        done.set()
        tier.shutdown()

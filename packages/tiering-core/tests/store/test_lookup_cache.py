import threading
import time

import pytest

from tiering.core.base import OffloadKey
from tiering.core.store.lookup_cache import LookupCache

K = [OffloadKey(bytes([i])) for i in range(50)]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ManualSubmit:
    """Collects submitted calls; the test runs them (a stand-in for a pool thread)."""

    def __init__(self) -> None:
        self.calls = []

    def __call__(self, fn):
        self.calls.append(fn)

    def run(self) -> None:
        calls, self.calls = self.calls, []
        for fn in calls:
            fn()


def test_unknown_keys_answer_none_then_resolve_in_one_batch():
    present = {K[1]}
    batches = []

    def resolve(keys):
        batches.append(list(keys))
        return {key: key in present for key in keys}

    submit = ManualSubmit()
    cache = LookupCache(resolve, submit, clock=Clock())
    assert [cache.lookup(K[i]) for i in range(3)] == [None, None, None]
    assert cache.lookup(K[0]) is None  # still queued
    assert len(submit.calls) == 1  # one scheduled resolution for the whole step
    submit.run()
    assert batches == [[K[0], K[1], K[2]]]
    assert [cache.lookup(K[i]) for i in range(3)] == [False, True, False]
    assert cache.stats()["lookup_batches"] == 1 and cache.stats()["lookup_probes"] == 3


def test_negative_entries_expire_and_are_bounded():
    clock = Clock()
    submit = ManualSubmit()
    cache = LookupCache(lambda keys: {}, submit, negative_ttl_s=5.0, max_negative=3, clock=clock)
    for key in K[:4]:
        cache.lookup(key)
    submit.run()
    assert cache.stats()["lookup_cache_negative"] == 3  # oldest dropped
    assert cache.lookup(K[3]) is False
    clock.now = 5.1
    assert cache.lookup(K[3]) is None  # expired: asked again


def test_positive_entries_bounded_lru_and_ttl():
    clock = Clock()
    cache = LookupCache(lambda keys: {}, ManualSubmit(), max_positive=2, positive_ttl_s=10, clock=clock)
    cache.mark_present(K[:2])
    assert cache.lookup(K[0]) is True  # K[0] now most recent
    cache.mark_present([K[2]])
    assert cache.lookup(K[1]) is None and cache.lookup(K[0]) is True
    clock.now = 11
    assert cache.lookup(K[0]) is None


def test_invalidate_during_resolution_discards_a_stale_true():
    submit = ManualSubmit()
    cache = LookupCache(lambda keys: {}, submit, clock=Clock())
    started = threading.Event()
    release = threading.Event()

    def resolve(keys):
        started.set()
        release.wait(5)
        return {key: True for key in keys}

    cache._resolve = resolve
    cache.lookup(K[0])
    t = threading.Thread(target=submit.run)
    t.start()
    assert started.wait(5)
    cache.invalidate([K[0]])  # e.g. the block was evicted while its probe was in flight
    release.set()
    t.join()
    assert cache.lookup(K[0]) is None  # not a stale True: asked again


def test_resolver_errors_answer_false_for_a_short_time():
    clock = Clock()
    submit = ManualSubmit()

    def boom(keys):
        raise ConnectionError("down")

    cache = LookupCache(boom, submit, error_ttl_s=1.0, clock=clock)
    cache.lookup(K[0])
    submit.run()
    assert cache.lookup(K[0]) is False
    assert cache.stats()["lookup_errors"] == 1
    clock.now = 1.5
    assert cache.lookup(K[0]) is None


def test_max_pending_answers_false_and_counts():
    cache = LookupCache(lambda keys: {}, ManualSubmit(), max_pending=2, clock=Clock())
    assert [cache.lookup(K[i]) for i in range(3)] == [None, None, False]
    assert cache.stats()["lookup_probes_skipped"] == 1


def test_submit_failure_does_not_hang_keys():
    def refuse(fn):
        raise RuntimeError("shut down")

    cache = LookupCache(lambda keys: {}, refuse, clock=Clock())
    assert cache.lookup(K[0]) is None
    assert cache.lookup(K[0]) is False
    assert cache.pending() == 0


def test_own_executor_resolves_concurrent_lookups():
    present = set(K[::2])
    cache = LookupCache(lambda keys: {key: key in present for key in keys})
    answers = {}

    def ask(keys):
        for key in keys:
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline:
                v = cache.lookup(key)
                if v is not None:
                    answers[key] = v
                    break
                time.sleep(0.001)

    threads = [threading.Thread(target=ask, args=(K[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cache.close()
    assert answers == {key: key in present for key in K}
    assert cache.lookup(OffloadKey(b"new")) is False  # closed


def test_bad_bounds():
    with pytest.raises(ValueError, match="max_batch"):
        LookupCache(lambda keys: {}, ManualSubmit(), max_batch=0)


def test_gather_waits_for_the_round_to_end_so_a_step_is_one_batch():
    batches = []
    done = threading.Event()

    def resolve(keys):
        batches.append(list(keys))
        done.set()
        return {}

    cache = LookupCache(resolve, gather_s=0.5, max_gather_s=5.0, max_batch=1000)  # gaps below: 5 ms, far under 0.5 s
    try:
        for key in K[:10]:  # a "round" slower than an immediate pickup: without gathering, K[0] goes alone
            assert cache.lookup(key) is None
            threading.Event().wait(0.005)
        assert done.wait(5)
        assert batches == [K[:10]]
    finally:
        cache.close()


def test_gather_stops_at_a_full_batch_and_parallel_tasks_take_the_rest():
    submit = ManualSubmit()
    seen = []
    cache = LookupCache(lambda keys: seen.append(list(keys)) or {}, submit, gather_s=0.05, max_batch=4, parallel=3)
    for key in K[:10]:
        cache.lookup(key)
    assert len(submit.calls) == 1
    submit.run()  # a full batch is there: no gathering wait; two more tasks are submitted for the rest
    assert seen[0] == K[:4] and len(submit.calls) == 2
    submit.run()
    assert sorted(k for b in seen for k in b) == sorted(K[:10]) and cache.pending() == 0
    assert [cache.lookup(k) for k in K[:10]] == [False] * 10


def test_bad_parallel_and_gather():
    with pytest.raises(ValueError, match="parallel"):
        LookupCache(lambda keys: {}, ManualSubmit(), parallel=0)
    with pytest.raises(ValueError, match="gather_s"):
        LookupCache(lambda keys: {}, ManualSubmit(), gather_s=-1)

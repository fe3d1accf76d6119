"""Every test of the tier conformance suite can fail (fault kind 9).

A correct asynchronous tier passes the whole suite; for each test there is a
deliberately broken tier, one defect each, that the test must reject.
"""

from __future__ import annotations

import collections
import inspect
import threading
import time

import pytest

from tiering.core.base import JobResult, SecondaryTierManager, block_view
from tiering.core.primary import allocate_host_buffer
from tiering.testing import TierConformanceTests


class GoodTier(SecondaryTierManager):
    """A correct tier whose jobs run on a worker thread, stores after a delay (so in-flight windows exist)."""

    store_delay_s = 0.02

    def __init__(self, spec, view, tier_type):
        super().__init__(spec, view, tier_type)
        self.blocks: dict[bytes, bytes] = {}
        self.lock = threading.Lock()
        self.queue: collections.deque = collections.deque()
        self.finished: collections.deque = collections.deque()
        self.writing: collections.Counter = collections.Counter()
        self.cv = threading.Condition(self.lock)
        self.stopping = False
        self.worker = threading.Thread(target=self.run, daemon=True)
        self.worker.start()

    # -- contract
    def lookup(self, key, ctx):
        with self.lock:
            if self.writing[key]:
                return None
            return key in self.blocks

    def submit_store(self, job):
        with self.lock:
            if self.stopping:
                self.finished.append(JobResult(job.job_id, False))
                return
            for key in job.keys:
                self.writing[key] += 1
            self.queue.append(job)
            self.cv.notify()

    def submit_load(self, job):
        with self.lock:
            if self.stopping:
                self.finished.append(JobResult(job.job_id, False))
                return
            self.queue.appendleft(job)
            self.cv.notify()

    def get_finished(self):
        out = []
        while self.finished:
            out.append(self.finished.popleft())
        return out

    def shutdown(self):
        with self.lock:
            if self.stopping:
                return
            self.stopping = True
            dropped = list(self.queue)
            self.queue.clear()
            self.cv.notify_all()
        for job in dropped:
            self.drop(job)
        self.worker.join()

    # -- worker
    def drop(self, job):
        with self.lock:
            if not job.is_promotion:
                for key in job.keys:
                    self.writing[key] -= 1
        self.finished.append(JobResult(job.job_id, False))

    def run(self):
        while True:
            with self.lock:
                while not self.queue and not self.stopping:
                    self.cv.wait()
                if not self.queue:
                    return
                job = self.queue.popleft()
            self.finished.append(self.load(job) if job.is_promotion else self.store(job))

    def store(self, job):
        time.sleep(self.store_delay_s)
        with self.lock:
            for key, b in zip(job.keys, job.block_ids):
                self.blocks.setdefault(key, block_view(self.primary_kv_view, b).tobytes())
                self.writing[key] -= 1
        return JobResult(job.job_id, True)

    def load(self, job):
        ok_keys = []
        for key, b in zip(job.keys, job.block_ids):
            with self.lock:
                data = self.blocks.get(key)
            if data is None:
                break
            block_view(self.primary_kv_view, b)[:] = data
            ok_keys.append(key)
        if len(ok_keys) == len(job.keys):
            return JobResult(job.job_id, True)
        return JobResult(job.job_id, False, ok_keys or None)


class LoadsWrongBytes(GoodTier):
    def load(self, job):
        result = super().load(job)
        if result.success:
            for b in job.block_ids:
                block_view(self.primary_kv_view, b)[0] ^= 0xFF
        return result


class AlwaysTrue(GoodTier):
    def lookup(self, key, ctx):
        return True


class MissingLoadSucceeds(GoodTier):
    def load(self, job):
        super().load(job)
        return JobResult(job.job_id, True)


class PartialLoadSucceeds(GoodTier):
    def load(self, job):
        result = super().load(job)
        return JobResult(job.job_id, bool(result.successful_keys) or result.success)


class ClaimsUnloadedKeys(GoodTier):
    def load(self, job):
        result = super().load(job)
        return result if result.success else JobResult(job.job_id, False, list(job.keys))


class RestoreFails(GoodTier):
    def store(self, job):
        with self.lock:
            present = any(k in self.blocks for k in job.keys)
        result = super().store(job)
        return JobResult(job.job_id, False) if present else result


class ReportsTwice(GoodTier):
    def store(self, job):
        result = super().store(job)
        self.finished.append(result)
        return result


class TrueWhileQueued(GoodTier):
    """Answers True as soon as a store is accepted, and serves loads before queued stores."""

    store_delay_s = 0.3

    def lookup(self, key, ctx):
        with self.lock:
            return bool(self.writing[key]) or key in self.blocks

    def submit_load(self, job):  # loads are served at once, ahead of the queued stores
        self.finished.append(self.load(job))


class ForgetsJobsAtShutdown(GoodTier):
    def drop(self, job):
        pass


class IgnoresInjectedType(GoodTier):
    def __init__(self, spec, view, tier_type):
        super().__init__(spec, view, "constant-name")


BROKEN = {
    "test_round_trip_is_byte_exact": LoadsWrongBytes,
    "test_absent_key_looks_up_false": AlwaysTrue,
    "test_missing_key_load_fails": MissingLoadSucceeds,
    "test_partly_missing_load_fails": PartialLoadSucceeds,
    "test_failed_load_reports_only_verified_keys": ClaimsUnloadedKeys,
    "test_store_of_present_key_succeeds": RestoreFails,
    "test_every_job_reported_exactly_once": ReportsTwice,
    "test_in_flight_lookup_is_never_a_wrong_true": TrueWhileQueued,
    "test_shutdown_with_jobs_in_flight_reports_them": ForgetsJobsAtShutdown,
    "test_tier_type_is_injected": IgnoresInjectedType,
}

SUITE_TESTS = sorted(name for name in dir(TierConformanceTests) if name.startswith("test_"))


class Suite(TierConformanceTests):
    timeout_s = 2.0


def run_suite_test(name: str, cls: type[SecondaryTierManager]) -> None:
    """Run one conformance test against a fresh ``cls`` tier, as the suite's fixtures would."""
    suite = Suite()
    spec = suite.make_spec()
    view = allocate_host_buffer(suite.num_blocks, suite.block_bytes)
    tier = cls(spec, view, "conformance-fake")
    fixtures = {"tier": tier, "primary_kv_view": view, "tier_config": {"type": "conformance-fake"}, "spec": spec}
    method = getattr(suite, name)
    try:
        method(**{p: fixtures[p] for p in inspect.signature(method).parameters})
    finally:
        tier.shutdown()


def test_every_conformance_test_has_a_broken_tier():
    assert sorted(BROKEN) == SUITE_TESTS


@pytest.mark.parametrize("name", SUITE_TESTS)
def test_a_correct_tier_passes(name):
    run_suite_test(name, GoodTier)


@pytest.mark.parametrize("name", SUITE_TESTS)
def test_the_broken_tier_fails(name):
    with pytest.raises(AssertionError):
        run_suite_test(name, BROKEN[name])

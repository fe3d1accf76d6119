"""The guard around one secondary tier (tiering.core.runtime.guard), on its own."""

import logging

from tiering.core import JobResult, OffloadingSpec, ReqContext
from tiering.core.base import JobMetadata, SecondaryTierManager
from tiering.core.primary import allocate_host_buffer
from tiering.core.runtime.guard import GuardedTier
from tiering.testing import make_key

BLOCK = 256


class ScriptedTier(SecondaryTierManager):
    """Reports what the test puts in ``results``; raises in the calls named in ``raise_in``."""

    def __init__(self):
        spec = OffloadingSpec({"cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK})
        super().__init__(spec, allocate_host_buffer(4, BLOCK), "scripted")
        self.results = []
        self.raise_in = set()
        self.submitted = []

    def _maybe_raise(self, name):
        if name in self.raise_in:
            raise RuntimeError(f"{name} broke")

    def lookup(self, key, ctx):
        self._maybe_raise("lookup")
        return True

    def submit_store(self, job):
        self._maybe_raise("submit_store")
        self.submitted.append(job.job_id)

    def submit_load(self, job):
        self._maybe_raise("submit_load")
        self.submitted.append(job.job_id)

    def get_finished(self):
        self._maybe_raise("get_finished")
        out, self.results = self.results, []
        return out

    def take_events(self):
        self._maybe_raise("take_events")
        return []

    def stats(self):
        self._maybe_raise("stats")
        return {"resident_blocks": 0}


KEYS = [make_key(i, b"guard") for i in range(3)]


def load_job(job_id, req="r"):
    return JobMetadata(job_id, KEYS, [0, 1, 2], True, ReqContext(req))


def test_a_refused_job_is_reported_failed_by_the_next_poll_not_inside_submit():
    tier, errors = ScriptedTier(), []
    guard = GuardedTier(tier, "tier 0", on_error=lambda: errors.append(1))
    tier.raise_in = {"submit_load"}
    guard.submit(load_job(1))
    assert guard.in_flight() == 1 and errors == [1]
    (done,) = guard.get_finished()
    assert (done.job.job_id, done.success, done.loaded) == (1, False, [])
    assert guard.in_flight() == 0 and guard.errors == 1
    assert guard.lookup(KEYS[0], ReqContext("r")) is False  # failed for this request
    assert guard.lookup(KEYS[0], ReqContext("other")) is True


def test_a_failed_load_keeps_what_it_loaded_and_only_the_rest_are_misses():
    tier = ScriptedTier()
    guard = GuardedTier(tier, "tier 0")
    guard.submit(load_job(1))
    tier.results = [JobResult(1, False, [KEYS[2], KEYS[0]])]
    (done,) = guard.get_finished()
    assert done.loaded == [KEYS[0], KEYS[2]]  # job order
    assert set(guard.failed_keys("r")) == {KEYS[1]}
    guard.on_request_finished(ReqContext("r"))
    assert guard.failed_keys("r") == ()


def test_unknown_jobs_and_keys_outside_the_job_are_dropped(caplog):
    tier = ScriptedTier()
    guard = GuardedTier(tier, "tier 0")
    guard.submit(load_job(1))
    tier.results = [JobResult(7, True), JobResult(1, False, [KEYS[0], make_key(99)])]
    with caplog.at_level(logging.ERROR):
        (done,) = guard.get_finished()
    assert done.loaded == [KEYS[0]] and guard.errors == 2
    assert "unknown job 7" in caplog.text and "outside job 1" in caplog.text


def test_a_load_of_an_ended_request_leaves_no_failed_keys_behind():
    tier = ScriptedTier()
    guard = GuardedTier(tier, "tier 0")
    guard.submit(load_job(1))
    guard.on_request_finished(ReqContext("r"))
    tier.results = [JobResult(1, False)]
    guard.get_finished()
    assert guard.failed_keys("r") == () and guard._failed == {}


def test_raising_polls_keep_jobs_in_flight_and_other_calls_answer_empty():
    tier = ScriptedTier()
    guard = GuardedTier(tier, "tier 0")
    guard.submit(load_job(1))
    tier.results = [JobResult(1, True)]
    tier.raise_in = {"get_finished", "take_events", "stats", "lookup"}
    assert guard.get_finished() == [] and guard.in_flight() == 1
    assert list(guard.take_events()) == [] and guard.stats() == {}
    assert guard.lookup(KEYS[0], ReqContext("r")) is False
    assert guard.errors == 4
    tier.raise_in = set()
    (done,) = guard.get_finished()
    assert done.success and guard.in_flight() == 0


def test_fail_unreported_fails_what_the_tier_forgot_and_drops_late_reports(caplog):
    tier = ScriptedTier()
    guard = GuardedTier(tier, "tier 0")
    guard.submit(load_job(1))
    guard.submit(load_job(2))
    tier.results = [JobResult(2, True)]
    guard.shutdown()
    finished = guard.fail_unreported()
    assert sorted((d.job.job_id, d.success) for d in finished) == [(1, False), (2, True)]
    tier.results = [JobResult(1, True)]
    assert guard.get_finished() == [] and "unknown job 1" in caplog.text


def test_a_refused_job_never_reaches_the_tier_and_is_reported_failed_once_by_the_next_poll():
    tier = ScriptedTier()
    guard = GuardedTier(tier, "t")
    guard.refuse(load_job(7))
    assert tier.submitted == [] and guard.in_flight() == 1 and guard.unreported() == 0 and guard.errors == 0
    [done] = guard.get_finished()
    assert (done.job.job_id, done.success, done.loaded) == (7, False, [])
    assert guard.get_finished() == [] and guard.in_flight() == 0
    assert set(guard.failed_keys("r")) == set(KEYS)  # as for a load the tier failed: misses for the request

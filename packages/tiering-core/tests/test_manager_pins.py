"""Every pin the manager takes for a request is released exactly once (fault kind 1, case C10)."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tiering.core import CPUPrimaryTier, JobResult, LRUCachePolicy, OffloadingSpec, ReqContext, TieringManager
from tiering.core.base import SecondaryTierManager, block_view
from tiering.testing import block_payload, make_key

BLOCK = 256


class AsyncFakeTier(SecondaryTierManager):
    """Jobs stay in flight until ``deliver`` is called; loads and stores may fail; submits may raise."""

    def __init__(self, spec, view, name="async"):
        super().__init__(spec, view, name)
        self.data: dict[bytes, bytes] = {}
        self.in_flight: list[tuple[object, bool]] = []  # (job, ok)
        self.finished: list[JobResult] = []
        self.reported: list[int] = []
        self.fail_next = False
        self.raise_next = False
        self.answer_none = False

    def lookup(self, key, ctx):
        return None if self.answer_none else key in self.data

    def _accept(self, job):
        if self.raise_next:
            self.raise_next = False
            raise RuntimeError("tier refused the job")
        self.in_flight.append((job, not self.fail_next))
        self.fail_next = False

    def submit_store(self, job):
        self._accept(job)

    def submit_load(self, job):
        self._accept(job)

    def deliver(self, n: int | None = None, rng: random.Random | None = None) -> None:
        """Finish ``n`` in-flight jobs (all when None), in random order when ``rng`` is given."""
        if rng is not None:
            rng.shuffle(self.in_flight)
        count = len(self.in_flight) if n is None else min(n, len(self.in_flight))
        done, self.in_flight = self.in_flight[:count], self.in_flight[count:]
        for job, ok in done:
            if job.is_promotion:
                ok = ok and all(k in self.data for k in job.keys)
                if ok:
                    for k, b in zip(job.keys, job.block_ids):
                        block_view(self.primary_kv_view, b)[:] = self.data[k]
                    result = JobResult(job.job_id, True)
                else:
                    half = [k for k in job.keys[: len(job.keys) // 2] if k in self.data]
                    result = JobResult(job.job_id, False, half or None)
            else:
                if ok:
                    for k, b in zip(job.keys, job.block_ids):
                        self.data[k] = block_view(self.primary_kv_view, b).tobytes()
                result = JobResult(job.job_id, ok)
            self.finished.append(result)

    def get_finished(self):
        out, self.finished = self.finished, []
        self.reported.extend(r.job_id for r in out)
        return out

    def shutdown(self):
        for job, _ in self.in_flight:
            self.finished.append(JobResult(job.job_id, False))
        self.in_flight = []


def make_stack(num_blocks=8, tiers=2):
    spec = OffloadingSpec({"cpu_bytes_to_use": num_blocks * BLOCK, "block_bytes": BLOCK})
    primary = CPUPrimaryTier(num_blocks, BLOCK, LRUCachePolicy(num_blocks))
    fakes = [AsyncFakeTier(spec, primary.kv_view, f"t{i}") for i in range(tiers)]
    return TieringManager(primary, fakes), fakes


def store(manager, keys, ctx):
    alloc = manager.prepare_store(keys, ctx)
    for k, b in zip(alloc.keys, alloc.block_ids):
        block_view(manager.primary.kv_view, b)[:] = block_payload(k, BLOCK)
    manager.complete_store(alloc.keys, ctx)
    return alloc


def test_C10_request_ends_while_its_promotion_is_in_flight():
    manager, (tier, _) = make_stack(num_blocks=4, tiers=2)
    tier.data.update({make_key(i): block_payload(make_key(i), BLOCK) for i in range(4)})
    ctx = ReqContext("req-c10")
    keys = [make_key(i) for i in range(4)]
    assert manager.lookup(keys, ctx) == 4
    manager.prepare_load(keys, ctx)
    assert manager.primary.num_pinned == 4  # the promotion's slots
    manager.on_request_finished(ctx)  # the request ends before the tier reports
    tier.deliver()
    assert manager.get_finished() == []  # nobody waits for it: not reported
    for t in manager.secondary_tiers:  # fill-on-hit stores are not involved here (tier 0 held them)
        t.deliver()
    manager.get_finished()
    assert manager.primary.num_pinned == 0
    assert manager._held == {} and manager._loads == {}
    assert manager.metrics.value("loads_unused_blocks_total", state="in_flight") == 4
    assert manager.metrics.value("loads_unused_blocks_total", state="reported") == 0
    # later stores succeed: every slot can be reused
    fresh = [make_key(i, b"later") for i in range(4)]
    assert store(manager, fresh, ReqContext("later")).rejected == []


def test_C10_partial_failure_and_shutdown_also_release():
    manager, (tier, _) = make_stack(num_blocks=4)
    keys = [make_key(i) for i in range(3)]
    tier.data.update({k: block_payload(k, BLOCK) for k in keys[:2]})  # key 2 vanished meanwhile
    tier.answer_none = False
    ctx = ReqContext("r")
    manager.prepare_load(keys[:2], ctx)
    tier.fail_next = False
    manager.on_request_finished(ctx)
    manager.shutdown()  # the tier fails what is still in flight
    assert manager.primary.num_pinned == 0


def test_finished_load_not_yet_completed_is_released_by_request_end():
    manager, (tier, _) = make_stack(num_blocks=4)
    keys = [make_key(i) for i in range(2)]
    tier.data.update({k: block_payload(k, BLOCK) for k in keys})
    ctx = ReqContext("r")
    manager.prepare_load(keys, ctx)
    tier.deliver()
    manager._poll_tiers()  # finished, parked, not yet taken by get_finished
    manager.on_request_finished(ctx)
    assert manager.get_finished() == []
    manager.complete_load(ctx)  # a late complete is harmless
    assert manager.primary.num_pinned == 0
    assert manager.metrics.value("loads_unused_blocks_total", state="reported") == 2
    done = ReqContext("used")  # a load the engine took and completed is not counted at its request's end
    manager.prepare_load(keys, done)
    tier.deliver()
    assert [r.req_context for r in manager.get_finished()] == [done]
    manager.complete_load(done)
    manager.on_request_finished(done)
    assert manager.metrics.value("loads_unused_blocks_total") == 2


def test_unreported_job_at_shutdown_counts_failed_and_late_report_is_ignored():
    manager, (tier, _) = make_stack(num_blocks=4)
    tier.shutdown = lambda: None  # a tier that forgets its jobs
    keys = [make_key(i) for i in range(2)]
    tier.data.update({k: block_payload(k, BLOCK) for k in keys})
    manager.prepare_load(keys, ReqContext("r"))
    manager.shutdown()
    assert manager.primary.num_pinned == 0
    tier.deliver()
    manager.get_finished()  # the late report is ignored
    assert manager.primary.num_pinned == 0


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["lookup_load", "store", "deliver", "deliver_all", "get_finished", "complete", "finish", "fail", "raise"]
        ),
        st.integers(0, 7),  # request
        st.integers(0, 11),  # first key
        st.integers(1, 4),  # key count
        st.integers(0, 1),  # tier
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(ops=OPS, seed=st.integers(0, 2**16), shutdown_at_end=st.booleans())
def test_random_interleavings_release_every_pin_and_report_every_load_once(ops, seed, shutdown_at_end):
    rng = random.Random(seed)
    manager, tiers = make_stack(num_blocks=6)
    keys = [make_key(i, b"h") for i in range(16)]
    contexts = {}
    loading: set[str] = set()  # requests with a load started and not yet reported
    ended: set[str] = set()
    reported: list[str] = []

    def take():
        for result in manager.get_finished():
            req = result.req_context.req_id
            assert req in loading and req not in ended, f"load of {req} reported wrongly"
            loading.discard(req)
            reported.append(req)
            assert len(result.keys) <= result.requested
            for b, k in zip(result.block_ids, result.keys):
                assert block_view(manager.primary.kv_view, b).tobytes() == block_payload(k, BLOCK)
            if rng.random() < 0.7:
                manager.complete_load(result.req_context)

    for op, req, first, count, t in ops:
        req_id = f"r{req}"
        ctx = contexts.setdefault(req_id, ReqContext(req_id))
        run = keys[first : first + count]
        if op == "lookup_load":
            if req_id in ended or req_id in loading or req_id in manager._held:
                continue  # one load at a time per request; ended requests do nothing more
            n = manager.lookup(run, ctx)
            if n:
                manager.prepare_load(run[:n], ctx)
                loading.add(req_id)
        elif op == "store":
            if req_id not in ended:
                store(manager, run, ctx)
        elif op == "deliver":
            tiers[t].deliver(rng.randint(1, 3), rng)
        elif op == "deliver_all":
            tiers[t].deliver(None, rng)
        elif op == "get_finished":
            take()
        elif op == "complete":
            manager.complete_load(ctx)
        elif op == "finish":
            manager.on_request_finished(ctx)
            loading.discard(req_id)  # an abandoned load is never reported
            contexts.pop(req_id)
            ended.add(req_id)
        elif op == "fail":
            tiers[t].fail_next = True
        elif op == "raise":
            tiers[t].raise_next = True
        assert manager.primary.num_pinned <= manager.primary.num_blocks

    # the end: requests end, tiers finish (or the stack shuts down)
    if shutdown_at_end:
        manager.shutdown()
    else:
        for _ in range(5):  # promotions may cascade fill-on-hit stores: a few rounds
            for tier in tiers:
                tier.deliver()
            take()
        assert loading == set(), "a load of a live request was never reported"
    for ctx in list(contexts.values()):
        manager.on_request_finished(ctx)
    for tier in tiers:
        tier.deliver()
    manager.get_finished()
    assert manager.primary.num_pinned == 0
    assert manager._jobs.in_flight() == 0
    assert manager._held == {} and manager._loads == {}
    for tier in tiers:
        assert len(tier.reported) == len(set(tier.reported)), "a job reported twice"

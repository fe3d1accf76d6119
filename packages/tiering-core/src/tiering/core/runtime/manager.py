"""The tiering manager: the scheduler-side orchestrator of a tier stack.

It answers lookups across the CPU primary tier and the secondary tiers, promotes blocks secondary -> primary for
loads, cascades stores primary -> every secondary tier (write-through), and releases the primary slots' pins as jobs
finish. The flow follows vLLM's ``TieringOffloadingManager`` (``vllm/v1/kv_offload/tiering/manager.py``), with two
rules on top: no request ever waits forever and no exception from a tier escapes (a failed job turns its blocks into
misses, which the engine recomputes); and a block promoted from secondary tier N is also written to tiers 0..N-1
that lack it (fill on hit, as in an inclusive cache hierarchy: a block a local disk lost or never had is fetched
from a remote tier once, not on every primary miss). A found prefix is cut where loading it stops paying: the engine
recomputes the rest (:class:`~tiering.core.policies.costmodel.LoadCostModel`). Keys are scoped to the request's
tenant before any tier sees them (:mod:`tiering.core.policies.tenants`). A tier with an admission policy gets only the
blocks it admits (:mod:`tiering.core.policies.admission`).

All methods run on the scheduler's thread. In a child forked after the manager was built, those that start,
wait for or report work raise :class:`~tiering.core.store.forks.ForkedStackError` and ``shutdown`` does
nothing: build the stack after forking.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections import Counter, defaultdict
from collections.abc import Sequence

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.policies.admission import AdmissionConfig, StackAdmission
from tiering.core.policies.costmodel import LoadCostConfig, LoadCostModel
from tiering.core.policies.pinning import pin_in_tiers
from tiering.core.policies.tenants import caller_allocation, scope_keys
from tiering.core.primary import PRIMARY, Allocation, CPUPrimaryTier
from tiering.core.runtime.cascade import StoreCascade
from tiering.core.runtime.guard import FinishedJob, GuardedTier
from tiering.core.runtime.load_records import JobContext, LoadResult, PendingLoad, record_job
from tiering.core.runtime.metrics import StackMetrics, label_key, tier_labels
from tiering.core.store.forks import ProcessOwner
from tiering.core.store.jobs import JobState, JobTracker

logger = logging.getLogger(__name__)

__all__ = ["PRIMARY", "LoadResult", "TieringManager"]


class TieringManager(StoreCascade):
    """Orchestrates one CPU primary tier and an ordered list of secondary tiers.

    Args:
        primary: the CPU primary tier.
        secondary_tiers: tiers in lookup order (tier 0 first).
        load_cost: the cost model's settings (default: no recompute rate nor ``max_load_s``: nothing is cut).
        block_tokens: tokens per block (what a declined block costs to recompute).
        admission: admission settings per secondary tier (default, and tiers beyond it: ``always``).
    """

    def __init__(
        self,
        primary: CPUPrimaryTier,
        secondary_tiers: Sequence[SecondaryTierManager] = (),
        load_cost: LoadCostConfig | None = None,
        block_tokens: int = 16,
        admission: Sequence[AdmissionConfig] = (),
    ) -> None:
        self.primary = primary
        self.secondary_tiers = list(secondary_tiers)
        self.cost = LoadCostModel(
            load_cost or LoadCostConfig(), len(secondary_tiers), primary.block_bytes, block_tokens
        )
        self._declined_counted: set[str] = set()  # requests whose declines are counted (lookups repeat per step)
        self._job_ids = itertools.count()
        # Jobs submitted to a secondary tier and not yet reported; each is finished exactly once.
        self._jobs = JobTracker(queue_results=False)
        self._owner = ProcessOwner("this tiering stack")
        self._loads: dict[str, PendingLoad] = {}
        self._finished_loads: list[LoadResult] = []
        self._held: dict[str, list[OffloadKey]] = {}
        self.metrics = StackMetrics()
        self._primary_labels = tier_labels("primary", None)
        self._unused_labels = {state: {**self._primary_labels, "state": state} for state in ("reported", "in_flight")}
        self._tier_labels = [tier_labels(t.tier_type, i) for i, t in enumerate(self.secondary_tiers)]
        # Every call into a secondary tier goes through its guard: no exception escapes, each is logged
        # and counted, and the keys whose load failed are remembered per request.
        self._guards = [
            GuardedTier(
                tier,
                f"secondary tier {i} ({tier.tier_type})",
                functools.partial(self.metrics.inc, "tier_errors_total", self._tier_labels[i]),
            )
            for i, tier in enumerate(self.secondary_tiers)
        ]
        self._admission = StackAdmission(admission, self.metrics, self._tier_labels)
        # Label tuples of the per-block lookup counters, made once (scheduler hot path).
        self._lookup_labels = {
            (idx, outcome): label_key({**labels, "outcome": outcome})
            for idx, labels in [(PRIMARY, self._primary_labels), *enumerate(self._tier_labels)]
            for outcome in ("hit", "miss", "in_flight")
        }

    # -- lookup -------------------------------------------------------------
    def lookup(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> int | None:
        """Length of the leading run of ``keys`` worth loading.

        Primary first, then secondary tiers in config order. Keys whose load
        already failed for this request (from any tier) are misses. The run is cut where loading stops
        paying (:meth:`~tiering.core.policies.costmodel.LoadCostModel.plan`; ``loads_declined_total`` counts the rest).

        Returns:
            The run length, or None when a secondary tier's answer for the
            first key not found elsewhere is still pending (ask again).
        """
        self._poll_tiers()
        keys = scope_keys(req_context.tenant, keys)
        failed = [f for g in self._guards if (f := g.failed_keys(req_context.req_id))]
        sources: list[int] = []
        for key in keys:
            if any(key in f for f in failed):
                break
            hit = self.primary.lookup(key)
            self.metrics.inc("lookups_total", self._lookup_labels[PRIMARY, "hit" if hit else "miss"])
            if hit:
                sources.append(PRIMARY)
                continue
            verdict, idx = self._secondary_lookup(key, req_context, record=True)
            if verdict is None:
                return None
            if verdict is False:
                break
            sources.append(idx)
        return self._plan(sources, req_context)

    def _plan(self, sources: list[int], req_context: ReqContext) -> int:
        plan = self.cost.plan(sources, req_context.req_id)
        if plan.declined and req_context.req_id not in self._declined_counted:
            self._declined_counted.add(req_context.req_id)
            for idx, blocks in plan.declined.items():
                self.metrics.inc("loads_declined_total", {**self._tier_labels[idx], "reason": plan.reason}, blocks)
        return plan.serve

    def _secondary_lookup(
        self, key: OffloadKey, req_context: ReqContext, record: bool = False
    ) -> tuple[bool | None, int]:
        pending = False
        for idx, guard in enumerate(self._guards):
            verdict = guard.lookup(key, req_context)
            if record:
                outcome = "in_flight" if verdict is None else "hit" if verdict else "miss"
                self.metrics.inc("lookups_total", self._lookup_labels[idx, outcome])
            if verdict:
                return True, idx
            pending = pending or verdict is None
        return (None if pending else False), -1

    # -- load ---------------------------------------------------------------
    def prepare_load(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Start loading ``keys`` (a run :meth:`lookup` found) into the primary tier.

        Resident blocks are pinned; the others are promoted from the first
        secondary tier holding them, one job per tier. The outcome is
        reported once by :meth:`get_finished` as a :class:`LoadResult`.

        Raises:
            ValueError: a load for this request is already in progress.
        """
        self._owner.check()
        req_id = req_context.req_id
        if req_id in self._loads or req_id in self._held:
            raise ValueError(f"request {req_id!r} already has a load in progress")
        load = PendingLoad(req_context, [], [], [], requested=len(keys), asked=list(keys))
        keys = scope_keys(req_context.tenant, keys)
        # Pin the resident blocks first, so promotions cannot evict them.
        resident = {key: self.primary.pin([key])[0] for key in keys if self.primary.lookup(key)}
        load.pinned.extend(resident)
        per_tier: dict[int, tuple[list[OffloadKey], list[int]]] = defaultdict(lambda: ([], []))
        for key in keys:
            if key in resident:
                load.block_ids.append(resident[key])
                load.sources.append(PRIMARY)
            else:
                verdict, idx = self._secondary_lookup(key, req_context)
                if not verdict:
                    break
                alloc = self.primary.allocate([key])
                if not alloc.block_ids:
                    self.metrics.inc("load_failures_total", {**self._primary_labels, "cause": "no_slot"})
                    break
                per_tier[idx][0].append(key)
                per_tier[idx][1].append(alloc.block_ids[0])
                load.block_ids.append(alloc.block_ids[0])
                load.sources.append(idx)
            load.keys.append(key)
        self._loads[req_id] = load
        self._seen(load.keys, req_context)
        for idx, (tier_keys, block_ids) in per_tier.items():
            job = JobMetadata(next(self._job_ids), tier_keys, block_ids, True, req_context)
            predicted = self.cost.predict(idx, len(tier_keys) * self.primary.block_bytes)
            self._jobs.start(job, JobContext(idx, load, predicted=predicted))
            load.jobs.add(job.job_id)
            self._submit(idx, job)
        self._maybe_finish_load(load)

    def complete_load(self, req_context: ReqContext) -> None:
        """Release the pins of a load reported by :meth:`get_finished` (after the copy to the device)."""
        self.primary.unpin(self._held.pop(req_context.req_id, []))

    def get_finished(self) -> list[LoadResult]:
        """Poll every tier; return the loads that finished since the last call."""
        self._poll_tiers()
        finished, self._finished_loads = self._finished_loads, []
        return finished

    def _maybe_finish_load(self, load: PendingLoad) -> None:
        if load.jobs:
            return
        req_id = load.req_context.req_id
        if load.abandoned:
            # The request ended while this load was in flight: nobody will complete it, so its pins are released here.
            self.primary.unpin(load.pinned)
            load.pinned = []
            return
        del self._loads[req_id]
        n = len(load.keys) if load.failed_at is None else load.failed_at
        # Blocks after a failed one are not usable for this request: unpin them.
        held = load.keys[:n]
        held_set = set(held)
        self.primary.unpin([k for k in load.pinned if k not in held_set])
        self._held[req_id] = held
        self.metrics.inc("blocks_loaded_total", self._primary_labels, len(held))
        self.metrics.inc("loaded_bytes_total", self._primary_labels, len(held) * self.primary.block_bytes)
        self._finished_loads.append(
            LoadResult(load.req_context, load.asked[:n], load.block_ids[:n], load.sources[:n], load.requested)
        )

    # -- store --------------------------------------------------------------
    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> Allocation:
        """Give each absent key a pinned primary slot to be filled by the caller.

        Present keys are only touched. Keys that find every slot pinned are
        reported in ``rejected`` and are simply not stored (:func:`~tiering.core.policies.tenants.caller_allocation`).
        """
        self._poll_tiers()
        scoped = scope_keys(req_context.tenant, keys)
        alloc = self.primary.allocate(scoped, owner=req_context.req_id)  # freed at its end if never completed
        if alloc.present:
            for guard in self._guards:
                guard.touch(alloc.present, req_context)
            self._seen(alloc.present, req_context)
        if alloc.rejected:
            labels = {**self._primary_labels, "cause": "no_slot"}
            self.metrics.inc("store_failures_total", labels, len(alloc.rejected))
        return caller_allocation(req_context.tenant, alloc, scoped, keys)

    def complete_store(self, keys: Sequence[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Mark slots from :meth:`prepare_store` written and cascade them to every secondary tier.

        Each tier gets one job with the keys it does not already hold
        (its :meth:`~tiering.core.base.SecondaryTierManager.lookup` is not
        True); the keys it holds are touched instead.
        """
        self._owner.check()
        keys = scope_keys(req_context.tenant, keys)
        self.primary.complete_write(keys, success)
        if not success or not keys:
            return
        self.metrics.inc("blocks_stored_total", self._primary_labels, len(keys))
        self.metrics.inc("stored_bytes_total", self._primary_labels, len(keys) * self.primary.block_bytes)
        self._seen(keys, req_context, write_resident=False)
        self._cascade(keys, req_context, range(len(self.secondary_tiers)), "store")

    def pin(self, keys: Sequence[OffloadKey], ttl_s: float, tenant: str = "") -> list[bool]:
        """Pin ``tenant``'s ``keys`` in every secondary tier: per tier, whether it did (:func:`pin_in_tiers`)."""
        return pin_in_tiers(self.secondary_tiers, scope_keys(tenant, keys), ttl_s)

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Record a use of ``keys`` in every tier."""
        self._owner.check()
        keys = scope_keys(req_context.tenant, keys)
        self.primary.touch(keys)
        for guard in self._guards:
            guard.touch(keys, req_context)

    # -- jobs ---------------------------------------------------------------
    def _poll_tiers(self) -> None:
        self._owner.check()  # every other public method starts here: a forked child's copy fails at once
        for idx, guard in enumerate(self._guards):
            for finished in guard.get_finished():
                self._on_result(idx, finished)

    def _on_result(self, idx: int, finished: FinishedJob) -> None:
        meta = finished.job
        state = self._jobs.get(meta.job_id)
        if state is None or state.meta is not meta:  # the guard returns only jobs it was given: a defect
            logger.error("secondary tier %d reported unknown job %d; ignored", idx, meta.job_id)
            return
        if self._jobs.report(JobResult(meta.job_id, finished.success, finished.loaded or None)) is None:
            return
        ctx: JobContext = state.context
        self._record_job(idx, state, finished.success)
        if not meta.is_promotion:
            self.primary.unpin(meta.keys)
            return
        load = ctx.load
        assert load is not None
        load.jobs.discard(meta.job_id)
        kept = set(meta.keys) if finished.success else set(finished.loaded)
        ok = [key for key in meta.keys if key in kept]
        failed = [key for key in meta.keys if key not in kept]
        self.primary.complete_write(ok, True, "promotion")
        self.primary.complete_write(failed, False)
        self.primary.pin(ok, record_access=False)
        load.pinned.extend(ok)
        if failed:
            first = min(load.keys.index(k) for k in failed)
            load.failed_at = first if load.failed_at is None else min(load.failed_at, first)
        if ok and idx > 0:
            self._cascade(ok, meta.req_context, range(idx), "fill")  # fill the tiers above the one that had them
        self._maybe_finish_load(load)

    def _record_job(self, idx: int, job: JobState, success: bool) -> None:
        block_bytes = self.primary.block_bytes
        seconds = record_job(self.metrics, self._tier_labels[idx], job.meta, job.context, success, block_bytes)
        if success and job.meta.is_promotion:
            # A failed load says nothing of the tier's speed: only whole loads measure it.
            self.cost.observe(idx, len(job.meta.keys) * block_bytes, seconds)

    def in_flight_jobs(self) -> dict[int, int]:
        """Jobs submitted and not yet reported, per secondary tier index."""
        return dict(Counter(state.context.tier_idx for state in self._jobs.in_flight_states()))

    # -- lifecycle ----------------------------------------------------------
    def on_request_finished(self, req_context: ReqContext) -> None:
        """Forget per-request state and release every pin taken for the request.

        A finished load not yet completed is released (no longer reported by :meth:`get_finished`); a load
        in flight is abandoned: its pins are released when its last job is reported (or at :meth:`shutdown`),
        and it is never reported. Both count their blocks in ``loads_unused_blocks_total`` (``state``
        ``reported`` / ``in_flight``). Slots from :meth:`prepare_store` never completed by
        :meth:`complete_store` are freed.
        """
        req_id = req_context.req_id
        self.primary.release(req_id)
        self._declined_counted.discard(req_id)
        if self._held.get(req_id):
            self.metrics.inc("loads_unused_blocks_total", self._unused_labels["reported"], len(self._held[req_id]))
        self.complete_load(req_context)
        if any(r.req_context.req_id == req_id for r in self._finished_loads):
            self._finished_loads = [r for r in self._finished_loads if r.req_context.req_id != req_id]
        load = self._loads.pop(req_id, None)
        if load is not None:
            load.abandoned = True
            self.metrics.inc("loads_unused_blocks_total", self._unused_labels["in_flight"], len(load.keys))
        for guard in self._guards:
            guard.on_request_finished(req_context)

    def has_pending_work(self) -> bool:
        """Whether any job is still in flight (polls the tiers first, so a wait loop on it ends)."""
        self._poll_tiers()
        return self._jobs.in_flight() > 0

    def shutdown(self) -> None:
        """Shut down every secondary tier (each reports or fails its jobs first), then release every pin.

        A job a tier did not report by then counts as failed (a report
        arriving later is ignored as unknown); loads finished and not yet
        completed are released.
        """
        if self._owner.forked:
            return  # a forked child's copy: the tiers' threads, files and connections are the parent's
        for guard in self._guards:
            guard.shutdown()
        # Lowest tier first: the fills a promotion from tier N still starts for tiers 0..N-1 are failed with them.
        for idx in reversed(range(len(self._guards))):
            for finished in self._guards[idx].fail_unreported():
                self._on_result(idx, finished)
        for req_id in list(self._held):
            self.primary.unpin(self._held.pop(req_id))
        self._finished_loads = []

"""The tiering manager: the scheduler-side orchestrator of a tier stack.

It answers lookups across the CPU primary tier and the secondary tiers,
promotes blocks secondary -> primary for loads, cascades stores primary ->
every secondary tier (write-through), and releases the primary slots' pins
as jobs finish. The flow follows vLLM's ``TieringOffloadingManager``
(``vllm/v1/kv_offload/tiering/manager.py``), with one rule on top: no
request ever waits forever and no exception from a tier escapes. A failed
job turns its blocks into misses (the engine recomputes them).

All methods run on the scheduler's thread.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import defaultdict
from collections.abc import Sequence

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.primary import Allocation, CPUPrimaryTier

logger = logging.getLogger(__name__)

PRIMARY = -1
"""The source index of blocks that were already in the primary tier."""


@dataclasses.dataclass
class LoadResult:
    """A finished load: the leading run of blocks now readable in the primary tier.

    Attributes:
        req_context: the request.
        keys: the loaded blocks, a prefix of the keys given to
            :meth:`TieringManager.prepare_load` (shorter when a promotion
            failed: the rest are misses to recompute).
        block_ids: primary slot of each key, pinned until
            :meth:`TieringManager.complete_load`.
        sources: per key, :data:`PRIMARY` or the index of the secondary tier
            it was promoted from.
        requested: how many keys were asked for.
    """

    req_context: ReqContext
    keys: list[OffloadKey]
    block_ids: list[int]
    sources: list[int]
    requested: int


@dataclasses.dataclass
class _PendingLoad:
    req_context: ReqContext
    keys: list[OffloadKey]
    block_ids: list[int]
    sources: list[int]
    requested: int
    jobs: set[int] = dataclasses.field(default_factory=set)
    pinned: list[OffloadKey] = dataclasses.field(default_factory=list)
    failed_at: int | None = None


@dataclasses.dataclass
class _Job:
    tier_idx: int
    meta: JobMetadata
    load: _PendingLoad | None = None


class TieringManager:
    """Orchestrates one CPU primary tier and an ordered list of secondary tiers.

    Args:
        primary: the CPU primary tier.
        secondary_tiers: tiers in lookup order (tier 0 first).
    """

    def __init__(self, primary: CPUPrimaryTier, secondary_tiers: Sequence[SecondaryTierManager] = ()) -> None:
        self.primary = primary
        self.secondary_tiers = list(secondary_tiers)
        self._job_ids = itertools.count()
        self._jobs: dict[int, _Job] = {}
        self._loads: dict[str, _PendingLoad] = {}
        self._finished_loads: list[LoadResult] = []
        self._held: dict[str, list[OffloadKey]] = {}
        self._failed_keys: dict[str, set[OffloadKey]] = defaultdict(set)
        self.counters: dict[str, int] = defaultdict(int)

    # -- lookup -------------------------------------------------------------
    def lookup(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> int | None:
        """Length of the leading run of ``keys`` found in any tier.

        Primary first, then secondary tiers in config order. Keys whose load
        already failed for this request are misses.

        Returns:
            The run length, or None when a secondary tier's answer for the
            first key not found elsewhere is still pending (ask again).
        """
        self._poll_tiers()
        failed = self._failed_keys.get(req_context.req_id, ())
        for n, key in enumerate(keys):
            if key in failed:
                return n
            if self.primary.lookup(key):
                continue
            verdict = self._secondary_lookup(key, req_context)[0]
            if verdict is None:
                return None
            if verdict is False:
                return n
        return len(keys)

    def _secondary_lookup(self, key: OffloadKey, req_context: ReqContext) -> tuple[bool | None, int]:
        pending = False
        for idx, tier in enumerate(self.secondary_tiers):
            try:
                verdict = tier.lookup(key, req_context)
            except Exception:
                logger.exception("secondary tier %d (%s) lookup raised; treated as a miss", idx, tier.tier_type)
                self.counters["tier_errors"] += 1
                verdict = False
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
        req_id = req_context.req_id
        if req_id in self._loads or req_id in self._held:
            raise ValueError(f"request {req_id!r} already has a load in progress")
        load = _PendingLoad(req_context, [], [], [], requested=len(keys))
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
                    self.counters["promotion_no_slot"] += 1
                    break
                per_tier[idx][0].append(key)
                per_tier[idx][1].append(alloc.block_ids[0])
                load.block_ids.append(alloc.block_ids[0])
                load.sources.append(idx)
            load.keys.append(key)
        self._loads[req_id] = load
        for idx, (tier_keys, block_ids) in per_tier.items():
            job = JobMetadata(next(self._job_ids), tier_keys, block_ids, True, req_context)
            self._jobs[job.job_id] = _Job(idx, job, load)
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

    def _maybe_finish_load(self, load: _PendingLoad) -> None:
        if load.jobs:
            return
        req_id = load.req_context.req_id
        del self._loads[req_id]
        n = len(load.keys) if load.failed_at is None else load.failed_at
        # Blocks after a failed one are not usable for this request: unpin them.
        held = load.keys[:n]
        held_set = set(held)
        self.primary.unpin([k for k in load.pinned if k not in held_set])
        self._held[req_id] = held
        self._finished_loads.append(
            LoadResult(load.req_context, load.keys[:n], load.block_ids[:n], load.sources[:n], load.requested)
        )

    # -- store --------------------------------------------------------------
    def prepare_store(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> Allocation:
        """Give each absent key a pinned primary slot to be filled by the caller.

        Present keys are only touched. Keys that find every slot pinned are
        reported in ``rejected`` and are simply not stored.
        """
        self._poll_tiers()
        alloc = self.primary.allocate(keys)
        if alloc.present:
            self._touch_secondaries(alloc.present, req_context)
        self.counters["store_rejected"] += len(alloc.rejected)
        return alloc

    def complete_store(self, keys: Sequence[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Mark slots from :meth:`prepare_store` written and cascade them to every secondary tier."""
        self.primary.complete_write(keys, success)
        if not success or not keys:
            return
        for idx in range(len(self.secondary_tiers)):
            block_ids = self.primary.pin(keys, record_access=False)
            job = JobMetadata(next(self._job_ids), list(keys), block_ids, False, req_context)
            self._jobs[job.job_id] = _Job(idx, job)
            self._submit(idx, job)

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Record a use of ``keys`` in every tier."""
        self.primary.touch(keys)
        self._touch_secondaries(keys, req_context)

    def _touch_secondaries(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        for idx, tier in enumerate(self.secondary_tiers):
            try:
                tier.touch(keys, req_context)
            except Exception:
                logger.exception("secondary tier %d (%s) touch raised", idx, tier.tier_type)

    # -- jobs ---------------------------------------------------------------
    def _submit(self, idx: int, job: JobMetadata) -> None:
        tier = self.secondary_tiers[idx]
        try:
            (tier.submit_load if job.is_promotion else tier.submit_store)(job)
        except Exception:
            logger.exception("secondary tier %d (%s) failed to accept job %d", idx, tier.tier_type, job.job_id)
            self._on_result(idx, JobResult(job.job_id, False))

    def _poll_tiers(self) -> None:
        for idx, tier in enumerate(self.secondary_tiers):
            try:
                results = list(tier.get_finished())
            except Exception:
                logger.exception("secondary tier %d (%s) get_finished raised", idx, tier.tier_type)
                continue
            for result in results:
                self._on_result(idx, result)

    def _on_result(self, idx: int, result: JobResult) -> None:
        job = self._jobs.pop(result.job_id, None)
        if job is None or job.tier_idx != idx:
            logger.error("secondary tier %d reported unknown job %d; ignored", idx, result.job_id)
            if job is not None:
                self._jobs[result.job_id] = job
            return
        meta = job.meta
        if not meta.is_promotion:
            self.primary.unpin(meta.keys)
            if result.success:
                self.counters[f"tier{idx}_blocks_stored"] += len(meta.keys)
            else:
                self.counters[f"tier{idx}_store_failed"] += 1
            return
        self.primary.complete_write(meta.keys, result.success)
        load = job.load
        assert load is not None
        load.jobs.discard(meta.job_id)
        if result.success:
            self.primary.pin(meta.keys, record_access=False)
            load.pinned.extend(meta.keys)
            self.counters[f"tier{idx}_blocks_loaded"] += len(meta.keys)
        else:
            self.counters[f"tier{idx}_load_failed"] += 1
            self._failed_keys[meta.req_context.req_id].update(meta.keys)
            first = min(load.keys.index(k) for k in meta.keys)
            load.failed_at = first if load.failed_at is None else min(load.failed_at, first)
        self._maybe_finish_load(load)

    # -- lifecycle ----------------------------------------------------------
    def on_request_finished(self, req_context: ReqContext) -> None:
        """Forget per-request state (failed keys; pins of an uncompleted load)."""
        self._failed_keys.pop(req_context.req_id, None)
        self.complete_load(req_context)
        for tier in self.secondary_tiers:
            try:
                tier.on_request_finished(req_context)
            except Exception:
                logger.exception("secondary tier %s on_request_finished raised", tier.tier_type)

    def has_pending_work(self) -> bool:
        """Whether any job is still in flight."""
        return bool(self._jobs)

    def shutdown(self) -> None:
        """Shut down every secondary tier (each reports or fails its jobs first)."""
        for tier in self.secondary_tiers:
            try:
                tier.shutdown()
            except Exception:
                logger.exception("secondary tier %s shutdown raised", tier.tier_type)
        self._poll_tiers()

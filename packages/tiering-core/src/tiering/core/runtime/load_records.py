"""The records of a load through the tier stack, in flight and finished.

:class:`~tiering.core.runtime.manager.TieringManager` keeps one :class:`PendingLoad`
per request while its promotions run, one :class:`JobContext` beside each job
it submitted to a secondary tier, and reports each finished load once as a
:class:`LoadResult`.
"""

from __future__ import annotations

import dataclasses
import time

from tiering.core.base import JobMetadata, OffloadKey, ReqContext
from tiering.core.runtime.metrics import StackMetrics


@dataclasses.dataclass
class LoadResult:
    """A finished load: the leading run of blocks now readable in the primary tier.

    Attributes:
        req_context: the request.
        keys: the loaded blocks (as the caller named them), a prefix of the keys given to
            :meth:`~tiering.core.runtime.manager.TieringManager.prepare_load` (shorter when a promotion
            failed: the rest are misses to recompute).
        block_ids: primary slot of each key, pinned until
            :meth:`~tiering.core.runtime.manager.TieringManager.complete_load`.
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
class PendingLoad:
    """A load in flight: what :meth:`~tiering.core.runtime.manager.TieringManager.prepare_load` started, per request.

    Attributes:
        req_context: the request.
        keys: the keys being loaded (a prefix of those asked for).
        block_ids: primary slot of each key.
        sources: per key, :data:`PRIMARY` or the secondary tier index it is promoted from.
        requested: how many keys were asked for.
        asked: the keys asked for, as the caller named them (``keys`` holds
            their tenant-scoped names, :mod:`tiering.core.policies.tenants`).
        jobs: ids of the promotion jobs not yet reported.
        pinned: keys pinned for this load (released exactly once).
        failed_at: index of the first key whose promotion failed, None while none did.
        abandoned: the request ended while a promotion was in flight.
    """

    req_context: ReqContext
    keys: list[OffloadKey]
    block_ids: list[int]
    sources: list[int]
    requested: int
    asked: list[OffloadKey] = dataclasses.field(default_factory=list)
    jobs: set[int] = dataclasses.field(default_factory=set)
    pinned: list[OffloadKey] = dataclasses.field(default_factory=list)
    failed_at: int | None = None
    abandoned: bool = False  # the request ended while a promotion was in flight


@dataclasses.dataclass
class JobContext:
    """What the manager keeps beside a submitted job (the :class:`~tiering.core.store.jobs.JobState`'s ``context``).

    Attributes:
        tier_idx: the secondary tier the job went to.
        load: the load a promotion job belongs to (None for a store).
        predicted: a load's predicted duration in seconds (the cost model's), None when not measured yet.
        submitted: :func:`time.monotonic` seconds at submission.
    """

    tier_idx: int
    load: PendingLoad | None = None
    predicted: float | None = None
    submitted: float = dataclasses.field(default_factory=time.monotonic)


def record_job(
    metrics: StackMetrics,
    labels: dict[str, str],
    meta: JobMetadata,
    context: JobContext,
    success: bool,
    block_bytes: int,
) -> float:
    """Count a finished job of one secondary tier (``labels``) in ``metrics``; returns its duration, seconds.

    Every job counts in ``jobs_total`` and its kind's duration histogram; a
    successful one also in the blocks and bytes it moved, and a successful load
    beside the cost model's prediction of it.
    """
    kind = "load" if meta.is_promotion else "store"
    metrics.inc("jobs_total", {**labels, "kind": kind, "outcome": "ok" if success else "failed"})
    seconds = time.monotonic() - context.submitted
    metrics.observe(f"{kind}_duration_seconds", labels, seconds)
    if success:
        if meta.is_promotion and context.predicted is not None:
            metrics.observe("load_predicted_seconds", labels, context.predicted)
            metrics.observe("load_prediction_ratio", labels, seconds / max(context.predicted, 1e-9))
        done = "loaded" if meta.is_promotion else "stored"
        metrics.inc(f"blocks_{done}_total", labels, len(meta.keys))
        metrics.inc(f"{done}_bytes_total", labels, len(meta.keys) * block_bytes)
    elif kind == "store":
        metrics.inc("store_job_failed_blocks_total", labels, len(meta.keys))
    return seconds

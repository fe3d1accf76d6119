"""The write-through half of the tiering manager: resident blocks cascaded to the secondary tiers that lack them.

A block stored in the primary tier (``store``), loaded from a lower tier (``fill``: written to the tiers above it)
or, for a tier with ``second_sighting`` admission, seen again while resident (``resighted``) is offered to each
tier: one the tier already holds is touched (``held``), the rest goes through the tier's admission policy into one
store job. ``store_offers_total`` counts the offers by origin and outcome, so a report can account for every
primary store; :meth:`StoreCascade.in_flight_store_blocks` gives the blocks of the store jobs not yet reported.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

from tiering.core.base import JobMetadata, OffloadKey, ReqContext
from tiering.core.policies.admission import StackAdmission
from tiering.core.primary import CPUPrimaryTier
from tiering.core.runtime.guard import GuardedTier
from tiering.core.runtime.load_records import JobContext
from tiering.core.runtime.metrics import StackMetrics
from tiering.core.store.jobs import JobTracker

__all__ = ["StoreCascade"]


class StoreCascade:
    """The cascade of :class:`~tiering.core.runtime.manager.TieringManager`, which sets the attributes below."""

    primary: CPUPrimaryTier
    metrics: StackMetrics
    _guards: list[GuardedTier]
    _admission: StackAdmission
    _tier_labels: list[dict[str, str]]
    _jobs: JobTracker
    _job_ids: itertools.count[int]

    def in_flight_store_blocks(self) -> dict[int, int]:
        """Blocks of the store jobs submitted and not yet reported, per secondary tier index."""
        out: Counter[int] = Counter()
        for state in self._jobs.in_flight_states():
            if not state.meta.is_promotion:
                out[state.context.tier_idx] += len(state.meta.keys)
        return dict(out)

    def _cascade(self, keys: Sequence[OffloadKey], req_context: ReqContext, tier_indices: range, origin: str) -> None:
        """Write resident ``keys`` to each tier of ``tier_indices`` that lacks them (one job per tier).

        ``origin`` labels the offers in ``store_offers_total``: ``"store"`` (a primary store) or ``"fill"`` (blocks
        loaded from a lower tier, written to the tiers above it).
        """
        for idx in tier_indices:
            # A block whose load from this tier failed for the request, or whose lookup raised, is stored again.
            held_set = {key for key in keys if self._guards[idx].lookup(key, req_context) is True}
            held = [key for key in keys if key in held_set]
            missing = [key for key in keys if key not in held_set]
            if held:
                self._guards[idx].touch(held, req_context)
            self._count_offers(idx, origin, held=len(held), offered=len(missing))
            self._write(idx, missing, req_context)

    def _count_offers(self, idx: int, origin: str, held: int, offered: int) -> None:
        """Count blocks offered to tier ``idx``: ``held`` (it had them, touched), ``offered`` (to write)."""
        for outcome, blocks in (("held", held), ("offered", offered)):
            if blocks:
                self.metrics.inc(
                    "store_offers_total", {**self._tier_labels[idx], "origin": origin, "outcome": outcome}, blocks
                )

    def _write(self, idx: int, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Store in tier ``idx`` (one job) the resident ``keys`` its admission policy lets through."""
        keys = self._admission.admit(idx, keys)
        if not keys:
            return
        block_ids = self.primary.pin(keys, record_access=False)
        job = JobMetadata(next(self._job_ids), keys, block_ids, False, req_context)
        self._jobs.start(job, JobContext(idx))
        self._submit(idx, job)

    def _submit(self, idx: int, job: JobMetadata) -> None:
        # A refused job is reported failed by the next poll, once the caller's records of it are complete.
        self._guards[idx].submit(job)

    def _seen(self, keys: Sequence[OffloadKey], req_context: ReqContext, write_resident: bool = True) -> None:
        """A request used ``keys``: count a sighting; ``write_resident``: offer those in the primary tier again."""
        for idx in self._admission.seen(keys):  # a tier that holds a block, or is still writing it, is not offered it
            ready = [k for k in keys if write_resident and self.primary.lookup(k)]
            offered = [k for k in ready if self._guards[idx].lookup(k, req_context) is False]
            self._count_offers(idx, "resighted", held=0, offered=len(offered))
            self._write(idx, offered, req_context)

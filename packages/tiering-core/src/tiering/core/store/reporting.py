"""What a tier reports to the scheduler, answered from the toolkit's job tracker and event log.

Every toolkit-based tier keeps its jobs in a :class:`~tiering.core.store.jobs.JobTracker`
and its KV events in a :class:`~tiering.core.events.KVEventLog`, so three of the
:class:`~tiering.core.base.SecondaryTierManager` methods are the same one-liners in each:
:class:`JobReporting` holds them once.
"""

from __future__ import annotations

from collections.abc import Iterable

from tiering.core.base import JobResult
from tiering.core.events import KVEvent, KVEventLog
from tiering.core.store.jobs import JobTracker


class JobReporting:
    """``get_finished`` / ``has_pending_work`` / ``take_events`` of a tier with ``jobs`` and ``events`` attributes.

    List it before :class:`~tiering.core.base.SecondaryTierManager` in the tier's bases, e.g.
    ``class MyTier(JobReporting, SecondaryTierManager)``, and set ``self.jobs`` (a
    :class:`~tiering.core.store.jobs.JobTracker`) and ``self.events`` (a
    :class:`~tiering.core.events.KVEventLog`) in ``__init__``.
    """

    jobs: JobTracker
    events: KVEventLog

    def get_finished(self) -> Iterable[JobResult]:
        """The jobs finished since the last call, each exactly once (thread safe)."""
        return self.jobs.take_finished()

    def has_pending_work(self) -> bool:
        """Whether a job is queued or running."""
        return self.jobs.in_flight() > 0

    def take_events(self) -> list[KVEvent]:
        """``BlockStored`` for blocks this tier wrote, ``BlockRemoved`` for those it removed or found gone."""
        return self.events.take_events()

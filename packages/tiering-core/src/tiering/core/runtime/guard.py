"""A guard around one secondary tier: no exception of the tier escapes, a failed load is not retried.

:class:`GuardedTier` is what the tiering manager
(:class:`~tiering.core.runtime.manager.TieringManager`) and the vLLM binding
(:class:`~tiering.core.vllm.tier.TieringSecondaryTier`) call instead of a
tier. Every call into the tier is guarded the same way:

==========================  =====================================================
the tier raises in          the caller sees
==========================  =====================================================
``lookup``                  False (a miss)
``submit_store/_load``      the job reported failed by the next :meth:`~GuardedTier.get_finished`
``get_finished``            no result this time; the jobs stay in flight
``take_events``, ``stats``  nothing (``[]``, ``{}``)
anything else               nothing
==========================  =====================================================

Each exception is logged once (with its traceback) and counted
(:attr:`GuardedTier.errors`, plus the owner's ``on_error`` callback).

A job the tier refused is reported on the next poll, never from inside the
submit call: the caller's bookkeeping for a job (a load record, say) is
complete before its result can arrive, so a result is acted on exactly once.
A tier whose ``get_finished`` raises keeps its jobs in flight: their primary
slots cannot be handed to anyone else while the tier may still write into
them.

Per request, the guard remembers the keys whose load failed in this tier:
they are misses for the rest of the request (else a tier that still answers
True would be asked to load the same block again at every step).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.capabilities import take_events

logger = logging.getLogger(__name__)

__all__ = ["FinishedJob", "GuardedTier"]


@dataclasses.dataclass(frozen=True)
class FinishedJob:
    """A job the tier reported (or the guard failed for it), checked against what was submitted.

    Attributes:
        job: the job as submitted.
        success: whether every block moved (and, for a load, verified).
        loaded: for a failed load, the job's keys that reached the primary
            tier anyway, in job order (a subset of ``job.keys``); empty for
            a success and for a store.
    """

    job: JobMetadata
    success: bool
    loaded: list[OffloadKey]


class GuardedTier:
    """One secondary tier behind a guard (see the module doc). Called from one thread (the scheduler's).

    Args:
        tier: the tier.
        label: how logs name the tier (e.g. ``"secondary tier 0 (fs)"``).
        on_error: called once per exception of the tier (e.g. to count a metric).

    Attributes:
        tier: the tier.
        errors: exceptions of the tier so far, plus results it reported for jobs it never got.
    """

    def __init__(self, tier: SecondaryTierManager, label: str, on_error: Callable[[], None] | None = None) -> None:
        self.tier = tier
        self.label = label
        self.errors = 0
        self._on_error = on_error
        # Every job submitted and not yet returned by get_finished, by id.
        self._in_flight: dict[int, JobMetadata] = {}
        # Results taken from the tier (or made for a refused job), not yet returned by get_finished.
        self._ready: list[JobResult] = []
        # Keys whose load failed, per request id.
        self._failed: dict[str, set[OffloadKey]] = {}
        # Loads in flight whose request already ended: their failed keys are not remembered.
        self._orphans: set[int] = set()

    def _error(self, what: str, *args: Any) -> None:
        """Log the exception being handled (once) and count it."""
        logger.exception("%s: " + what, self.label, *args)
        self.errors += 1
        if self._on_error is not None:
            self._on_error()

    # -- lookups ------------------------------------------------------------------------------
    def failed_keys(self, req_id: str) -> Collection[OffloadKey]:
        """The keys whose load from this tier failed for request ``req_id`` (empty when none)."""
        return self._failed.get(req_id, ())

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """The tier's verdict (True present, False absent, None in flight); False for a key whose load failed
        for this request, and when the tier raises.
        """  # noqa: D205
        failed = self._failed.get(req_context.req_id)
        if failed is not None and key in failed:
            return False
        try:
            return self.tier.lookup(key, req_context)
        except Exception:
            self._error("lookup raised; treated as a miss")
            return False

    # -- jobs ---------------------------------------------------------------------------------
    def submit(self, job: JobMetadata) -> None:
        """Hand ``job`` to the tier (``submit_load`` for a promotion, else ``submit_store``).

        When the tier raises, the job is reported failed by the next :meth:`get_finished`.
        """
        self._in_flight[job.job_id] = job
        try:
            (self.tier.submit_load if job.is_promotion else self.tier.submit_store)(job)
        except Exception:
            self._error("refused job %d; reported failed", job.job_id)
            self._ready.append(JobResult(job.job_id, False))

    def refuse(self, job: JobMetadata) -> None:
        """Report ``job`` failed by the next :meth:`get_finished` without handing it to the tier.

        For a job its caller will not run (the vLLM binding's request with an
        unusable tenant): it is in flight and reported exactly like a job the tier refused.
        """
        self._in_flight[job.job_id] = job
        self._ready.append(JobResult(job.job_id, False))

    def poll(self) -> None:
        """Take the tier's finished results (kept for :meth:`get_finished`)."""
        try:
            self._ready.extend(self.tier.get_finished())
        except Exception:
            self._error("get_finished raised; its jobs stay in flight")

    def get_finished(self) -> list[FinishedJob]:
        """The jobs finished since the last call, each exactly once, with what they moved.

        A result for a job id the guard did not submit (or already returned)
        is dropped with an error log; ``successful_keys`` outside the job are
        dropped the same way. The keys a failed load did not deliver become
        misses of :meth:`lookup` for the rest of the job's request.
        """
        self.poll()
        ready, self._ready = self._ready, []
        finished = []
        for result in ready:
            job = self._in_flight.pop(result.job_id, None)
            if job is None:
                self.errors += 1
                logger.error("%s reported unknown job %d; dropped", self.label, result.job_id)
                continue
            loaded = self._loaded(job, result)
            orphan = result.job_id in self._orphans
            self._orphans.discard(result.job_id)
            if job.is_promotion and not result.success and not orphan:
                failed = set(job.keys).difference(loaded)
                self._failed.setdefault(job.req_context.req_id, set()).update(failed)
            finished.append(FinishedJob(job, bool(result.success), loaded))
        return finished

    def _loaded(self, job: JobMetadata, result: JobResult) -> list[OffloadKey]:
        """The keys of a failed load that reached the primary tier anyway (none for a success or a store)."""
        if result.success or not job.is_promotion or not result.successful_keys:
            return []
        named = {bytes(k) for k in result.successful_keys}
        loaded = [key for key in job.keys if key in named]
        if len(loaded) != len(named):
            self.errors += 1
            logger.error("%s reported successful keys outside job %d; ignored", self.label, job.job_id)
        return loaded

    def in_flight(self) -> int:
        """Jobs submitted and not yet returned by :meth:`get_finished`."""
        return len(self._in_flight)

    def unreported(self) -> int:
        """Jobs submitted whose result was not taken from the tier yet (call :meth:`poll` first)."""
        reported = {r.job_id for r in self._ready}
        return sum(1 for job_id in self._in_flight if job_id not in reported)

    def fail_unreported(self) -> list[FinishedJob]:
        """After the tier's shutdown: every job it did not report counts as failed (logged); all results.

        A report arriving later is dropped as unknown.
        """
        self.poll()
        reported = {r.job_id for r in self._ready}
        for job_id in self._in_flight:
            if job_id not in reported:
                logger.error("%s did not report job %d by shutdown; counted as failed", self.label, job_id)
                self._ready.append(JobResult(job_id, False))
        return self.get_finished()

    # -- everything else ----------------------------------------------------------------------
    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Forward a use of ``keys``."""
        try:
            self.tier.touch(keys, req_context)
        except Exception:
            self._error("touch raised")

    def on_new_request(self, req_context: ReqContext) -> None:
        """Forward the start of a request."""
        try:
            self.tier.on_new_request(req_context)
        except Exception:
            self._error("on_new_request raised")

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Forget the request's failed keys (also those of its loads still in flight) and forward the end."""
        req_id = req_context.req_id
        self._failed.pop(req_id, None)
        self._orphans.update(
            job_id for job_id, job in self._in_flight.items() if job.is_promotion and job.req_context.req_id == req_id
        )
        try:
            self.tier.on_request_finished(req_context)
        except Exception:
            self._error("on_request_finished raised")

    def take_events(self) -> Iterable[Any]:
        """The tier's KV events since the last call; none when it raises."""
        try:
            return take_events(self.tier)
        except Exception:
            self._error("take_events raised")
            return []

    def stats(self) -> dict[str, Any]:
        """The tier's ``stats()``; empty when it raises."""
        try:
            return dict(self.tier.stats())
        except Exception:
            self._error("stats raised")
            return {}

    def shutdown(self) -> None:
        """Shut the tier down (it reports or fails its jobs first)."""
        try:
            self.tier.shutdown()
        except Exception:
            self._error("shutdown raised")

"""Job tracking: per-job block outcomes, each job reported exactly once.

A tier splits every :class:`~tiering.core.base.JobMetadata` into blocks that
its worker threads move; :class:`JobTracker` collects the blocks' outcomes
and turns the last one into the job's single
:class:`~tiering.core.base.JobResult`. The scheduler thread drains finished
jobs with :meth:`JobTracker.take_finished` (the tier's ``get_finished``).

Locking: a worker records the outcomes of all blocks it moved for one job in
one call (:meth:`JobState.record`), which takes that job's own lock once;
the tracker's lock is taken once per job, when it finishes. So a job of 16
blocks moved by one worker costs two lock rounds, not 16 or more. The
scheduler thread's calls take no lock (:meth:`JobTracker.start`: one atomic
``dict.setdefault``; :meth:`JobTracker.take_finished`: deque pops), so it
never waits for a worker that holds the tracker's lock (on few cores such a
wait costs a GIL hand-off and a context switch).

The per-job state follows vLLM's fs tier (``vllm/v1/kv_offload/tiering/fs/thread_pool.py``,
``JobState.task_done``), extended with per-block outcomes (a failed load reports the keys it did
verify, ``successful_keys``) and exactly-once reporting under shutdown. :class:`JobReporting`
answers a tier's ``get_finished`` / ``has_pending_work`` / ``take_events`` from its tracker and event log.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Iterable
from typing import Any

from tiering.core.base import JobMetadata, JobResult, OffloadKey
from tiering.core.events import KVEvent, KVEventLog
from tiering.core.store.forks import ProcessOwner
from tiering.core.store.stats import VERIFY_CAUSES

logger = logging.getLogger(__name__)

SHUTDOWN = "shutdown"
"""The failure cause of blocks that never ran because the tier shut down (not counted as a failure cause)."""

_UNRECORDED, _MOVED, _FAILED = 0, 1, 2
"""A block's entry in :class:`JobState`'s outcome book."""


class JobState:
    """The outcome book of one job; created by :meth:`JobTracker.start`.

    Worker threads call :meth:`record` (or :meth:`block_done`) once per block index; the call that completes the
    job hands the result to the tracker. A block recorded twice, or after the job was reported, is ignored (and
    logged): the job is reported exactly once.

    Built on the scheduler thread for every job, it allocates only its lock and one slot per block (causes once
    a block failed).

    Attributes:
        meta: the job as submitted.
        context: anything the owner attached at :meth:`JobTracker.start` (the manager's pending load); never read.
    """

    __slots__ = (
        "_causes",
        "_distrusted",
        "_done",
        "_failed_at",
        "_lock",
        "_ok",
        "_remaining",
        "_reported",
        "_tracker",
        "context",
        "meta",
    )

    def __init__(self, tracker: JobTracker, meta: JobMetadata, context: Any = None) -> None:
        n = len(meta.keys)
        self._tracker = tracker
        self.meta = meta
        self.context = context
        self._lock = threading.Lock()
        self._remaining = n
        # Per block: _UNRECORDED, _MOVED (verified for a load) or _FAILED; a bytearray is one allocation that
        # the garbage collector does not track (a list of n slots is a container it walks).
        self._done = bytearray(n)
        self._ok = True
        self._reported = False
        self._failed_at: int | None = None
        self._distrusted = False  # a block failed verification: the rest of the chain is suspect
        self._causes: dict[str, int] | None = None  # cause -> failed blocks, from the first failure on

    @property
    def causes(self) -> collections.Counter[str]:
        """Failed blocks recorded so far per cause (``"checksum"``, ``"io_error"``, ...; a copy)."""
        with self._lock:
            return collections.Counter(self._causes or {})

    @property
    def job_id(self) -> int:
        """The job's id."""
        return self.meta.job_id

    @property
    def failed_at(self) -> int | None:
        """Lowest block index recorded as failed so far, None while none failed (read without locking)."""
        return self._failed_at

    @property
    def finished(self) -> bool:
        """Whether the job's result was handed to the tracker."""
        return self._reported

    def should_skip(self, index: int) -> bool:
        """Whether block ``index`` of a load need not be read: an earlier block failed (never for stores).

        Later blocks are not used (the request recomputes from the failed one); but after a block failed
        verification (:data:`~tiering.core.store.stats.VERIFY_CAUSES`) the rest of the chain is suspect and
        still read, so the tier removes every bad copy and the recompute's stores replace them.
        """
        failed_at = self._failed_at
        return self.meta.is_promotion and failed_at is not None and index > failed_at and not self._distrusted

    def block_done(self, index: int, ok: bool, cause: str = "") -> JobResult | None:
        """Record one block's outcome; see :meth:`record`."""
        return self.record(((index, ok, cause),))

    def record(self, outcomes: Iterable[tuple[int, bool, str]]) -> JobResult | None:
        """Record the outcomes of several blocks of this job under one lock round.

        Args:
            outcomes: ``(block index, ok, cause)`` per block; ``cause`` names
                why a block failed (``"checksum"``, ``"io_error"``, ... or
                :data:`SHUTDOWN`), ``""`` for a success.

        Returns:
            The job's result when this call completed the job (it is also
            queued for :meth:`JobTracker.take_finished`), else None.
        """
        with self._lock:
            if self._reported:
                logger.error("job %d: outcome recorded after the job was reported; ignored", self.meta.job_id)
                return None
            for index, ok, cause in outcomes:
                if self._done[index] != _UNRECORDED:
                    logger.error("job %d: block %d recorded twice; ignored", self.meta.job_id, index)
                    continue
                self._done[index] = _MOVED if ok else _FAILED
                self._remaining -= 1
                if not ok:
                    self._ok = False
                    self._distrusted |= cause in VERIFY_CAUSES  # before _failed_at: should_skip reads both unlocked
                    if self._failed_at is None or index < self._failed_at:
                        self._failed_at = index
                    if cause:
                        self._count_cause(cause, 1)
            if self._remaining > 0:
                return None
            self._reported = True
            result = self._result()
        self._tracker._finish(self, result)
        return result

    def fail_unrecorded(self, indices: Iterable[int], cause: str) -> JobResult | None:
        """Record the blocks of ``indices`` that have no outcome yet as failed (others are left alone).

        For error paths that do not know how far a batch got (an exception
        out of a batch function, a dropped queue).
        """
        with self._lock:
            if self._reported:
                return None
            todo = [(i, False, cause) for i in indices if self._done[i] == _UNRECORDED]
        return self.record(todo) if todo else None

    def fail_rest(self, cause: str = SHUTDOWN) -> JobResult | None:
        """Record every block without an outcome as failed (shutdown, a dropped queue); report the job once.

        Returns:
            The result when this call finished the job, None when it was already finished.
        """
        with self._lock:
            if self._reported:
                return None
            for index, done in enumerate(self._done):
                if done == _UNRECORDED:
                    self._done[index] = _FAILED
                    if self._failed_at is None or index < self._failed_at:
                        self._failed_at = index
                    if cause:
                        self._count_cause(cause, 1)
            self._remaining = 0
            self._ok = self._ok and _FAILED not in self._done
            self._reported = True
            result = self._result()
        self._tracker._finish(self, result)
        return result

    def _count_cause(self, cause: str, n: int) -> None:
        """Count ``n`` failed blocks under ``cause`` (lock held)."""
        if self._causes is None:
            self._causes = {}
        self._causes[cause] = self._causes.get(cause, 0) + n

    def _result(self) -> JobResult:
        if self._ok:
            return JobResult(self.meta.job_id, True)
        successful: list[OffloadKey] | None = None
        if self.meta.is_promotion:
            successful = [key for key, d in zip(self.meta.keys, self._done, strict=True) if d == _MOVED] or None
        return JobResult(self.meta.job_id, False, successful)


class JobTracker:
    """The jobs a tier has accepted and not yet reported, and the results waiting for ``get_finished``.

    Thread safe. Typical use inside a tier::

        state = self.jobs.start(job)            # submit_store / submit_load (scheduler thread)
        ...                                     # worker: move blocks 0..n-1
        state.record([(0, True, ""), (1, False, "io_error")])
        ...
        return self.jobs.take_finished()        # get_finished (scheduler thread)

    Figures for :meth:`stats` (names from :mod:`tiering.core.store.stats`): ``in_flight_jobs``,
    ``store_jobs_failed``, ``load_jobs_failed``, and per failed block ``store_failed_<cause>`` /
    ``load_failed_<cause>`` (:data:`SHUTDOWN` is not counted as a cause).

    Args:
        queue_results: keep finished results for :meth:`take_finished` (a tier); False when the owner acts on
            :meth:`report`'s return value instead (the manager) and never takes them.
    """

    def __init__(self, queue_results: bool = True) -> None:
        self._queue_results = queue_results
        self._lock = threading.Lock()
        self._jobs: dict[int, JobState] = {}
        self._finished: collections.deque[JobResult] = collections.deque()
        self._counters: collections.Counter[str] = collections.Counter()
        self.owner = ProcessOwner("this tier stack")  # a forked child's copy refuses work at once (no hang)

    def start(self, job: JobMetadata, context: Any = None) -> JobState:
        """Register ``job``; a job without blocks finishes at once (successfully).

        Args:
            job: the job as submitted to the tier.
            context: stored as :attr:`JobState.context`.

        Takes no lock: one ``dict.setdefault`` (atomic) registers the job, so
        the scheduler thread never waits here for a worker finishing a job.

        Raises:
            ValueError: a job with the same id is still in flight.
            ForkedStackError: called in a child forked after the tracker was built.
        """
        self.owner.check()
        state = JobState(self, job, context)
        if self._jobs.setdefault(job.job_id, state) is not state:
            raise ValueError(f"job {job.job_id} is already in flight")
        if not job.keys:
            state.record(())
        return state

    def get(self, job_id: int) -> JobState | None:
        """The in-flight job ``job_id``, None when unknown or already finished (no lock: one atomic ``dict.get``)."""
        return self._jobs.get(job_id)

    def report(self, result: JobResult) -> JobState | None:
        """Finish a job from a result produced elsewhere (e.g. a tier's ``get_finished`` seen by the manager).

        Only for jobs whose blocks are not recorded one by one: every block
        gets the job's outcome (a failed load keeps ``result.successful_keys``
        as its successes). The result is queued for :meth:`take_finished` like
        any other.

        Returns:
            The job's state when this call finished it; None when the job is
            unknown or was already reported (a duplicate is never reported twice).
        """
        state = self.get(result.job_id)
        if state is None:
            return None
        keys = state.meta.keys
        if result.success:
            outcomes = [(i, True, "") for i in range(len(keys))]
        else:
            kept = set(result.successful_keys or ()) if state.meta.is_promotion else set()
            outcomes = [(i, key in kept, "" if key in kept else "failed") for i, key in enumerate(keys)]
            if not keys:
                with state._lock:
                    state._ok = False
                return state if state.fail_rest("") is not None else None
        return state if state.record(outcomes) is not None else None

    def _finish(self, state: JobState, result: JobResult) -> None:
        kind = "load" if state.meta.is_promotion else "store"
        with self._lock:
            if self._jobs.pop(state.meta.job_id, None) is None:
                return
            if not result.success:
                self._counters[f"{kind}_jobs_failed"] += 1
            for cause, n in (state._causes or {}).items():  # final: the job is reported, nothing records more
                if cause != SHUTDOWN:
                    self._counters[f"{kind}_failed_{cause}"] += n
            if self._queue_results:
                self._finished.append(result)

    def take_finished(self) -> list[JobResult]:
        """The results of the jobs finished since the last call, each exactly once (oldest first).

        Takes no lock (workers append to a deque, this pops it); thread safe, also with several callers.

        Raises:
            ForkedStackError: called in a child forked after the tracker was built.
        """
        self.owner.check()
        finished = self._finished
        if not finished:
            return []
        out: list[JobResult] = []
        try:
            for _ in range(len(finished)):
                out.append(finished.popleft())
        except IndexError:  # another caller took the rest
            pass
        return out

    def fail_all(self, cause: str = SHUTDOWN) -> list[JobResult]:
        """Finish every in-flight job as failed (at shutdown); outcomes recorded later are ignored.

        In a child forked after the tracker was built it does nothing: the jobs are the parent's.

        Returns:
            The results this call produced (they are also queued for :meth:`take_finished`).
        """
        if self.owner.forked:
            return []
        with self._lock:
            states = list(self._jobs.values())
        results = [state.fail_rest(cause) for state in states]
        return [r for r in results if r is not None]

    def in_flight(self) -> int:
        """Number of jobs accepted and not yet finished (no lock: ``len`` of a dict is atomic).

        Raises:
            ForkedStackError: called in a child forked after the tracker was built.
        """
        self.owner.check()
        return len(self._jobs)

    def in_flight_states(self) -> list[JobState]:
        """A snapshot of the in-flight jobs' states."""
        with self._lock:
            return list(self._jobs.values())

    def stats(self) -> dict[str, int]:
        """``in_flight_jobs``, ``store_jobs_failed``, ``load_jobs_failed``, the per-cause block failures, ``forks``.

        Raises:
            ForkedStackError: called in a child forked after the tracker was built.
        """
        self.owner.check()
        with self._lock:
            out = dict(self._counters)
            out["forks"] = self.owner.forks()
            out.setdefault("store_jobs_failed", 0)
            out.setdefault("load_jobs_failed", 0)
            out["in_flight_jobs"] = len(self._jobs)
        return out


class JobReporting:
    """``get_finished`` / ``has_pending_work`` / ``take_events`` of a tier with ``jobs`` and ``events`` attributes.

    List it first in the bases (``class MyTier(JobReporting, SecondaryTierManager)``) and set
    ``self.jobs`` (a :class:`JobTracker`) and ``self.events`` (a :class:`~tiering.core.events.KVEventLog`).
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

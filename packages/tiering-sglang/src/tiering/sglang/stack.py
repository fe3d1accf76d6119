"""Blocking, thread-safe calls over tiering's secondary tiers, as SGLang's storage threads make them.

Tiering's tiers are asynchronous (``submit_*`` returns at once, ``get_finished``
reports later) and expect one caller at a time. SGLang calls its storage
backend from several threads (prefetch queries, prefetch I/O, write-back),
each call blocking until its pages are done. :class:`TierStack` bridges the
two: every call into a tier holds one lock; a caller submits its jobs, then
polls all tiers under the lock, keeping the results of other callers' jobs
for them, until its own are reported or its timeout passes.

A job not reported in time counts as failed for its caller, but its staging
slots stay lent until the tier reports it (the tier may still be writing
into them); then they are released, exactly once.

Several tiers: a store goes to every tier that does not hold the page (a page
counts as stored when at least one tier holds it afterwards); a load reads
each page from the first tier that holds it.

A tier answers lookups from its index. When a tier's namespace directory on
a local filesystem (an fs tier's) is removed from outside, that index
would go on saying True for pages with no file, and a store would skip
them; so every call first checks that each such directory is still there
(one ``stat``), and a tier whose directory is gone forgets every block at
once (``reset(keep=False)`` of the block store), before it answers: no
lookup is True, no store skipped, for a page that is not there. Its next
stores recreate the directory.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager
from tiering.sglang.pages import Staging

logger = logging.getLogger(__name__)

T = TypeVar("T")

_POLL_FIRST_S = 0.0005
_POLL_MAX_S = 0.01


@dataclasses.dataclass
class _Orphan:
    """Slots of a call that gave up waiting: released when the last of its jobs is reported."""

    pending: set[int]
    slots: list[int]


class TierStack:
    """Blocking calls (lookup run, store, load) over secondary tiers sharing one staging buffer.

    Args:
        tiers: the tiers, built over ``staging.view`` (tier 0 is asked first).
        staging: the staging buffer.
        timeout_s: seconds a call waits for its jobs (and for an undecided lookup).
    """

    def __init__(self, tiers: Sequence[SecondaryTierManager], staging: Staging, timeout_s: float) -> None:
        self.tiers = list(tiers)
        self.staging = staging
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._results: dict[int, JobResult] = {}
        self._orphans: dict[int, _Orphan] = {}
        self._job_ids = itertools.count(1)
        self._context = ReqContext("sglang-hicache")
        self.errors = 0
        """Exceptions raised by tiers and swallowed (each logged)."""
        self._dirs = [_local_namespace_dir(tier) for tier in self.tiers]
        self._gone = [False] * len(self.tiers)  # directory seen missing, tier reset; cleared once it is back
        self._media_lock = threading.Lock()  # one caller decides a reset: never two for one removal

    # -- calls into the tiers, one at a time ----------------------------------------------------
    def _guard(self, what: str, call: Callable[[], T], default: T) -> T:
        """``call()`` under the lock; an exception is logged, counted, and gives ``default``."""
        with self._lock:
            try:
                return call()
            except Exception:
                self.errors += 1
                logger.exception("tiering tier call %s raised", what)
                return default

    def _poll_locked(self) -> None:
        for idx, tier in enumerate(self.tiers):
            try:
                finished = list(tier.get_finished())
            except Exception:
                self.errors += 1
                logger.exception("tiering tier %d get_finished raised", idx)
                continue
            for result in finished:
                orphan = self._orphans.pop(result.job_id, None)
                if orphan is None:
                    self._results[result.job_id] = result
                    continue
                orphan.pending.discard(result.job_id)
                if not orphan.pending:
                    self.staging.release(orphan.slots)

    def _lookup(self, tier: SecondaryTierManager, key: OffloadKey) -> bool | None:
        """``tier.lookup(key)`` under the lock; an exception is logged, counted, and read as a miss."""
        miss: bool | None = False
        return self._guard(f"lookup ({tier.tier_type})", lambda: tier.lookup(key, self._context), miss)

    def _holds(self, key: OffloadKey) -> bool | None:
        """True: some tier holds ``key``; None: a tier does not know yet; False: none holds it."""
        answers = []
        for tier in self.tiers:
            answer = self._lookup(tier, key)
            if answer is True:
                return True
            answers.append(answer)
        return None if None in answers else False

    def check_media(self) -> None:
        """Reset each tier whose local namespace directory was removed from outside (once per removal)."""
        with self._media_lock:
            for idx, directory in enumerate(self._dirs):
                if directory is None:
                    continue
                present = os.path.isdir(directory)
                if present or self._gone[idx]:
                    self._gone[idx] = not present
                    continue
                self._gone[idx] = True
                tier = self.tiers[idx]
                reset = getattr(tier, "reset", None)
                logger.warning(
                    "tiering: %s tier's directory %s was removed from outside; its index forgets every page",
                    tier.tier_type,
                    directory,
                )
                if callable(reset):
                    self._guard(f"reset ({tier.tier_type})", functools.partial(reset, False), None)

    # -- the blocking calls ---------------------------------------------------------------------
    def leading_run(self, keys: Sequence[OffloadKey]) -> int:
        """How many of ``keys``, from the first, some tier holds (undecided lookups asked again until the timeout)."""
        self.check_media()
        done = 0
        deadline = time.monotonic() + self.timeout_s
        delay = _POLL_FIRST_S
        while done < len(keys):
            answers: list[bool | None] = []
            for key in keys[done:]:
                answers.append(self._holds(key))
                if answers[-1] is False:
                    break
            run = next((i for i, a in enumerate(answers) if a is not True), len(answers))
            done += run
            if done == len(keys) or answers[run] is False or time.monotonic() > deadline:
                return done
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        return done

    def store(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> tuple[list[bool], bool]:
        """Write the pages staged in ``slots`` under ``keys`` to every tier that lacks them; blocks.

        Returns:
            Per key whether some tier holds it now, and whether the caller
            still owns ``slots`` (False: a job outlived the timeout; the slots
            are released when it is reported).
        """
        self.check_media()
        held = [False] * len(keys)
        jobs: dict[int, list[int]] = {}
        for tier in self.tiers:
            lacking = []
            for i, key in enumerate(keys):
                if self._lookup(tier, key) is True:
                    held[i] = True
                else:
                    lacking.append(i)
            if lacking:
                job = JobMetadata(
                    next(self._job_ids), [keys[i] for i in lacking], [slots[i] for i in lacking], False, self._context
                )
                if self._submit(tier, job):
                    jobs[job.job_id] = lacking
        results, owned = self._wait(list(jobs), slots)
        for job_id, positions in jobs.items():
            result = results.get(job_id)
            if result is not None and result.success:
                for i in positions:
                    held[i] = True
        return held, owned

    def load(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> tuple[list[bool], bool]:
        """Read ``keys`` into ``slots``, each from the first tier holding it; blocks.

        Returns:
            Per key whether its slot now holds its verified bytes, and whether
            the caller still owns ``slots`` (see :meth:`store`).
        """
        self.check_media()
        sources: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            for idx, tier in enumerate(self.tiers):
                if self._lookup(tier, key) is True:
                    sources.setdefault(idx, []).append(i)
                    break
        jobs: dict[int, list[int]] = {}
        for idx, positions in sources.items():
            job = JobMetadata(
                next(self._job_ids), [keys[i] for i in positions], [slots[i] for i in positions], True, self._context
            )
            if self._submit(self.tiers[idx], job):
                jobs[job.job_id] = positions
        results, owned = self._wait(list(jobs), slots)
        loaded = [False] * len(keys)
        for job_id, positions in jobs.items():
            result = results.get(job_id)
            if result is None:
                continue
            verified = set(result.successful_keys or ())
            for i in positions:
                loaded[i] = result.success or keys[i] in verified
        return loaded, owned

    def _submit(self, tier: SecondaryTierManager, job: JobMetadata) -> bool:
        """Hand ``job`` to ``tier``; False (logged) when the tier refused it."""
        submit = tier.submit_load if job.is_promotion else tier.submit_store
        return self._guard("submit", lambda: (submit(job), True)[1], False)

    def _wait(self, job_ids: list[int], slots: Sequence[int]) -> tuple[dict[int, JobResult], bool]:
        """Poll until every job in ``job_ids`` is reported or the timeout passes.

        Returns:
            The reported results by job id, and whether the caller still owns
            ``slots`` (False when a job is still out: the slots become an orphan).
        """
        deadline = time.monotonic() + self.timeout_s
        delay = _POLL_FIRST_S
        got: dict[int, JobResult] = {}
        while True:
            with self._lock:
                self._poll_locked()
                for job_id in job_ids:
                    if job_id in self._results:
                        got[job_id] = self._results.pop(job_id)
                missing = set(job_ids) - set(got)
                if not missing:
                    return got, True
                if time.monotonic() > deadline:
                    orphan = _Orphan(missing, list(slots))
                    for job_id in missing:
                        self._orphans[job_id] = orphan
                    logger.error(
                        "tiering: %d tier job(s) not reported within %.0f s; their pages count as failed",
                        len(missing),
                        self.timeout_s,
                    )
                    return got, False
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)

    def shutdown(self) -> None:
        """Shut every tier down (each finishes or fails its jobs), then release the staging buffer."""
        for idx, tier in enumerate(self.tiers):
            self._guard(f"shutdown of tier {idx}", tier.shutdown, None)
        with self._lock:
            self._poll_locked()
        try:
            self.staging.close()
        except BufferError:
            logger.debug("a tier still exports the staging buffer; it is freed with the tier")


def _local_namespace_dir(tier: SecondaryTierManager) -> str | None:
    """The tier's namespace directory when it lies on a local filesystem (an fs tier's), else None."""
    directory = getattr(tier, "namespace_dir", None)
    local = getattr(getattr(tier, "backend", None), "is_local", False)
    return directory if isinstance(directory, str) and local is True else None

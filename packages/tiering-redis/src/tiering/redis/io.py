"""The I/O half of the redis tier: pipelines of SET NX / GET / STRLEN / UNLINK, run on the tier's I/O threads.

:class:`RedisBlockIO` holds every method that talks to the server; the
scheduler-facing half (:mod:`tiering.redis.tier`) only queues work for it.
Each batch is one pipeline (``transaction=False``; redis-py's cluster
pipeline splits it per node), and each outcome goes to the toolkit once: the
job tracker (:func:`~tiering.core.toolkit.record_tasks`), the index
(commit / adopt / deleted), the lookup cache and the KV event log.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.format import BlockFormatError
from tiering.core.toolkit import (
    JobState,
    Victim,
    fail_tasks,
    record_tasks,
)
from tiering.redis.errors import classify_error
from tiering.redis.medium import BlockMissingError
from tiering.redis.sync import RedisServerSync

logger = logging.getLogger(__name__)

Task = tuple[JobState, int]
"""One block of a job: (the job's state, the block's index in the job)."""

ROOM_WAIT_S = 10.0
"""Longest a store waits for evicted blocks' ``UNLINK`` to free its room under the cap (then ``no_space``)."""


class _Shutdown(Exception):
    """Stands for the outcome of blocks whose I/O was skipped because the tier shut down."""


class RedisBlockIO(RedisServerSync):
    """Pipelined block I/O against the server: stores, loads, lookups and deletes (on the I/O threads)."""

    def _delete(self, victims: Sequence[Victim], reason: str, accounted: bool = True) -> None:
        """Queue ``UNLINK`` of ``victims``; ``accounted``: report outcomes to the index (eviction victims)."""
        if not victims:
            return
        self.lookups.invalidate(v.key for v in victims)

        def run(batch: Sequence[Victim]) -> None:
            keys = [v.key for v in batch]
            outcomes = list(zip(keys, self.medium_io.delete_many(keys), strict=True))
            if accounted:
                self.index.deleted_many(outcomes)

        def failed(batch: Sequence[Victim], exc: BaseException) -> None:
            if accounted:
                self.index.deleted_many((v.key, False) for v in batch)

        self.pool.submit("write", run, list(victims), failed)

    def _resolve(self, keys: Sequence[OffloadKey]) -> Mapping[OffloadKey, bool]:
        """Which of a batch of keys the server holds, in one round trip (on an I/O thread).

        See :class:`~tiering.redis.presence.PresenceQuery`: one packed ``STRLEN``
        request per node (a cluster's nodes asked at the same time).
        """
        with self.index.reading() as ticket:
            try:
                flags = self.medium_io.present(keys)
            except Exception as exc:
                self.medium_io.count_error(exc, f"lookup of {len(keys)} keys")
                raise
            found = [key for key, flag in zip(keys, flags, strict=True) if flag]
            self.index.adopt_many(((key, self.object_bytes) for key in found), ticket)
        self._delete(self.index.evict_to_cap(), "eviction")
        self._trim_known()
        return dict.fromkeys(found, True)

    def _store_batch(self, tasks: Sequence[Task]) -> None:
        if not self._closed:
            tasks = self._with_room(tasks)
        keys = [state.meta.keys[i] for state, i in tasks]
        whole: BaseException | None = None  # what failed the whole pipeline, if anything
        results: list[Any] = []
        if self._closed:
            whole = _Shutdown()
        elif tasks:
            try:
                results = self.medium_io.put_many(keys, [self.block(state.meta.block_ids[i]) for state, i in tasks])
            except Exception as exc:
                self.medium_io.count_error(exc, f"store of {len(tasks)} blocks")
                whole = exc
        if whole is not None:
            results = [whole] * len(tasks)
        outcomes: list[tuple[JobState, int, bool, str]] = []
        new: list[OffloadKey] = []
        commits: list[tuple[OffloadKey, bool]] = []
        for (state, i), key, result in zip(tasks, keys, results, strict=True):
            if isinstance(result, BaseException):
                if whole is None:
                    self.medium_io.count_error(result, f"SET of block {key.hex()[:16]}")
                cause = "shutdown" if isinstance(result, _Shutdown) else classify_error(result)
                outcomes.append((state, i, False, cause))
                commits.append((key, False))
                continue
            if result:
                new.append(key)
            else:
                self.counters.inc("stores_already_present")
            outcomes.append((state, i, True, ""))
            commits.append((key, True))
        self.counters.add({"blocks_stored": len(new), "bytes_stored": len(new) * self.block_bytes})
        self.index.commit_many(commits)
        self._trim_known()
        self.lookups.invalidate(k for k, ok in commits if not ok)
        record_tasks(outcomes)
        if self.fleet is not None and new:
            try:
                victims = self.fleet.added(new)
            except Exception as exc:
                self.medium_io.count_error(exc, f"counting {len(new)} blocks in the fleet's LRU")
            else:
                self._fleet_evict(victims)
        if new and self.pin_records is not None:
            self._keep_pinned(new)

    def _keep_pinned(self, new: Sequence[OffloadKey]) -> None:
        """Blocks just stored that are pinned: scored at their pin's expiry in the fleet's LRU, ``ttl_s`` extended."""
        pinned = {key: expiry for key in new if (expiry := self.pins.expiry(key)) is not None}
        if pinned and self.pin_records is not None:
            try:
                self.pin_records.keep_alive(pinned)
            except Exception as exc:  # the next refresh of the pins asserts them again
                self.medium_io.count_error(exc, f"keeping {len(pinned)} pinned blocks")

    def _with_room(self, tasks: Sequence[Task]) -> Sequence[Task]:
        """The tasks whose room under the cap is free now or within :data:`ROOM_WAIT_S`; the rest fail ``no_space``.

        A reservation may take the room of victims whose ``UNLINK`` is still
        queued or failed; a ``SET`` before they are gone would put more than
        the cap on the server.
        """
        keys = [state.meta.keys[i] for state, i in tasks]
        room = self.index.wait_for_room(keys, ROOM_WAIT_S)
        if all(room):
            return tasks
        refused = [(task, key) for task, key, ok in zip(tasks, keys, room, strict=True) if not ok]
        self.index.commit_many([(key, False) for _, key in refused])
        record_tasks([(state, i, False, "no_space") for (state, i), _ in refused])
        return [task for task, ok in zip(tasks, room, strict=True) if ok]

    def _fleet_evict(self, victims: Sequence[OffloadKey]) -> None:
        """Eviction "tier": delete the blocks the fleet's LRU handed this process, at once on this thread.

        Taken out of the set atomically, so no other process deletes them; deleting them
        here rather than queueing keeps the time they exist uncounted short
        (the bound in :mod:`tiering.redis.fleet`).
        """
        if not victims:
            return
        for key in victims:
            self.index.remove(key, delete=False, cause="eviction")
        self.lookups.invalidate(victims)
        self.counters.inc("fleet_evictions", len(victims))
        self.medium_io.delete_many(victims)

    def flush_touches(self) -> None:
        """Eviction "tier": send the touches queued by :meth:`touch` to the fleet's LRU (on an I/O thread)."""
        if self.fleet is not None:
            try:
                self.fleet.flush_touches()
            except Exception as exc:
                self.medium_io.count_error(exc, "touching blocks in the fleet's LRU")

    def _tasks_failed(self, tasks: Sequence[Task], exc: BaseException) -> None:
        """A batch that never ran (shutdown) or raised: its blocks fail, store reservations are released."""
        cause = "shutdown" if self._closed else classify_error(exc)
        stores = [(s.meta.keys[i], False) for s, i in tasks if not s.is_load and not s.finished]
        if stores:
            try:
                self.index.commit_many(stores)
            except KeyError:  # already committed by the batch before it raised
                logger.debug("redis tier: reservations of a failed batch were already released")
        fail_tasks(tasks, cause)

    def _load_batch(self, tasks: Sequence[Task]) -> None:
        todo = [(s, i) for s, i in tasks if not s.should_skip(i)]
        outcomes: list[tuple[JobState, int, bool, str]] = [(s, i, False, "") for s, i in tasks if s.should_skip(i)]
        if self._closed:
            record_tasks(outcomes + [(s, i, False, "shutdown") for s, i in todo])
            return
        with self.index.reading() as ticket:
            keys = [state.meta.keys[i] for state, i in todo]
            results = self.medium_io.get_many(keys, [self.block(state.meta.block_ids[i]) for state, i in todo])
            missing: list[OffloadKey] = []
            bad: list[Victim] = []
            loaded = 0
            for (state, i), key, result in zip(todo, keys, results, strict=True):
                if result is None:
                    loaded += 1
                    self.index.adopt(key, self.object_bytes, ticket)
                    outcomes.append((state, i, True, ""))
                elif isinstance(result, BlockMissingError):
                    missing.append(key)
                    outcomes.append((state, i, False, "missing"))
                elif isinstance(result, BlockFormatError):
                    bad.append(Victim(key, self.object_bytes))
                    outcomes.append((state, i, False, result.reason))
                else:
                    outcomes.append((state, i, False, classify_error(result)))
        self.counters.add({"blocks_loaded": loaded, "bytes_loaded": loaded * self.block_bytes})
        if missing:
            self._forget(missing, "vanished")
        if bad:
            self._forget([v.key for v in bad], "bad")
            self.counters.inc("bad_blocks_removed", len(bad))
            self._delete(bad, "bad", accounted=False)
        record_tasks(outcomes)

"""A KV event log for tiers: which blocks a tier stored and removed, for the engine's KV events.

vLLM publishes KV cache events (``BlockStored`` / ``BlockRemoved``, with the
medium that holds the block) so that a router can send requests to the
replica that holds their prefix. A tier records its own events in a
:class:`KVEventLog` and returns them from
:meth:`~tiering.core.base.SecondaryTierManager.take_events`; the vLLM
binding translates them into vLLM's event types.

The log is thread safe (worker threads record, the scheduler thread takes)
and bounded: beyond ``max_events`` the oldest events are dropped and counted
in :attr:`KVEventLog.dropped`, so a caller that never takes events costs
bounded memory.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Iterable

from tiering.core.base import OffloadKey


@dataclasses.dataclass(frozen=True)
class BlockStored:
    """Blocks that became available in a tier.

    Attributes:
        keys: the blocks' keys, in job order.
        medium: the tier's medium (``"storage"``, ``"memory"``...; see
            :attr:`~tiering.core.base.SecondaryTierManager.medium`).
    """

    keys: tuple[OffloadKey, ...]
    medium: str


@dataclasses.dataclass(frozen=True)
class BlockRemoved:
    """Blocks a tier no longer holds.

    Attributes:
        keys: the blocks' keys.
        medium: the tier's medium.
        reason: why (``"eviction"``, ``"bad"``, ``"vanished"``...).
    """

    keys: tuple[OffloadKey, ...]
    medium: str
    reason: str = "eviction"


KVEvent = BlockStored | BlockRemoved
"""Any event of the log."""


class KVEventLog:
    """Bounded, thread-safe log of :data:`KVEvent` s.

    Args:
        medium: the medium written into every event.
        max_events: events kept before the oldest are dropped (>= 1).

    Raises:
        ValueError: ``max_events`` < 1.
    """

    def __init__(self, medium: str, max_events: int = 65536) -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        self.medium = medium
        self._lock = threading.Lock()
        self._events: collections.deque[KVEvent] = collections.deque()
        self._max = max_events
        self.dropped = 0

    def _append(self, event: KVEvent) -> None:
        with self._lock:
            self._events.append(event)
            while len(self._events) > self._max:
                self._events.popleft()
                self.dropped += 1

    def record_stored(self, keys: Iterable[OffloadKey]) -> None:
        """Record that ``keys`` became available (nothing is recorded for no keys)."""
        keys = tuple(keys)
        if keys:
            self._append(BlockStored(keys, self.medium))

    def record_removed(self, keys: Iterable[OffloadKey], reason: str = "eviction") -> None:
        """Record that ``keys`` are gone (nothing is recorded for no keys)."""
        keys = tuple(keys)
        if keys:
            self._append(BlockRemoved(keys, self.medium, reason))

    def take_events(self) -> list[KVEvent]:
        """Every event since the last call, oldest first."""
        with self._lock:
            out = list(self._events)
            self._events.clear()
            return out

    def __len__(self) -> int:
        """Events waiting to be taken."""
        with self._lock:
            return len(self._events)

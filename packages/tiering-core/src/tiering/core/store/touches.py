"""Touches of a :class:`~tiering.core.store.index.CapacityIndex` queued without its lock.

The scheduler thread marks keys most recently used on every lookup hit and
load (``touch``). Taking the index's lock for that means waiting whenever an
I/O thread holds it, and on a machine with few cores each such wait costs the
scheduler a GIL hand-off and a context switch. A :class:`TouchQueue` takes
the keys without a lock (``deque.extend`` is atomic) and the index applies
them, in the order they were made, under its lock before it reads or changes
the LRU order (a lookup, reservation, commit, adoption, eviction, ``keys()``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from tiering.core.base import OffloadKey

__all__ = ["MAX_QUEUED_TOUCHES", "TouchQueue"]

MAX_QUEUED_TOUCHES = 65536
"""Keys a :class:`TouchQueue` holds before :meth:`TouchQueue.add` asks its owner to apply them (bounded memory)."""


class TouchQueue:
    """Keys touched since the owner last applied them, oldest first.

    :meth:`add` may be called from any thread without a lock; :meth:`apply`
    only by the owner, under its lock (so the queue cannot empty under it).

    Args:
        limit: queued keys beyond which :meth:`add` returns True.
    """

    __slots__ = ("_keys", "limit")

    def __init__(self, limit: int = MAX_QUEUED_TOUCHES) -> None:
        self._keys: collections.deque[OffloadKey] = collections.deque()
        self.limit = limit

    def __bool__(self) -> bool:
        """Whether touches are waiting to be applied."""
        return bool(self._keys)

    def add(self, keys: Iterable[OffloadKey]) -> bool:
        """Queue ``keys``; True when more than ``limit`` are queued (the owner should apply them now)."""
        queued = self._keys
        queued.extend(keys)
        return len(queued) > self.limit

    def apply(self, resident: collections.OrderedDict[OffloadKey, tuple[int, int]]) -> None:
        """Move the queued keys found in ``resident`` to its most recently used end, in touch order."""
        queued = self._keys
        while queued:
            if (key := queued.popleft()) in resident:
                resident.move_to_end(key)

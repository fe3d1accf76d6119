"""Epochs of a :class:`~tiering.core.store.index.CapacityIndex`: a logical clock, removal records, read tickets.

A read that may re-insert a key (a load, or a lookup probe adopting a block
another process wrote) takes a ticket before it starts; a key removed after
that ticket was taken must not be re-inserted by the read, since the bytes it
saw may be gone. :class:`RemovalEpochs` answers that
question. It has no lock of its own: its owner calls it under its lock.
"""

from __future__ import annotations

import collections

from tiering.core.base import OffloadKey

__all__ = ["RemovalEpochs"]


class RemovalEpochs:
    """A logical clock, the clock value of each key's last removal, and the live read tickets.

    Not thread safe: the owning index calls every method under its own lock.
    Removal records older than every live ticket are dropped (all of them
    when no ticket is live), so the records stay bounded.
    """

    def __init__(self) -> None:
        self.clock = 0
        self._removed_at: dict[OffloadKey, int] = {}  # key -> clock of its last removal
        self._tickets: collections.Counter[int] = collections.Counter()

    def tick(self) -> int:
        """Advance the clock; returns the new value (stamps an insertion)."""
        self.clock += 1
        return self.clock

    def removed(self, key: OffloadKey) -> None:
        """Record that ``key`` was removed now."""
        self._removed_at[key] = self.tick()

    def removed_since(self, key: OffloadKey, ticket: int) -> bool:
        """Whether ``key`` was removed after ``ticket`` was taken."""
        removed = self._removed_at.get(key)
        return removed is not None and removed > ticket

    def take(self) -> int:
        """A ticket: the current clock value, counted live until :meth:`release`."""
        self._tickets[self.clock] += 1
        return self.clock

    def release(self, ticket: int, resident: int) -> None:
        """Return a ticket from :meth:`take`; prune removal records (``resident``: blocks the owner holds)."""
        self._tickets[ticket] -= 1
        if self._tickets[ticket] <= 0:
            del self._tickets[ticket]
        if not self._tickets:
            self._removed_at.clear()
        elif len(self._removed_at) > 4096 + 4 * resident:
            oldest = min(self._tickets)
            self._removed_at = {k: c for k, c in self._removed_at.items() if c > oldest}

    def __len__(self) -> int:
        """Number of removal records kept."""
        return len(self._removed_at)

"""Deletes of a :class:`~tiering.core.store.index.CapacityIndex`: handed out, failed, settled.

Eviction forgets a key only after its delete succeeded: a victim's bytes stay
counted while its delete is pending, and stay counted after a failed delete
(the block still exists) until a retry succeeds or a rescan no longer finds
it. :class:`DeleteLedger` keeps that account. It has no lock of its own: its
owner calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Container

from tiering.core.base import OffloadKey
from tiering.core.store.index_types import Victim

__all__ = ["DeleteLedger"]


class DeleteLedger:
    """Keys handed out to be deleted (outcome not yet known) and keys whose delete failed, with their bytes.

    Not thread safe: the owning index calls every method under its own lock.

    Attributes:
        pending_bytes: bytes of keys whose delete is in flight.
        failed_bytes: bytes of keys whose delete failed (still stored).
        failed_deletes: deletes reported failed so far (a counter).
    """

    def __init__(self) -> None:
        self._pending: dict[OffloadKey, int] = {}
        self._failed: dict[OffloadKey, int] = {}
        self.pending_bytes = 0
        self.failed_bytes = 0
        self.failed_deletes = 0

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` has a delete pending or failed (it answers as DELETING)."""
        return key in self._pending or key in self._failed

    @property
    def bytes(self) -> int:
        """Bytes of every key with a delete pending or failed."""
        return self.pending_bytes + self.failed_bytes

    def is_pending(self, key: OffloadKey) -> bool:
        """Whether a delete of ``key`` is in flight (its outcome will come; a writer may wait for it)."""
        return key in self._pending

    def hand_out(self, key: OffloadKey, size: int) -> Victim:
        """Record that ``key`` (``size`` bytes) is being deleted by the caller; returns its victim."""
        self._pending[key] = size
        self.pending_bytes += size
        return Victim(key, size)

    def report(self, key: OffloadKey, ok: bool) -> bool:
        """A delete's outcome: ``ok`` forgets the key and its bytes; a failure keeps them, as failed.

        An outcome for a key not handed out is ignored.

        Returns:
            True when the key was forgotten (its bytes are gone from the medium).
        """
        size = self._pending.pop(key, None)
        if size is None:
            return False
        self.pending_bytes -= size
        if not ok:
            self._failed[key] = size
            self.failed_bytes += size
            self.failed_deletes += 1
        return ok

    def retry(self) -> tuple[Victim, ...]:
        """Hand out again every key whose delete failed (now pending)."""
        victims = tuple(Victim(k, s) for k, s in self._failed.items())
        self._pending.update(self._failed)
        self.pending_bytes += self.failed_bytes
        self._failed.clear()
        self.failed_bytes = 0
        return victims

    def settle_absent(self, found: Container[OffloadKey]) -> tuple[OffloadKey, ...]:
        """Forget the failed deletes whose key a rescan did not find (the bytes are gone); returns those keys."""
        gone = tuple(k for k in self._failed if k not in found)
        for key in gone:
            self.failed_bytes -= self._failed.pop(key)
        return gone

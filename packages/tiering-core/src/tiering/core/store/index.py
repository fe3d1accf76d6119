"""A capacity-bounded index of the blocks a tier holds: key -> size, in LRU order.

One :class:`CapacityIndex` per tier instance (per process). It is the tier's
single account of which blocks exist and how many bytes they occupy, and it
keeps that account true under concurrency:

- **Reservations.** A store reserves its bytes before writing
  (:meth:`CapacityIndex.reserve`) and commits after publishing
  (:meth:`CapacityIndex.commit`); meanwhile ``lookup`` says
  :attr:`KeyState.WRITING` (a tier answers None) and the bytes count against
  the cap. Making room hands back the least recently used blocks as
  :class:`Victim` s for the caller to delete.
- **Eviction forgets a key only after its delete succeeded.** A victim stays
  counted in :attr:`CapacityIndex.used_bytes` (state :attr:`KeyState.DELETING`,
  answered as absent) until :meth:`CapacityIndex.deleted` reports the delete's
  outcome. A failed delete keeps the bytes counted (the block still
  exists) and the key is handed out again by :meth:`CapacityIndex.retry_deletes`
  or settled by the next :meth:`CapacityIndex.reconcile` (the account is
  :class:`~tiering.core.store.ledger.DeleteLedger`).
- **The cap holds on the medium at every instant.** A reservation may take
  the room of victims still being deleted (each reservation gets victims of
  its own), but it is then not ``ready``: it is written only once
  :meth:`CapacityIndex.wait_for_room` admits it, when resident, failed,
  pending-delete and admitted bytes plus its own fit the cap. Slow or
  failing deletes therefore make stores wait (within the caller's bound, then
  fail as no space) instead of letting the medium grow past the cap; the
  deletes in flight never exceed the cap either.
- **Epochs.** A read that may :meth:`CapacityIndex.adopt` a key takes a
  :meth:`CapacityIndex.ticket` first; a key removed, or whose delete
  ended, after that is not re-inserted (see :mod:`~tiering.core.store.epochs`).
- **Reconciliation.** :meth:`CapacityIndex.reconcile` replaces the contents
  with what a rescan found, keeping in-flight reservations and every change
  made since the scan's ticket.
- **Cheap on the scheduler thread.** :meth:`CapacityIndex.touch` takes no lock
  (:mod:`~tiering.core.store.touches`); answers without victims are shared.

A fleet-wide cap is a backend's own business (e.g. a server-side limit);
this index only bounds what this process accounts for.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from tiering.core.base import OffloadKey
from tiering.core.store.index_state import IndexState
from tiering.core.store.index_types import Admit, KeyState, ReconcileReport, Reservation, Victim

__all__ = ["Admit", "CapacityIndex", "KeyState", "ReconcileReport", "Reservation", "Victim"]

_RESERVED, _PRESENT = Reservation(Admit.RESERVED), Reservation(Admit.PRESENT)  # shared: a Reservation is immutable


class CapacityIndex(IndexState):
    """The blocks of one tier instance: sizes, LRU order, reservations, deletes in flight.

    Thread safe; every method takes the index's own lock once (batch methods
    take it once for the whole batch), except :meth:`touch`, which takes none.
    Sizes are bytes as the tier accounts them (e.g. the block file size
    including its header/trailer). The queries and figures are
    :class:`~tiering.core.store.index_state.IndexState`'s.

    Args:
        capacity_bytes: cap on :attr:`used_bytes`; None: unbounded.

    Raises:
        ValueError: ``capacity_bytes`` is negative.
    """

    # -- stores -------------------------------------------------------------------
    def reserve(self, key: OffloadKey, size: int) -> Reservation:
        """Reserve ``size`` bytes for a write of ``key``, evicting LRU blocks to make room.

        A second reservation of a key already being written joins the first
        (no more bytes); the key becomes resident when the last writer
        commits and any of them succeeded.

        Raises:
            ValueError: ``size`` is negative.
        """
        return self.reserve_many((key,), size)[0]

    def reserve_many(self, keys: Iterable[OffloadKey], size: int) -> list[Reservation]:
        """:meth:`reserve` for each of ``keys`` (``size`` bytes each), in order, one lock round.

        Every reservation's ``victims`` must be deleted and reported, as for :meth:`reserve`.

        Raises:
            ValueError: ``size`` is negative.
        """
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        with self._lock:
            self._touched.apply(self._resident)
            return [self._reserve(key, size) for key in keys]

    def _reserve(self, key: OffloadKey, size: int) -> Reservation:
        writing = self._writing
        entry = writing.get(key)
        if entry is not None:  # joins the write in flight
            entry[1] += 1
            return _RESERVED if entry[3] else Reservation(Admit.RESERVED, ready=False)
        book = self.tenants
        if key in self._resident:
            if book is None or not book.is_expired(key):
                self._resident.move_to_end(key)
                return _PRESENT
            return Reservation(Admit.DELETING, tuple(self._expire((key,))), can_wait=True)  # past its TTL: rewrite
        if key in self._deletes:
            return Reservation(Admit.DELETING, can_wait=self._deletes.is_pending(key))
        victims: tuple[Victim, ...] = ()
        if book is not None:
            victims = self._quota_room(key, size)
            if book.over_quota(key, size):  # its own writes in flight fill the tenant's quota
                return Reservation(Admit.NO_SPACE, victims, book.writing_bytes(key) > 0)
        cap = self.capacity_bytes
        if cap is None:
            ready = True
        else:
            victims += self._make_room(size)
            if self._committed() + size > cap:
                return Reservation(Admit.NO_SPACE, victims, bool(self._writing_bytes))
            # Writing now would put more than the cap on the medium while victims' bytes are still there.
            ready = self._on_medium() + size <= cap
        writing[key] = [size, 1, 0, int(ready)]
        self._writing_bytes += size
        if book is not None:
            book.writing(key, size)
        if not ready:
            self._waiting_bytes += size
            return Reservation(Admit.RESERVED, victims, ready=False)
        return Reservation(Admit.RESERVED, victims) if victims else _RESERVED

    def commit(self, key: OffloadKey, ok: bool) -> None:
        """End one reserved write of ``key``: resident when ``ok`` (after the last writer), else released."""
        self.commit_many(((key, ok),))

    def commit_many(self, outcomes: Iterable[tuple[OffloadKey, bool]]) -> None:
        """:meth:`commit` for a batch of writes, one lock round.

        Raises:
            KeyError: a key has no reservation.
        """
        with self._lock:
            self._touched.apply(self._resident)
            new: list[OffloadKey] = []
            for key, ok in outcomes:
                entry = self._writing[key]
                entry[1] -= 1
                if ok:
                    entry[2] = 1
                if entry[1] > 0:
                    continue
                del self._writing[key]
                size = entry[0]
                self._writing_bytes -= size
                if self.tenants is not None:
                    self.tenants.writing(key, -size)
                if not entry[3]:
                    self._waiting_bytes -= size
                if entry[2] and self._insert(key, size):
                    new.append(key)
            self._record_stored(new, "store")
            self._space.notify_all()

    def wait_for_room(self, keys: Sequence[OffloadKey], timeout_s: float) -> list[bool]:
        """Wait until the reserved ``keys`` may be written: their bytes fit on the medium under the cap.

        A reservation answered with ``ready`` False holds its room in the
        index, but the victims evicted for it may still be on the medium
        (their deletes in flight, slow or failing): writing before they are
        gone would put more than the cap there. Keys are admitted in order as
        deletes free room; a key already admitted answers True at once. The
        wait ends early when no delete is in flight (failed deletes bring no
        room until they are retried).

        Args:
            keys: keys reserved by the caller (RESERVED, not yet committed).
            timeout_s: longest wait in seconds for the keys not yet admitted.

        Returns:
            Per key, True when it may be written now; False when no room came
            in time: release it with ``commit(key, False)`` and fail the store as no space.

        Raises:
            KeyError: a key has no reservation.
        """
        deadline = time.monotonic() + timeout_s
        with self._space:
            while True:
                admitted = [self._admit(key) for key in keys]
                left = deadline - time.monotonic()
                if all(admitted) or left <= 0 or not self._deletes.pending_bytes:
                    return admitted
                self._space.wait(left)

    def _admit(self, key: OffloadKey) -> bool:
        entry = self._writing[key]
        if entry[3]:
            return True
        cap = self.capacity_bytes
        if cap is not None and self._on_medium() + entry[0] > cap:
            return False
        entry[3] = 1
        self._waiting_bytes -= entry[0]
        return True

    def wait_for_space(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds for a commit, a release or a delete outcome."""
        with self._space:
            self._space.wait(timeout_s)

    # -- reads and adoption ----------------------------------------------------------
    def ticket(self) -> int:
        """An epoch ticket to take *before* a read or probe whose result may :meth:`adopt` a key.

        Return it with :meth:`release_ticket` (or use :meth:`reading`).
        """
        with self._lock:
            return self._epochs.take()

    def release_ticket(self, ticket: int) -> None:
        """Return a ticket from :meth:`ticket`; removal records older than every live ticket are dropped."""
        with self._lock:
            self._epochs.release(ticket, len(self._resident))

    @contextmanager
    def reading(self) -> Iterator[int]:
        """``with index.reading() as ticket:`` takes and releases a ticket around a read."""
        ticket = self.ticket()
        try:
            yield ticket
        finally:
            self.release_ticket(ticket)

    def adopt(self, key: OffloadKey, size: int, ticket: int) -> bool:
        """Record that a read (begun at ``ticket``) found ``key`` complete with ``size`` bytes.

        A resident key is only touched. The key is *not* inserted when it was
        removed (evicted, deleted, found bad, vanished) or its delete ended
        after ``ticket`` was taken, when a delete of it is pending or failed, or while this process
        writes it: in each case the bytes the read saw may be gone.

        Returns:
            True when ``key`` is resident afterwards.
        """
        return self.adopt_many(((key, size),), ticket) == 1

    def adopt_many(self, found: Iterable[tuple[OffloadKey, int]], ticket: int) -> int:
        """:meth:`adopt` for a batch, one lock round; returns how many keys are resident afterwards."""
        n = 0
        with self._lock:
            self._touched.apply(self._resident)
            new: list[OffloadKey] = []
            for key, size in found:
                if key in self._resident:
                    self._resident.move_to_end(key)
                    n += 1
                elif self._may_adopt(key, ticket):
                    self._insert(key, size)
                    new.append(key)
                    n += 1
            self._record_stored(new, "found")
            if n:
                self._space.notify_all()
        return n

    def _may_adopt(self, key: OffloadKey, ticket: int) -> bool:
        if key in self._writing or key in self._deletes:
            return False
        return not self._epochs.removed_since(key, ticket)

    # -- removal and eviction ------------------------------------------------------------
    def remove(self, key: OffloadKey, delete: bool = True, cause: str = "deleted") -> Victim | None:
        """Take ``key`` out of the resident set (a block found bad, or gone).

        Args:
            key: the key.
            delete: True when the caller will delete the bytes: the key stays
                counted (DELETING) until :meth:`deleted`; False when the bytes
                are known gone (forgotten at once).
            cause: why, for the KV event (:data:`~tiering.core.events.REMOVED_CAUSES`).

        Returns:
            The victim to delete (``delete`` True and the key was resident), else None.
        """
        with self._lock:
            self._touched.apply(self._resident)
            if key not in self._resident:
                return None
            (size,) = self._drop((key,), cause)
            if not delete:
                self._space.notify_all()
                return None
            return self._deletes.hand_out(key, size)

    def lower_cap(self, limit_bytes: int) -> tuple[Victim, ...]:
        """Lower the cap to ``limit_bytes`` and evict LRU blocks down to it (e.g. to what a full disk holds).

        Never raises the cap: a limit at or above it changes nothing (an
        unbounded index becomes bounded). The victims are deleted and reported
        as those of :meth:`reserve`.

        Raises:
            ValueError: ``limit_bytes`` is negative.
        """
        if limit_bytes < 0:
            raise ValueError(f"limit_bytes must be >= 0, got {limit_bytes}")
        with self._lock:
            self._touched.apply(self._resident)
            if self.capacity_bytes is None or limit_bytes < self.capacity_bytes:
                self.capacity_bytes = limit_bytes
            return self._make_room(0)

    def evict_to_cap(self) -> tuple[Victim, ...]:
        """Evict LRU blocks until :attr:`used_bytes` fits the cap (after a rescan); with tenants, expired ones first."""
        with self._lock:
            self._touched.apply(self._resident)
            book = self.tenants
            expired = self._expire(list(book.expired_keys(self._resident))) if book is not None else []
            return (*expired, *self._make_room(0))

    def deleted(self, key: OffloadKey, ok: bool) -> None:
        """Report the outcome of deleting a victim; see :meth:`deleted_many`."""
        self.deleted_many(((key, ok),))

    def deleted_many(self, outcomes: Iterable[tuple[OffloadKey, bool]]) -> None:
        """Report delete outcomes, one lock round.

        ``ok`` True (the bytes are gone, also when they were already gone):
        the key is forgotten and its bytes freed. False: the bytes stay
        counted, the key answers DELETING and is handed out again by
        :meth:`retry_deletes` (or settled by :meth:`reconcile`).
        """
        with self._lock:
            for key, ok in outcomes:
                if self._deletes.report(key, ok):
                    # The bytes are gone only now: a read whose ticket is older (taken after the eviction,
                    # before this delete ended) may have seen them and must not adopt the key.
                    self._epochs.removed(key)
            self._space.notify_all()

    def retry_deletes(self) -> tuple[Victim, ...]:
        """The keys whose delete failed, handed out again (now DELETING, awaiting :meth:`deleted`)."""
        with self._lock:
            return self._deletes.retry()

    # -- reconciliation ---------------------------------------------------------------
    def reconcile(
        self, found: Mapping[OffloadKey, int], ticket: int, born: Mapping[OffloadKey, float] | None = None
    ) -> ReconcileReport:
        """Replace the resident set with what a scan (begun at ``ticket``) found.

        Args:
            found: every complete block the scan saw, key -> size, least
                recently used (oldest) first; new keys are placed before the
                keys already resident (a scan's blocks are older than any
                block used since).
            ticket: taken before the scan started listing.
            born: key -> its store time on the medium (epoch seconds: mtime, ``LastModified``) for tenants' TTL.

        Keys written, adopted or removed since ``ticket`` keep their current
        state (the scan may have listed them before the change); in-flight
        writes are kept. A key whose delete failed or is pending and that
        the scan did not find has its bytes freed.
        """
        with self._lock:
            self._touched.apply(self._resident)
            added = [k for k in found if k not in self._resident and self._may_adopt(k, ticket)]
            for key in reversed(added):
                self._insert(key, found[key], None if born is None else born.get(key))
                self._resident.move_to_end(key, last=False)
            self._record_stored(added, "found")
            vanished = [k for k, (_, added_at) in self._resident.items() if k not in found and added_at <= ticket]
            self._drop(vanished, "vanished")
            confirmed = self._deletes.settle_absent(found)
            for key in confirmed:  # gone from the medium: no read begun before the scan may adopt it
                self._epochs.removed(key)
            self._space.notify_all()
            return ReconcileReport(tuple(added), tuple(vanished), confirmed)

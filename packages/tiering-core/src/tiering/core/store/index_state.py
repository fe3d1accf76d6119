"""The account a :class:`~tiering.core.store.index.CapacityIndex` keeps, its answers, and how a key leaves it.

:class:`IndexState` holds the index's lock and its account (resident blocks in
LRU order, writes in flight, deletes, epochs, queued touches, per-tenant
figures), answers lookups, sizes and figures, and hands resident keys out as
victims (evicted, expired, or over their tenant's quota); :class:`~tiering.core.store.index.CapacityIndex`
adds what changes the account (reservations, commits, adoption, removal,
eviction, reconciliation). Split in two modules only to keep each small.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable, Sequence

from tiering.core.base import OffloadKey
from tiering.core.events import KVEventLog
from tiering.core.store.epochs import RemovalEpochs
from tiering.core.store.forks import ProcessOwner
from tiering.core.store.hooks import TenantBook, TenantOrder, TenantPolicy
from tiering.core.store.index_types import KeyState, Victim
from tiering.core.store.ledger import DeleteLedger
from tiering.core.store.touches import TouchQueue

__all__ = ["IndexState"]


class IndexState:
    """The state and queries of a :class:`~tiering.core.store.index.CapacityIndex` (see there).

    Args:
        capacity_bytes: cap on :attr:`used_bytes`; None: unbounded.
        tenants: per-tenant quotas and TTL (:mod:`~tiering.core.policies.tenancy`); None: off.

    Attributes:
        keep: None, or a callable asked before a resident block is evicted; True keeps the block (a pinned
            block, :meth:`tiering.core.policies.pin_records.PinBook.protects`). Called under the index's lock: it must
            take no lock of the index and do no I/O.

    Raises:
        ValueError: ``capacity_bytes`` is negative.
    """

    def __init__(self, capacity_bytes: int | None = None, tenants: TenantPolicy | None = None) -> None:
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0 or None, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        # key -> (size, clock value when it was added); LRU first.
        self._resident: collections.OrderedDict[OffloadKey, tuple[int, int]] = collections.OrderedDict()
        self._resident_bytes = 0
        # key -> [size, writers in flight, any writer succeeded, may write now (room on the medium)]
        self._writing: dict[OffloadKey, list[int]] = {}
        self._writing_bytes = 0
        self._waiting_bytes = 0  # reserved, but not to be written until victims' deletes free the room
        self._deletes = DeleteLedger()
        self._epochs = RemovalEpochs()
        self._evictions = 0
        self._evicted_bytes = 0
        self._touched = TouchQueue()  # touched without the lock; applied before the LRU order is read
        self.owner = ProcessOwner("this tier's index")  # a forked child's copy refuses lookups (no dead lock)
        # Asked (under the lock, so cheap and lock-free) before a block is evicted: True keeps it (a pin).
        self.keep: Callable[[OffloadKey], bool] | None = None
        self.tenants: TenantBook | None = None  # per-tenant quotas and TTL
        if tenants is not None:  # the same map, keeping each tenant's LRU order too
            self._resident = order = TenantOrder()
            self.tenants = TenantBook(tenants, order)
        self._events: KVEventLog | None = None

    def attach_events(self, events: KVEventLog) -> None:
        """Record every change of the resident set in ``events``, under the index's lock (so in order).

        A key entering the resident set is ``BlockStored`` (cause ``store``
        for a commit, ``found`` for an adoption or a rescan), a key leaving it
        ``BlockRemoved`` (``eviction`` when evicted to make room, else the
        cause its remover gives); :meth:`announce` re-announces. The log's
        re-announcer (after events were dropped at its bound) is set to
        :meth:`announce`. Blocks already resident are announced at once.
        """
        events.reannounce = self.announce
        with self._lock:
            self._events = events
            self._touched.apply(self._resident)
            events.record_stored(self._resident, "announce")

    def announce(self, cause: str) -> None:
        """Record ``TierCleared(cause)`` and every resident key (cause ``announce``); no log attached: nothing.

        For a consumer that missed events (the tier reconnected, events were
        dropped): after it, the consumer holds exactly the resident keys.
        """
        with self._lock:
            if self._events is not None:
                self._touched.apply(self._resident)
                self._events.record_cleared(cause, self._resident)

    def _record_stored(self, keys: list[OffloadKey], cause: str) -> None:
        # Called under the lock, so a consumer sees the changes in the order they happened.
        if keys and self._events is not None:
            self._events.record_stored(keys, cause)

    def _record_removed(self, keys: Iterable[OffloadKey], cause: str) -> None:
        if self._events is not None:
            self._events.record_removed(keys, cause)

    def _drop(self, keys: Sequence[OffloadKey], cause: str) -> list[int]:
        """Take resident ``keys`` out of the resident set, recording their removal with ``cause``; their sizes.

        Every path that removes resident keys goes through here (call it
        under the lock), so each removal has its KV event, in order.
        """
        sizes = []
        for key in keys:
            size, _ = self._resident.pop(key)
            self._resident_bytes -= size
            self._epochs.removed(key)
            if self.tenants is not None:
                self.tenants.removed(key, size)
            sizes.append(size)
        self._record_removed(keys, cause)
        return sizes

    # -- queries ----------------------------------------------------------------
    def lookup(self, key: OffloadKey, touch: bool = True) -> KeyState:
        """The state of ``key``; a resident key becomes most recently used when ``touch``.

        Raises:
            ForkedStackError: called in a child forked after the index was built.
        """
        self.owner.check()
        with self._lock:
            self._touched.apply(self._resident)
            return self._state(key, touch)

    def _state(self, key: OffloadKey, touch: bool) -> KeyState:
        if key in self._writing:
            return KeyState.WRITING
        if key in self._resident:
            if self.tenants is not None and self.tenants.is_expired(key):
                self.tenants.expired.extend(self._expire((key,)))  # a miss from now on; the tier deletes it
                return KeyState.DELETING
            if touch:
                self._resident.move_to_end(key)
            return KeyState.RESIDENT
        if key in self._deletes:
            return KeyState.DELETING
        return KeyState.ABSENT

    def _insert(self, key: OffloadKey, size: int, born: float | None = None) -> bool:
        """Make ``key`` resident (most recently used); True when it was not resident before."""
        old = self._resident.pop(key, None)
        if old is not None:
            self._resident_bytes -= old[0]
        self._resident[key] = (size, self._epochs.tick())
        self._resident_bytes += size
        if self.tenants is not None:
            if old is not None:
                self.tenants.removed(key, old[0])
            self.tenants.added(key, size, born)
        return old is None

    def _make_room(self, need: int) -> tuple[Victim, ...]:
        cap = self.capacity_bytes
        if cap is None:
            return ()
        victims: list[Victim] = []
        kept = 0
        while len(self._resident) > kept and self._committed() + need > cap:
            key = next(iter(self._resident))
            if self.keep is not None and self.keep(key):  # pinned: looked at again after every other block
                self._resident.move_to_end(key)
                kept += 1
                continue
            victims += self._evict_keys((key,))
        return self._count_evicted(victims)

    def _evict_keys(self, keys: Iterable[OffloadKey], cause: str = "eviction") -> list[Victim]:
        """Take resident ``keys`` out and hand them out to be deleted (each stays counted until :meth:`deleted`)."""
        keys = list(keys)
        return [self._deletes.hand_out(k, size) for k, size in zip(keys, self._drop(keys, cause), strict=True)]

    def _expire(self, keys: Iterable[OffloadKey]) -> list[Victim]:
        """Evict resident ``keys`` past their tenant's TTL; counted as expirations."""
        keys = list(keys)
        victims = self._evict_keys(keys, "ttl")
        if self.tenants is not None:
            self.tenants.count_expired(keys)
        return victims

    def _quota_room(self, key: OffloadKey, size: int) -> tuple[Victim, ...]:
        # A tenant at its quota makes room among its own least recently used blocks only.
        book = self.tenants
        need = 0 if book is None else book.over_quota(key, size)
        if book is None or not need:
            return ()
        return self._count_evicted(self._evict_keys(book.quota_victims(key, need, self.keep), "quota"))  # pins kept

    def _count_evicted(self, victims: list[Victim]) -> tuple[Victim, ...]:
        self._evictions += len(victims)
        self._evicted_bytes += sum(v.size for v in victims)
        return tuple(victims)

    def take_expired(self) -> list[Victim]:
        """The blocks lookups found past their tenant's TTL since the last call, for the tier to delete.

        They answer DELETING (a miss) and stay counted until :meth:`deleted` reports their delete.
        """
        book = self.tenants
        if book is None or not book.expired:
            return []
        with self._lock:
            victims, book.expired = book.expired, []
        return victims

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is resident (no LRU update)."""
        with self._lock:
            return key in self._resident

    def __len__(self) -> int:
        """Number of resident blocks."""
        with self._lock:
            return len(self._resident)

    def touch(self, keys: Iterable[OffloadKey]) -> None:
        """Make the resident ones of ``keys`` most recently used, in order, before the LRU order is next read.

        No lock: the keys are queued (:class:`~tiering.core.store.touches.TouchQueue`).

        Raises:
            ForkedStackError: called in a child forked after the index was built.
        """
        self.owner.check()
        if self._touched.add(keys):
            with self._lock:
                self._touched.apply(self._resident)

    def keys(self) -> list[OffloadKey]:
        """Resident keys, least recently used first (a snapshot)."""
        with self._lock:
            self._touched.apply(self._resident)
            return list(self._resident)

    @property
    def used_bytes(self) -> int:
        """Bytes counted against the cap: resident + reserved for writes + deletes pending or failed."""
        with self._lock:
            return self._used()

    @property
    def settled_bytes(self) -> int:
        """Bytes the medium holds for certain: :attr:`used_bytes` less the writes in flight (deletes pending kept)."""
        with self._lock:
            return self._used() - self._writing_bytes

    @property
    def resident_bytes(self) -> int:
        """Bytes of resident blocks."""
        with self._lock:
            return self._resident_bytes

    @property
    def failed_delete_bytes(self) -> int:
        """Bytes of blocks whose delete failed (still on the medium, counted until a retry succeeds); no lock."""
        return self._deletes.failed_bytes

    def _used(self) -> int:
        return self._resident_bytes + self._writing_bytes + self._deletes.bytes

    def _committed(self) -> int:
        # What a new reservation is checked against: a victim handed out is being deleted right now, so its
        # bytes are room on the way, and each reservation gets victims of its own (no two wait for the same
        # room); if a delete fails its bytes come back (undeleted) and the next reservation evicts for them.
        return self._resident_bytes + self._writing_bytes + self._deletes.failed_bytes

    def _on_medium(self) -> int:
        # What the medium may hold at most right now: every byte counted except reservations still waiting
        # for their room (not written yet). Kept <= the cap: a write starts only when its bytes fit here.
        return self._used() - self._waiting_bytes

    # -- figures --------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """The index's figures, each named and described once in :data:`tiering.core.store.stats.STATS`.

        ``resident_blocks``, ``resident_bytes``, ``used_bytes``, ``reserved_bytes``, ``pending_delete_bytes``,
        ``in_flight_stores``, ``capacity_bytes`` (0: unbounded), ``evictions``, ``evicted_bytes``, ``failed_deletes``,
        ``room_wait_bytes``; with tenants (:mod:`~tiering.core.policies.tenancy`) also
        ``quota_evictions``, ``expirations`` and ``tenant:<name>:<figure>`` per tenant.

        Raises:
            ForkedStackError: called in a child forked after the index was built.
        """
        self.owner.check()
        with self._lock:
            tenants = {} if self.tenants is None else self.tenants.stats()
            return {
                **tenants,
                "resident_blocks": len(self._resident),
                "resident_bytes": self._resident_bytes,
                "used_bytes": self._used(),
                "reserved_bytes": self._writing_bytes,
                "pending_delete_bytes": self._deletes.bytes,
                "in_flight_stores": len(self._writing),
                "capacity_bytes": self.capacity_bytes or 0,
                "evictions": self._evictions,
                "evicted_bytes": self._evicted_bytes,
                "failed_deletes": self._deletes.failed_deletes,
                "room_wait_bytes": self._waiting_bytes,
            }

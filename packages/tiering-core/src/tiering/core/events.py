"""A KV event log for tiers: which blocks a tier holds, for the engine's KV events and a router's index.

vLLM publishes KV cache events (``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared``, with the medium that holds the block) so that a router
can send requests to the replica that holds their prefix. A tier records its
own events in a :class:`KVEventLog` and returns them from
:meth:`~tiering.core.capabilities.EventSource.take_events`; the vLLM
binding translates them into vLLM's event types.

Routing-grade: a consumer that applies the events in order holds exactly the
keys the tier holds.

- Every event names its tier: ``medium`` (``"storage"``, ``"memory"``,
  ``"cpu"``), ``tier`` (the tier's registered name: ``"fs"``, ``"s3"``,
  ``"redis"``...) and ``locality`` (:data:`LOCALITIES`), and says why
  (``cause``, :data:`STORED_CAUSES` / :data:`REMOVED_CAUSES` /
  :data:`CLEARED_CAUSES`).
- Every way a block appears or disappears is recorded: a tier's
  :class:`~tiering.core.store.index.CapacityIndex` records them itself,
  under its lock, when a key enters or leaves its resident set (see
  :meth:`~tiering.core.store.index_state.IndexState.attach_events`), so
  no removal path of the index can forget its event.
- A :class:`TierCleared` event starts every log (the tier's start-up) and
  every re-announcement (a reconnect, or events lost to the bound): the
  consumer drops what it holds for that tier; the ``BlockStored`` events with
  cause ``"announce"`` that follow list what the tier holds.

The log is thread safe (worker threads record, the scheduler thread takes)
and bounded: beyond ``max_events`` the oldest events are dropped and counted
in :attr:`KVEventLog.dropped`; a log with a re-announcer (set by
:meth:`~tiering.core.store.index_state.IndexState.attach_events`) then
clears and re-announces the tier at the next :meth:`KVEventLog.take_events`,
so a lossy period never leaves the consumer wrong.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Iterable

from tiering.core.base import OffloadKey

LOCALITIES = ("local", "remote", "fleet")
"""Where a tier's blocks are, seen from the engine: ``"local"`` (this host: a local disk, this process's
memory), ``"remote"`` (a server only this process writes, e.g. one redis per engine), ``"fleet"`` (a store
shared by several engines, e.g. s3, a shared redis): a block stored by one engine is a hit for all."""

STORED_CAUSES = ("store", "promotion", "found", "announce")
"""Why a block appeared: this process wrote it (``store``), the primary tier copied it in from a secondary
tier (``promotion``), a read or a rescan found it written elsewhere (``found``), or the tier re-announces what it
holds after a :class:`TierCleared` (``announce``)."""

REMOVED_CAUSES = ("eviction", "ttl", "quota", "corrupt", "vanished", "deleted", "forgotten")
"""Why a block disappeared: evicted to make room (``eviction``), expired (``ttl``), evicted for a tenant's
quota (``quota``), found corrupt on a load and dropped (``corrupt``), found gone by a read or a rescan (``vanished``:
deleted by ``tiering gc`` / ``verify --remove`` from another process, by the server, by hand), deleted through the
tier (``deleted``), or no longer tracked though a server may still hold it (``forgotten``: redis with
``eviction: "server"`` bounds what it remembers)."""

CLEARED_CAUSES = ("startup", "reconnect", "overflow")
"""Why a tier's blocks are re-announced: the tier started (``startup``), it reconnected to a server whose data
set may differ (``reconnect``: a failover, a restart), or events were dropped at the log's bound (``overflow``)."""


@dataclasses.dataclass(frozen=True)
class BlockStored:
    """Blocks that became available in a tier.

    Attributes:
        keys: the blocks' keys, in job order.
        medium: the tier's medium (``"storage"``, ``"memory"``...; see
            :attr:`~tiering.core.base.SecondaryTierManager.medium`).
        cause: why (:data:`STORED_CAUSES`).
        tier: the tier's registered name (``"fs"``, ``"s3"``, ``"redis"``...; ``""`` unnamed).
        locality: :data:`LOCALITIES`.
    """

    keys: tuple[OffloadKey, ...]
    medium: str
    cause: str = "store"
    tier: str = ""
    locality: str = "local"


@dataclasses.dataclass(frozen=True)
class BlockRemoved:
    """Blocks a tier no longer holds (a lookup answers them absent from now on).

    Attributes:
        keys: the blocks' keys.
        medium: the tier's medium.
        cause: why (:data:`REMOVED_CAUSES`).
        tier: the tier's registered name.
        locality: :data:`LOCALITIES`.
    """

    keys: tuple[OffloadKey, ...]
    medium: str
    cause: str = "eviction"
    tier: str = ""
    locality: str = "local"


@dataclasses.dataclass(frozen=True)
class TierCleared:
    """Forget every block of this tier: the ``BlockStored`` events (cause ``"announce"``) that follow list them.

    Attributes:
        medium: the tier's medium.
        cause: why (:data:`CLEARED_CAUSES`).
        tier: the tier's registered name.
        locality: :data:`LOCALITIES`.
    """

    medium: str
    cause: str = "startup"
    tier: str = ""
    locality: str = "local"

    @property
    def keys(self) -> tuple[OffloadKey, ...]:
        """No keys: the event is about the whole tier."""
        return ()


KVEvent = BlockStored | BlockRemoved | TierCleared
"""Any event of the log."""


class KVEventLog:
    """Bounded, thread-safe log of :data:`KVEvent` s of one tier; it begins with ``TierCleared("startup")``.

    Args:
        medium: the medium written into every event.
        max_events: events kept before the oldest are dropped (>= 1).
        tier: the tier's registered name, written into every event.
        locality: :data:`LOCALITIES`, written into every event.

    Raises:
        ValueError: ``max_events`` < 1, or ``locality`` not in :data:`LOCALITIES`.
    """

    def __init__(self, medium: str, max_events: int = 65536, tier: str = "", locality: str = "local") -> None:
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        if locality not in LOCALITIES:
            raise ValueError(f"locality must be one of {LOCALITIES}, got {locality!r}")
        self.medium = medium
        self.tier = tier
        self.locality = locality
        self._lock = threading.Lock()
        self._events: collections.deque[KVEvent] = collections.deque()
        self._max = max_events
        self.dropped = 0
        self._lost = False  # events were dropped since the last re-announcement
        # Records TierCleared(cause) and the tier's blocks (set by the tier's index); None: a lossy log stays lossy.
        self.reannounce: Callable[[str], None] | None = None
        self._append(TierCleared(medium, "startup", tier, locality))

    def _append(self, event: KVEvent) -> None:
        with self._lock:
            self._events.append(event)
            while len(self._events) > self._max:
                self._events.popleft()
                self.dropped += 1
                self._lost = True

    def record_stored(self, keys: Iterable[OffloadKey], cause: str = "store") -> None:
        """Record that ``keys`` became available (nothing is recorded for no keys)."""
        keys = tuple(keys)
        if keys:
            self._append(BlockStored(keys, self.medium, cause, self.tier, self.locality))

    def record_removed(self, keys: Iterable[OffloadKey], cause: str = "eviction") -> None:
        """Record that ``keys`` are gone (nothing is recorded for no keys)."""
        keys = tuple(keys)
        if keys:
            self._append(BlockRemoved(keys, self.medium, cause, self.tier, self.locality))

    def record_cleared(self, cause: str, holding: Iterable[OffloadKey]) -> None:
        """Record ``TierCleared(cause)``, then ``holding`` (every block the tier holds) as stored, cause ``announce``.

        The caller makes sure no other event of the tier is recorded between
        its snapshot of ``holding`` and this call (the index calls it under its lock).
        """
        self._append(TierCleared(self.medium, cause, self.tier, self.locality))
        self.record_stored(holding, "announce")

    def take_events(self) -> list[KVEvent]:
        """Every event since the last call, oldest first.

        After events were dropped at the bound, the tier is cleared and
        re-announced first (when a re-announcer is set), and the events
        recorded from then on are returned.
        """
        with self._lock:
            lost, self._lost = self._lost and self.reannounce is not None, False
            if lost:
                self._events.clear()
        if lost and self.reannounce is not None:
            # Outside the log's lock: the index records under its own lock, then takes this one.
            self.reannounce("overflow")
        with self._lock:
            out = list(self._events)
            self._events.clear()
            return out

    def __len__(self) -> int:
        """Events waiting to be taken."""
        with self._lock:
            return len(self._events)


class HeldKeys:
    """What a consumer was told one tier holds, to express :class:`TierCleared` as removals.

    vLLM's event types have no clear scoped to one tier (``AllBlocksCleared``
    clears the whole engine, GPU blocks included), so a binding keeps one
    ``HeldKeys`` per tier and passes the tier's events through
    :meth:`resolve`: a ``TierCleared`` becomes a ``BlockRemoved`` (with the
    clear's cause) of every key announced and not removed since.
    """

    def __init__(self) -> None:
        self._keys: dict[OffloadKey, None] = {}  # insertion ordered: removals come out oldest first

    def resolve(self, events: Iterable[KVEvent]) -> list[BlockStored | BlockRemoved]:
        """``events`` without ``TierCleared`` (replaced as above); keeps the held set up to date."""
        out: list[BlockStored | BlockRemoved] = []
        for event in events:
            if isinstance(event, TierCleared):
                if self._keys:
                    out.append(BlockRemoved(tuple(self._keys), event.medium, event.cause, event.tier, event.locality))
                self._keys.clear()
                continue
            if isinstance(event, BlockStored):
                self._keys.update(dict.fromkeys(event.keys))
            else:
                for key in event.keys:
                    self._keys.pop(key, None)
            out.append(event)
        return out

    def __len__(self) -> int:
        """Keys held."""
        return len(self._keys)

"""The CPU primary tier: slots of a host buffer, pins, and eviction."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

from tiering.core.base import OffloadKey
from tiering.core.events import KVEvent, KVEventLog
from tiering.core.primary.buffer import allocate_host_buffer, as_block_view
from tiering.core.primary.policy import CachePolicy


@dataclasses.dataclass
class _Slot:
    block_id: int
    ready: bool = False
    pins: int = 0
    owner: str | None = None  # the request whose write this not-ready slot awaits (None: no request's)


@dataclasses.dataclass
class Allocation:
    """Result of :meth:`CPUPrimaryTier.allocate`.

    Attributes:
        keys: the keys given slots, in request order; their slots are pinned
            and not ready until :meth:`CPUPrimaryTier.complete_write`.
        block_ids: the slot of each entry of ``keys``.
        present: keys already resident (or being written); not allocated.
        rejected: keys that got no slot because every slot is pinned.
        evicted: keys evicted to make room.
    """

    keys: list[OffloadKey] = dataclasses.field(default_factory=list)
    block_ids: list[int] = dataclasses.field(default_factory=list)
    present: list[OffloadKey] = dataclasses.field(default_factory=list)
    rejected: list[OffloadKey] = dataclasses.field(default_factory=list)
    evicted: list[OffloadKey] = dataclasses.field(default_factory=list)


class CPUPrimaryTier:
    """Block-major host buffer of ``num_blocks`` slots with ref-counted pins.

    A slot is either free, being written (pinned, not ready) or resident
    (ready). A pinned slot (``pins > 0``) is never evicted or reused; pins are
    taken for every transfer that reads or writes the slot and released when
    it is reported finished. A slot allocated for a request (``owner``) whose
    write is never completed is freed by :meth:`release` when the request
    ends: a request that finished or was aborted leaves no slot pinned.

    Its KV events (:attr:`events`, tier ``"primary"``, medium ``"cpu"``):
    a block becomes stored when its write completes (cause ``store``, or
    ``promotion`` for a copy loaded from a secondary tier) and removed when
    evicted.

    Args:
        num_blocks: number of slots (capacity in blocks).
        block_bytes: bytes per slot.
        policy: the eviction policy (its ``capacity`` should be ``num_blocks``).
        buffer: an existing flat writable buffer of ``num_blocks * block_bytes``
            bytes (e.g. pinned memory from :mod:`tiering.core.transfer`);
            allocated and pre-faulted here when None.

    Raises:
        ValueError: non-positive sizes or a buffer of the wrong size.
    """

    medium: ClassVar[str] = "cpu"
    """Host memory (vLLM's medium ``CPU``)."""

    def __init__(
        self,
        num_blocks: int,
        block_bytes: int,
        policy: CachePolicy,
        buffer: memoryview | None = None,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes
        self.policy = policy
        self.kv_view = (
            allocate_host_buffer(num_blocks, block_bytes)
            if buffer is None
            else as_block_view(buffer, num_blocks, block_bytes)
        )
        self._slots: dict[OffloadKey, _Slot] = {}
        self._free = list(range(num_blocks - 1, -1, -1))
        self._pinned = 0  # slots with pins > 0
        self._owned: dict[str, set[OffloadKey]] = {}  # request -> keys allocated for it, not yet written
        self.evictions = 0
        self.events = KVEventLog(self.medium, tier="primary")

    def take_events(self) -> list[KVEvent]:
        """The KV events since the last call (see :attr:`events`), oldest first."""
        return self.events.take_events()

    # -- queries ------------------------------------------------------------
    def lookup(self, key: OffloadKey) -> bool:
        """True when ``key`` is resident and ready to read."""
        slot = self._slots.get(key)
        return slot is not None and slot.ready

    def __contains__(self, key: object) -> bool:
        return key in self._slots

    def block_id(self, key: OffloadKey) -> int:
        """The slot of a resident or in-write key. Raises KeyError otherwise."""
        return self._slots[key].block_id

    def pins(self, key: OffloadKey) -> int:
        """Current pin count of ``key`` (0 when absent)."""
        slot = self._slots.get(key)
        return slot.pins if slot else 0

    @property
    def num_pinned(self) -> int:
        """Slots pinned by a transfer in flight (not evictable)."""
        return self._pinned

    @property
    def num_resident(self) -> int:
        """Keys holding a slot (ready or being written)."""
        return len(self._slots)

    # -- writes -------------------------------------------------------------
    def allocate(self, keys: Sequence[OffloadKey], owner: str | None = None) -> Allocation:
        """Give each absent key a pinned, not-ready slot, evicting unpinned blocks as needed.

        Keys already present are touched and reported in ``present``. A key
        that finds every slot pinned is reported in ``rejected``; nothing
        raises and the tier's state stays consistent. With ``owner`` (a
        request id) the slots are that request's until written:
        :meth:`release` frees the ones still unwritten when it ends.
        """
        out = Allocation()
        for key in keys:
            if key in self._slots:
                if self._slots[key].ready:
                    self.policy.access(key)
                out.present.append(key)
                continue
            block_id = self._take_free_slot(key, out.evicted)
            if block_id is None:
                out.rejected.append(key)
                continue
            self._slots[key] = _Slot(block_id, ready=False, pins=1, owner=owner)
            self._pinned += 1
            if owner is not None:
                self._owned.setdefault(owner, set()).add(key)
            out.keys.append(key)
            out.block_ids.append(block_id)
        return out

    def _take_free_slot(self, incoming: OffloadKey, evicted: list[OffloadKey]) -> int | None:
        if self._free:
            return self._free.pop()
        victim = self.policy.evict(self._evictable, incoming)
        if victim is None:
            return None
        evicted.append(victim)
        self.evictions += 1
        self.events.record_removed((victim,), "eviction")
        return self._slots.pop(victim).block_id

    def _evictable(self, key: OffloadKey) -> bool:
        slot = self._slots[key]
        return slot.ready and slot.pins == 0

    def complete_write(self, keys: Sequence[OffloadKey], success: bool, cause: str = "store") -> None:
        """Finish writes started by :meth:`allocate`: make slots ready, or free them on failure.

        ``cause`` names the write in the KV event of the keys made ready (``"store"``, ``"promotion"``).
        """
        ready = []
        for key in keys:
            slot = self._slots.get(key)
            if slot is None or slot.ready:
                continue
            slot.pins -= 1
            self._pinned -= slot.pins == 0
            if slot.owner is not None:
                self._disown(key, slot.owner)
                slot.owner = None
            if success:
                slot.ready = True
                self.policy.insert(key)
                ready.append(key)
            elif slot.pins == 0:
                del self._slots[key]
                self._free.append(slot.block_id)
        self.events.record_stored(ready, cause)

    def _disown(self, key: OffloadKey, owner: str) -> None:
        owned = self._owned.get(owner)
        if owned is not None:
            owned.discard(key)
            if not owned:
                del self._owned[owner]

    def release(self, owner: str) -> list[OffloadKey]:
        """Free every slot allocated for request ``owner`` whose write was never completed (the request ended).

        Returns:
            The keys whose slots were freed (their writes failed, as by ``complete_write(keys, False)``).
        """
        keys = sorted(self._owned.pop(owner, ()))
        for key in keys:
            slot = self._slots[key]
            slot.owner = None
        self.complete_write(keys, False)
        return keys

    # -- reads --------------------------------------------------------------
    def pin(self, keys: Sequence[OffloadKey], *, record_access: bool = True) -> list[int]:
        """Pin ready keys for reading and return their slots.

        Args:
            keys: keys for which :meth:`lookup` is True.
            record_access: count the read as a use for the eviction order
                (False for reads by secondary-tier stores).

        Raises:
            KeyError: a key is not resident and ready.
        """
        block_ids = []
        for key in keys:
            slot = self._slots.get(key)
            if slot is None or not slot.ready:
                raise KeyError(f"block {key.hex()} is not resident in the primary tier")
            slot.pins += 1
            self._pinned += slot.pins == 1
            if record_access:
                self.policy.access(key)
            block_ids.append(slot.block_id)
        return block_ids

    def unpin(self, keys: Sequence[OffloadKey]) -> None:
        """Release one pin of each key taken by :meth:`pin`."""
        for key in keys:
            slot = self._slots.get(key)
            if slot is not None and slot.pins > 0:
                slot.pins -= 1
                self._pinned -= slot.pins == 0

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        """Record a use of each resident, ready key."""
        for key in keys:
            if self.lookup(key):
                self.policy.access(key)

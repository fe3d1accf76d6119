"""The primitives a persistent medium implements for the indexed block store.

A backend of :class:`~tiering.core.store.tier.IndexedTier` (a directory of
files, a bucket, a key-value server) implements :class:`Medium`: only what
the medium alone knows (how to put and get many blocks with the block format
applied, sizes for lookups, deletes, a scan, the namespace record, free
space). Everything else (the index, reservations and eviction, jobs, lookups,
bad and vanished blocks, rescans, stats, shutdown) is the block store's.

The methods run on the store's I/O threads (the scan on its scan thread,
``size`` on the scheduler thread with ``lookup_fallback: "stat"``); they may
block on the medium and may be called from several threads at once.
"""

from __future__ import annotations

import errno
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from tiering.core.base import OffloadKey
from tiering.core.format import BlockFormatError
from tiering.core.store.hooks import PinMedium

logger = logging.getLogger(__name__)

__all__ = [
    "LOAD_CAUSES",
    "PRESENT",
    "STORE_CAUSES",
    "BlockNotReadyError",
    "Medium",
    "NotStartedError",
    "Present",
    "ScanResult",
    "WriteOutcome",
]

STORE_CAUSES = ("no_space", "io_error", "permission", "internal")
"""Causes of a failed block store, in stats order (:meth:`Medium.failure_cause` of a store)."""

LOAD_CAUSES = (
    "checksum",
    "truncated",
    "foreign",
    "corrupt",
    "missing",
    "vanished",
    "io_error",
    "permission",
    "internal",
)
"""Causes of a failed block load, in stats order (:meth:`Medium.failure_cause` of a load)."""

_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
_DENIED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


class NotStartedError(Exception):
    """A block of a batch was not written: the store began shutting down before its turn (failed as ``shutdown``)."""


class BlockNotReadyError(Exception):
    """The block exists but is shorter than a stored block: another writer is still putting it.

    A load answers it as a miss (cause ``truncated``); the block is never
    deleted for it, and the index forgets the key unless this process is
    writing it.
    """


class Present:
    """Type of :data:`PRESENT`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PRESENT"


PRESENT: Final = Present()
"""A write outcome: another writer had stored the block first (a conditional put refused); counts as stored."""

WriteOutcome = BaseException | Present | None
"""One block's write outcome: None (written), :data:`PRESENT`, or what the write raised."""


@dataclass(frozen=True)
class ScanResult:
    """What one pass over the medium found.

    Attributes:
        blocks: key -> (size in bytes, store time in seconds since the epoch) of every whole block
            (a tenant's TTL counts from the store time; older blocks go first in the LRU order).
        temp_bytes: bytes of other writers' unfinished blocks (temporaries) to count against the cap until
            the next scan; 0 where the medium has none.
        counters: the medium's own counters to add (e.g. ``temps_removed``, ``bad_blocks_removed``,
            ``short_objects_seen``); each name must be in :attr:`Medium.counters` or the store's counters.
        complete: False when the scan stopped early (shutdown): nothing is forgotten or adopted then.
        summary: what else the scan saw, for the scan's log line ("" for nothing).
    """

    blocks: Mapping[bytes, tuple[int, float]]
    temp_bytes: int = 0
    counters: Mapping[str, int] = field(default_factory=dict)
    complete: bool = True
    summary: str = ""


class Medium(ABC):
    """Where an indexed block store keeps its blocks: the primitives a backend implements.

    Required: :attr:`stored_block_bytes`, :meth:`size`, :meth:`remove`, :meth:`scan`,
    and block I/O: :meth:`write_many` or :meth:`write_one`, :meth:`read_many` or
    :meth:`read_one` (the ``_many`` defaults call the ``_one`` methods block by
    block; a medium with neither pair member raises ``TypeError`` when created).
    Every other method has a default that suits a simple medium; override it
    where the medium does better (one round trip for many keys) or differs
    (see the hook attributes).

    Attributes:
        stored_block_bytes: bytes one stored block occupies on the medium (payload plus header or
            trailer); the unit of the cap. Set by the constructor.
        label: the tier kind in log lines (``"fs tier"``).
        location: where the blocks are, in log lines (a directory, ``s3://bucket/prefix``, a server).
        store_causes, load_causes: every cause :meth:`failure_cause` answers (``store_failed_<cause>``,
            ``load_failed_<cause>`` counters, present in stats from the start).
        counters: names of the medium's own counters (``ScanResult.counters`` and :meth:`stats`
            may use them); the store adds them to its counters.
        delete_threads: 0: deletes run on the I/O thread that evicted (a fast medium: an unlink
            takes microseconds); n > 0: a delete pool of n threads, so a store waiting for its room
            never blocks the threads that free it (a remote medium).
        delete_batch: at most this many keys per :meth:`remove_many` call. May change at run time
            (a server that starts refusing batch deletes: 1, and the delete pool sends them in parallel).
        server_evicts: the medium drops blocks on its own (a server's LRU): the store does not cap
            it; it forgets index entries beyond :attr:`known_limit_bytes` instead of deleting them.
        known_limit_bytes: with ``server_evicts``, the most bytes the medium can hold (0: unknown).
        read_only: set by the store before the first scan when it was opened for inspection: :meth:`scan`
            must then remove nothing (no stale temporary, no damaged block) and only list.
    """

    stored_block_bytes: int
    label: str = "block store"
    location: str = ""
    store_causes: tuple[str, ...] = STORE_CAUSES
    load_causes: tuple[str, ...] = LOAD_CAUSES
    counters: tuple[str, ...] = ()
    delete_threads: int = 0
    delete_batch: int = 1000
    server_evicts: bool = False
    known_limit_bytes: int = 0
    read_only: bool = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Medium:
        # Without either member of a pair every block would fail at run time: refuse the medium when
        # created, as an abstract method would be refused.
        for many, one in (("write_many", "write_one"), ("read_many", "read_one")):
            if getattr(cls, many) is getattr(Medium, many) and getattr(cls, one) is getattr(Medium, one):
                raise TypeError(f"{cls.__name__} must implement Medium.{many} or Medium.{one}")
        return super().__new__(cls)

    # -- block I/O ---------------------------------------------------------------------------------
    def write_many(
        self,
        keys: Sequence[OffloadKey],
        block_ids: Sequence[int],
        slot: Callable[[int], memoryview],
        stopping: Callable[[], bool],
    ) -> list[WriteOutcome]:
        """Store ``keys[i]`` from primary slot ``block_ids[i]``, block format applied; each appears whole or not at all.

        The default calls :meth:`write_one` for each block in turn (override to send many at once).

        Args:
            keys: the blocks' keys (reserved in the index by the caller).
            block_ids: the primary slot of each.
            slot: primary slot ``block_id`` -> its flat ``memoryview`` (``block_bytes`` long, format ``"B"``).
            stopping: True once the store shuts down; a block not started then gets
                :class:`NotStartedError` (a batch already sent may finish).

        Returns:
            Per key: None (stored), :data:`PRESENT` (another writer stored it first) or the exception.
            An ``OSError`` for which :meth:`is_full` holds lowers the cap to what the medium holds.
        """
        out: list[WriteOutcome] = []
        for key, block_id in zip(keys, block_ids, strict=True):
            if stopping():
                out.append(NotStartedError(key.hex()))
                continue
            try:
                out.append(self.write_one(key, slot(block_id)))
            except Exception as exc:  # this block's failure, reported as its outcome; the others still go
                out.append(exc)
        return out

    def write_one(self, key: OffloadKey, payload: memoryview) -> Present | None:
        """Store one block: ``payload`` (``block_bytes``, format ``"B"``) with the block format; whole or not at all.

        Returns:
            None (stored) or :data:`PRESENT` (another writer stored it first).

        Raises:
            Exception: the block was not stored (``OSError`` as in :meth:`write_many`).
        """
        raise NotImplementedError(f"{type(self).__name__} implements neither write_many nor write_one")

    def read_many(
        self, keys: Sequence[OffloadKey], block_ids: Sequence[int], slot: Callable[[int], memoryview]
    ) -> list[BaseException | None]:
        """Read and verify ``keys[i]`` into primary slot ``block_ids[i]``; every block is attempted.

        A slot whose block did not verify holds no valid bytes (the job fails; they are never served).
        The default calls :meth:`read_one` for each block in turn (override to fetch many at once).

        Returns:
            Per key: None (read and verified) or the exception: ``FileNotFoundError`` (no such block),
            :class:`~tiering.core.format.BlockFormatError` (bad bytes: the store deletes the block),
            :class:`BlockNotReadyError` (shorter than a block: a miss, never deleted), another error.
        """
        out: list[BaseException | None] = []
        for key, block_id in zip(keys, block_ids, strict=True):
            try:
                self.read_one(key, slot(block_id))
                out.append(None)
            except Exception as exc:  # this block's failure, reported as its outcome; the others still go
                out.append(exc)
        return out

    def read_one(self, key: OffloadKey, target: memoryview) -> None:
        """Read one block into ``target`` (``block_bytes``, format ``"B"``) and verify it.

        Raises:
            Exception: as the outcomes of :meth:`read_many` (``FileNotFoundError``, ``BlockFormatError``,
                :class:`BlockNotReadyError`, another error); ``target`` then holds no valid bytes.
        """
        raise NotImplementedError(f"{type(self).__name__} implements neither read_many nor read_one")

    @abstractmethod
    def size(self, key: OffloadKey) -> int | None:
        """Bytes the medium holds for ``key``; None when absent (a block only counts at :attr:`stored_block_bytes`)."""

    def sizes(self, keys: Sequence[OffloadKey]) -> list[int | None]:
        """:meth:`size` of each key (override to ask the medium once for many)."""
        return [self.size(key) for key in keys]

    @abstractmethod
    def remove(self, key: OffloadKey) -> bool:
        """Delete ``key``'s block; True when it is gone (also when it was already), False on an error."""

    def remove_many(self, keys: Sequence[OffloadKey]) -> Sequence[bool | None]:
        """:meth:`remove` of each key, at most :attr:`delete_batch` keys (override to delete in one request).

        An override may answer None for keys it did not attempt because the medium refused the batch
        and :attr:`delete_batch` is lower now: the store sends those again in batches of the new size.
        A :meth:`remove` that raises fails only its own key (False, logged); the rest of the batch is tried.
        """
        return [self._remove_or_false(key) for key in keys]

    def _remove_or_false(self, key: OffloadKey) -> bool:
        try:
            return self.remove(key)
        except Exception as exc:
            logger.warning("%s: delete of %s raised: %s", self.label, key.hex(), exc)
            return False

    @abstractmethod
    def scan(self, stopping: Callable[[], bool]) -> ScanResult:
        """List the namespace once: whole blocks with size and store time, other writers' temporaries.

        May remove what is provably garbage (stale temporaries, wrong-sized final blocks) and count it
        in ``ScanResult.counters``; must stop early (``complete=False``) once ``stopping()``.

        Raises:
            Exception: the listing failed (a start-up scan that blocks raises it; a rescan logs it).
        """

    # -- namespace, space, pins --------------------------------------------------------------------
    def write_namespace_record(self, record: Mapping[str, Any]) -> None:
        """Publish the namespace record (every namespace field plus ``digest``) where tools find it; default: none.

        Called once by the store after the medium is opened, before the first scan.
        """
        return

    def free_bytes(self) -> int | None:
        """Bytes the medium reports free now; None when unknown (used after a write refused for lack of space)."""
        return None

    def is_full(self, exc: BaseException) -> bool:
        """Whether a write failed because the medium is full (the store then lowers its cap to what it holds)."""
        return isinstance(exc, OSError) and exc.errno in _FULL

    def pin_records(self) -> PinMedium | None:
        """Where pins are recorded, shared with other processes; None: this medium cannot keep pinned blocks."""
        return None

    # -- fleet-wide cap hooks (a cap shared by every process of the namespace) ---------------------
    def stored(self, keys: Sequence[OffloadKey]) -> Sequence[OffloadKey]:
        """Blocks this process just stored (new, not :data:`PRESENT`); returns keys the fleet's cap evicts now.

        The store forgets the returned keys (never counted by this process's cap) and deletes them.
        Default: no fleet-wide cap, nothing.
        """
        return ()

    def touched(self, keys: Sequence[OffloadKey]) -> bool:
        """``keys`` were used (lookup hit, load); True asks the store to call :meth:`flush` on an I/O thread soon."""
        return False

    def flush(self) -> None:
        """Send what :meth:`touched` queued (on an I/O thread)."""
        return

    # -- reporting and shutdown ----------------------------------------------------------------------
    def failure_cause(self, exc: BaseException, *, load: bool, in_index: bool = False) -> str:
        """The stats label of one block's failure (``store_failed_<cause>`` / ``load_failed_<cause>``).

        Args:
            exc: what :meth:`write_many` / :meth:`read_many` returned for the block.
            load: True for a load, False for a store.
            in_index: for a missing block on load, whether the store had it indexed
                (``vanished``: removed behind its back) or not (``missing``).
        """
        if isinstance(exc, NotStartedError):
            return "shutdown"
        if isinstance(exc, BlockNotReadyError):
            return "truncated"
        if isinstance(exc, BlockFormatError):
            return exc.reason if exc.reason in self.load_causes else "corrupt"
        if isinstance(exc, FileNotFoundError):
            return ("vanished" if in_index else "missing") if load else "io_error"
        if isinstance(exc, OSError):
            if exc.errno in _NO_SPACE:
                return "io_error" if load else "no_space"
            return "permission" if exc.errno in _DENIED else "io_error"
        return "internal"

    def stats(self) -> dict[str, int | float]:
        """The medium's own figures (not counters), merged into the store's ``stats()``."""
        return {}

    def close(self) -> None:
        """Release connections and descriptors; called once, after the store's threads stopped."""
        return

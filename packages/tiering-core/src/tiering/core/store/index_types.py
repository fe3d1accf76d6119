"""The value types of :mod:`tiering.core.store.index`: key states, admission answers, victims, reports."""

from __future__ import annotations

import dataclasses
import enum

from tiering.core.base import OffloadKey


class KeyState(enum.Enum):
    """What the index knows about one key."""

    RESIDENT = "resident"
    """Stored and complete: a tier answers ``lookup`` with True."""
    WRITING = "writing"
    """A store of it is in flight in this process: a tier answers None."""
    DELETING = "deleting"
    """Being deleted, or its delete failed: a tier answers False (its bytes still count)."""
    ABSENT = "absent"
    """Not known to the index (another process may hold it: a tier may probe)."""


class Admit(enum.Enum):
    """The answer of :meth:`CapacityIndex.reserve`."""

    RESERVED = "reserved"
    """Bytes reserved: write the block, then :meth:`CapacityIndex.commit`."""
    PRESENT = "present"
    """Already resident (now most recently used): nothing to write."""
    DELETING = "deleting"
    """Its old copy is being deleted: writing now could be undone by that delete; wait and retry."""
    NO_SPACE = "no_space"
    """No room even after evicting every resident block; :attr:`Reservation.can_wait` says whether waiting helps."""


@dataclasses.dataclass(frozen=True)
class Victim:
    """A block the caller must delete, then report with :meth:`CapacityIndex.deleted`.

    Attributes:
        key: the block's key.
        size: bytes it occupies (as accounted).
    """

    key: OffloadKey
    size: int


@dataclasses.dataclass(frozen=True)
class Reservation:
    """Result of :meth:`CapacityIndex.reserve`.

    Attributes:
        admit: what the caller does next (see :class:`Admit`).
        victims: blocks evicted to make room; delete them (even when
            ``admit`` is not RESERVED) and report each with :meth:`CapacityIndex.deleted`.
        can_wait: for NO_SPACE, True when writes in flight hold bytes that
            may be released (:meth:`CapacityIndex.wait_for_space`, then retry).
        ready: for RESERVED, whether the block may be written at once; False
            while the victims' bytes are still on the medium: delete the
            victims, then :meth:`CapacityIndex.wait_for_room` before writing.
    """

    admit: Admit
    victims: tuple[Victim, ...] = ()
    can_wait: bool = False
    ready: bool = True


@dataclasses.dataclass(frozen=True)
class ReconcileReport:
    """What :meth:`CapacityIndex.reconcile` changed.

    Attributes:
        added: keys the scan found that the index did not hold.
        vanished: resident keys the scan did not find (forgotten).
        deletes_confirmed: keys whose failed or pending delete the scan found gone (bytes freed).
    """

    added: tuple[OffloadKey, ...]
    vanished: tuple[OffloadKey, ...]
    deletes_confirmed: tuple[OffloadKey, ...]

"""Optional capabilities of a secondary tier, beside the contract of :class:`~tiering.core.base.SecondaryTierManager`.

The contract holds what every tier does (lookup, store, load, report, stats,
shutdown). What only some tiers can do is a :class:`typing.Protocol` here: a
tier has the capability when it defines the methods, and callers ask with
``isinstance`` (the protocols are runtime-checkable) or through the helpers
below, which answer for a tier without it (no pins, no events, no inspector).
The shape follows vLLM's tier contract, whose optional parts are hooks with
defaults, and fsspec, whose filesystems implement what their medium allows.

=====================  ===========================================================
capability             who offers it
=====================  ===========================================================
:class:`PinnableTier`  tiers that keep pin records with their blocks (fs, s3, redis)
:class:`EventSource`   tiers that announce stored / removed blocks (KV events)
:class:`Inspectable`   persistent tier classes: ``tiering ls / stat / gc / verify``
:class:`Probeable`     tier classes with a side-effect-free ``tiering check --probe``
:class:`ReportsProbe`  built tiers that say what their start-up probe found
:class:`LocalTier`     tier classes that can live in a local directory (``tiering bench``)
=====================  ===========================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tiering.core.base import OffloadKey

if TYPE_CHECKING:
    from tiering.core.events import KVEvent
    from tiering.core.inspection import TierInspector

__all__ = [
    "EventSource",
    "Inspectable",
    "LocalTier",
    "PinnableTier",
    "Probeable",
    "ReportsProbe",
    "can_pin",
    "take_events",
]


@runtime_checkable
class PinnableTier(Protocol):
    """A tier that can keep blocks from eviction for a while (pins recorded on its medium)."""

    def pin(self, keys: Sequence[OffloadKey], ttl_s: float) -> bool:
        """Keep ``keys`` from eviction for ``ttl_s`` seconds (all or none); blocks on the medium.

        A key not stored yet is pinned once stored within the pin's lifetime;
        pinning again extends a pin. The pin is recorded on the tier's medium
        (it outlives this process and ends by itself).

        Returns:
            True when every key is pinned; False when the pin was refused
            (pinning off, ``max_pinned_bytes`` would be passed, the medium
            failed): logged with the reason, counted in ``pins_refused``.
        """
        ...

    def unpin(self, keys: Sequence[OffloadKey]) -> None:
        """End the pins of ``keys`` now (they become evictable)."""
        ...

    @property
    def pinning(self) -> bool:
        """Whether :meth:`pin` can succeed here (pinning on: ``max_pinned_bytes`` > 0). No I/O."""
        ...


@runtime_checkable
class EventSource(Protocol):
    """A tier that announces the blocks it stored and removed (:mod:`tiering.core.events`)."""

    def take_events(self) -> list[KVEvent]:
        """KV events since the last call, oldest first (a :class:`~tiering.core.events.KVEventLog`'s)."""
        ...


@runtime_checkable
class Inspectable(Protocol):
    """A persistent tier class whose stored blocks can be walked offline, without an engine."""

    @classmethod
    def inspector(cls, tier_config: Mapping[str, Any]) -> TierInspector | None:
        """An inspector of the blocks a config entry's tier holds; must start no thread and write nothing."""
        ...


@runtime_checkable
class Probeable(Protocol):
    """A tier class that can check its root, bucket or server without creating anything."""

    @classmethod
    def probe(cls, tier_config: Mapping[str, Any]) -> str | None:
        """One line saying what was found (never a credential); None: build the tier to probe it.

        Raises:
            ValueError: the entry cannot work (the message says why).
        """
        ...


@runtime_checkable
class ReportsProbe(Protocol):
    """A built tier that says what its start-up probe found (``tiering check --probe`` prints it)."""

    def probe_report(self) -> list[str]:
        """One line each (server limits, fallbacks); never a credential."""
        ...


@runtime_checkable
class LocalTier(Protocol):
    """A tier class that can keep its blocks in a local directory."""

    @classmethod
    def default_local_config(cls, directory: str) -> dict[str, Any] | None:
        """A ``secondary_tiers`` entry (``type`` included) for this tier under ``directory``; None: cannot."""
        ...


def can_pin(tier: object) -> bool:
    """Whether ``tier`` is a :class:`PinnableTier` with pinning on (no I/O)."""
    return isinstance(tier, PinnableTier) and bool(tier.pinning)


def take_events(tier: object) -> list[KVEvent]:
    """``tier.take_events()`` for an :class:`EventSource`; ``[]`` for a tier that announces nothing."""
    return list(tier.take_events()) if isinstance(tier, EventSource) else []

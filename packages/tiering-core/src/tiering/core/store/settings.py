"""The knobs of an indexed block store that come from its tier's configuration."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["LOOKUP_FALLBACKS", "StoreSettings", "config_values", "inspecting", "is_inspecting"]

_INSPECTING: contextvars.ContextVar[bool] = contextvars.ContextVar("tiering_inspecting", default=False)


@contextlib.contextmanager
def inspecting() -> Iterator[None]:
    """Open every tier built in this context read-only (the inspection commands use it).

    Such a tier never changes a block: no eviction down to its cap (whatever cap its config's defaults
    carry), no TTL expiry, no retry of failed deletes, no removal of stale temporaries or damaged files
    at its scans (a medium honours :attr:`~tiering.core.store.medium.Medium.read_only`), no namespace
    record written. Pins and stats still work: ``tiering pin`` writes only pin records.
    """
    token = _INSPECTING.set(True)
    try:
        yield
    finally:
        _INSPECTING.reset(token)


def is_inspecting() -> bool:
    """Whether tiers built now open read-only (:func:`inspecting`)."""
    return _INSPECTING.get()


LOOKUP_FALLBACKS = ("stat", "async", "off")
"""How a lookup of a key missing from the index asks the medium (see :class:`StoreSettings`)."""


@dataclasses.dataclass(frozen=True)
class StoreSettings:
    """What :class:`~tiering.core.store.tier.IndexedTier` needs from a tier's checked configuration.

    :meth:`from_config` takes each field from the config key of the same name when the tier declares it
    (the defaults below otherwise), so a tier whose schema uses these names needs no mapping.

    Attributes:
        capacity_bytes: cap on the bytes of stored blocks (and other writers' temporaries) in this
            process's account; None: unbounded. At least one stored block.
        max_pinned_bytes: bound on the bytes of pinned blocks; 0 turns pinning off.
        tenants: per-tenant quotas and TTL (:mod:`tiering.core.policies.tenancy`); None: off.
        n_read_threads: I/O threads serving loads and lookup probes, >= 1.
        n_write_threads: I/O threads serving stores (0: the readers serve stores too).
        lookup_fallback: a key missing from the index is asked of the medium: ``"stat"`` (on the
            scheduler thread, at once), ``"async"`` (in the background; the lookup answers None meanwhile)
            or ``"off"`` (a miss once the start-up scan is done).
        startup_scan: ``"background"`` (a thread; the constructor waits up to ``startup_scan_wait_s``),
            ``"blocking"`` (in the constructor; a failure raises) or ``"off"``.
        startup_scan_wait_s: seconds the constructor waits for a background start-up scan.
        rescan_interval_s: seconds between rescans (only with a cap or tenants; 0: none).
        min_batch: blocks an I/O thread takes at least per share when it can (the medium's batch is
            cheaper per block), and readers help writers with as many unless ``help_batch`` says otherwise.
        max_batch: blocks at most per share.
        room_wait_s: seconds a store waits for the deletes of the blocks evicted for it to free its room
            before it fails as ``no_space`` (a remote medium's deletes take longer than unlinks).
        help_batch: write items a reader takes at once when it helps with stores (None: ``min_batch``); with
            no writer threads every store share is at most this many blocks.
    """

    capacity_bytes: int | None = None
    max_pinned_bytes: int = 0
    tenants: Mapping[str, Any] | None = None
    n_read_threads: int = 8
    n_write_threads: int = 4
    lookup_fallback: str = "stat"
    startup_scan: str = "background"
    startup_scan_wait_s: float = 2.0
    rescan_interval_s: float = 30.0
    min_batch: int = 1
    max_batch: int = 16
    room_wait_s: float = 1.0
    help_batch: int | None = None

    def __post_init__(self) -> None:
        if self.lookup_fallback not in LOOKUP_FALLBACKS:
            raise ValueError(f"lookup_fallback must be one of {LOOKUP_FALLBACKS}, got {self.lookup_fallback!r}")
        if self.startup_scan not in ("background", "blocking", "off"):
            raise ValueError(f"startup_scan must be background, blocking or off, got {self.startup_scan!r}")

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **overrides: Any) -> StoreSettings:
        """The settings named in ``config`` (a checked entry), then ``overrides``; the rest default."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in config.items() if k in names}
        values.update(overrides)
        return cls(**values)


def config_values(config: Any) -> dict[str, Any]:
    """A checked config as a dict: a dataclass instance's fields, or the mapping itself (copied)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return dict(config)

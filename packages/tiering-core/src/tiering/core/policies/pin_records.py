"""Pinned blocks: kept from eviction until their pin expires, the pins recorded on the tier's medium.

A pin says "keep block K in this tier until time T" (``T`` in seconds since
the epoch, wall clock). The record of every pin lives on the medium next to
the blocks (a marker file, a marker object, a Redis sorted set: each tier's
:class:`PinMedium`), never only in one process's memory, so:

- every process sharing the tier honours every process's pins (from its
  next :meth:`PinBook.refresh`: at a pin or unpin, and every
  ``refresh_interval_s`` on the tier's I/O threads);
- a pin outlives the process that made it, a restart keeps it, and a pin
  nobody renews ends at ``T`` by itself: a crash leaves no eternal pin
  (expired records are removed by the next refresh of any process, and are
  ignored until then).

:class:`PinBook` is what a tier keeps: the pins as last read (key ->
expiry), the bound ``max_pinned_bytes`` (every key pinned, stored or not,
counts ``block_bytes``; a pin past the bound is refused as a whole with
:class:`PinRefusedError` and counted), and :meth:`PinBook.protects`, the
question a :class:`~tiering.core.store.index.CapacityIndex` asks before
it evicts a block (its ``keep`` hook). A key may be pinned before it is
stored: the pin applies when it is stored within the pin's lifetime.
Pinning again extends the expiry (never shortens it); :meth:`PinBook.unpin`
ends a pin at once. An expiry saturates at :data:`MAX_PIN_EXPIRY_S` (the
end of the year 9999): a TTL of any size pins until then, and every record
written is one every reader parses.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

from tiering.core.base import OffloadKey
from tiering.core.schema import ConfigKey

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_PIN_EXPIRY_S",
    "PIN_STATS",
    "PinBook",
    "PinMedium",
    "PinRefusedError",
    "PinningTier",
    "marker_name",
    "parse_marker",
]

MAX_PINNED_BYTES = ConfigKey(
    "max_pinned_bytes",
    (int,),
    default=0,
    minimum=0,
    size=True,
    doc="bound on the bytes of the blocks pinned in this tier (0: pinning off)",
)
"""The pin bound every tier that can pin declares (:mod:`tiering.core.policies.pin_records`)."""


def pins_below_capacity(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    """An :data:`EntryCheck`: ``max_pinned_bytes`` must leave room under ``capacity_bytes`` for unpinned blocks."""
    pinned, cap = entry.get("max_pinned_bytes") or 0, entry.get("capacity_bytes")
    if pinned and isinstance(cap, int) and pinned >= cap:
        return "max_pinned_bytes", f"must be below capacity_bytes ({cap}), got {pinned}"
    return None


PIN_STATS = ("pinned_blocks", "pinned_bytes", "pins_pending", "pins_refused", "max_pinned_bytes")
"""The figures of :meth:`PinBook.stats` (in the stats vocabulary)."""


MAX_PIN_EXPIRY_S = 253_402_300_799.0
"""The latest pin expiry (epoch seconds: 9999-12-31 23:59:59 UTC); a later one saturates to it."""

MARKER_RE = re.compile(r"^((?:[0-9a-f]{2})+)\.([0-9]{1,20})\.pin$")
"""The name of a pin marker (file or object) of media that keep one marker per pin: key hex, expiry in ms.

Up to 20 digits are read (records written before expiries saturated had up to 19); :func:`marker_name`
writes at most 15."""


def saturate_expiry(expiry: float) -> float:
    """``expiry`` (epoch seconds), at most :data:`MAX_PIN_EXPIRY_S`."""
    return min(expiry, MAX_PIN_EXPIRY_S)


def marker_name(key: bytes, expiry: float) -> str:
    """The marker name pinning ``key`` until ``expiry`` (epoch seconds, kept to the millisecond; saturated)."""
    return f"{key.hex()}.{round(saturate_expiry(expiry) * 1000)}.pin"


def parse_marker(name: str) -> tuple[OffloadKey, float] | None:
    """``(key, expiry seconds)`` of a marker name (:func:`marker_name`, saturated); None for any other name."""
    match = MARKER_RE.match(name)
    if match is None:
        return None
    return OffloadKey(bytes.fromhex(match.group(1))), saturate_expiry(int(match.group(2)) / 1000)


class PinRefusedError(ValueError):
    """A pin that cannot be taken: pinning is off, the tier cannot pin, or ``max_pinned_bytes`` would be passed."""


class PinMedium(Protocol):
    """Where a tier keeps its pin records; every method may block on the medium and raise its I/O errors."""

    def list_pins(self) -> Iterable[tuple[OffloadKey, float]]:
        """Every pin record ``(key, expiry)``, expired and superseded ones included (expiry: epoch seconds)."""

    def write_pins(self, keys: Sequence[OffloadKey], expiry: float) -> None:
        """Record a pin of each of ``keys`` until ``expiry``; each record appears whole or not at all."""

    def remove_pins(self, records: Sequence[tuple[OffloadKey, float]]) -> None:
        """Remove these records (as listed); records already gone are no error."""


class PinBook:
    """The pins of one tier instance, as last read from its medium, and the bound on them.

    Thread safe; :meth:`protects` takes no lock (called under the index's lock on every eviction).

    Args:
        medium: the tier's pin records; None: this tier cannot pin (every pin is refused).
        max_pinned_bytes: bound on ``block_bytes`` x keys pinned (stored or not); 0: pinning is off.
        block_bytes: bytes one pinned block counts (as the tier stores it, headers included).
        label: the tier, for messages (``"fs tier /var/cache/x"``).
        refresh_interval_s: how often :meth:`due` asks for a refresh (other processes' pins, expiry).
        clock: wall clock in seconds since the epoch (tests pass their own).

    Raises:
        ValueError: ``max_pinned_bytes`` or ``block_bytes`` is negative, or ``refresh_interval_s`` is not positive.
    """

    def __init__(
        self,
        medium: PinMedium | None,
        max_pinned_bytes: int,
        block_bytes: int,
        label: str,
        refresh_interval_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_pinned_bytes < 0 or block_bytes < 0:
            raise ValueError(f"max_pinned_bytes and block_bytes must be >= 0, got {max_pinned_bytes}, {block_bytes}")
        if refresh_interval_s <= 0:
            raise ValueError(f"refresh_interval_s must be > 0, got {refresh_interval_s}")
        self.medium = medium
        self.max_pinned_bytes = max_pinned_bytes
        self.block_bytes = block_bytes
        self.label = label
        self.refresh_interval_s = refresh_interval_s
        self.clock = clock
        self._expiry: dict[OffloadKey, float] = {}  # replaced whole on refresh: readers need no lock
        self._lock = threading.Lock()  # one medium round at a time
        self._last_refresh = float("-inf")  # monotonic seconds of the latest read (or queued refresh)
        self._refused = 0
        self._count_lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether this tier takes pins at all (a medium and ``max_pinned_bytes`` > 0)."""
        return self.medium is not None and self.max_pinned_bytes > 0

    def protects(self, key: OffloadKey) -> bool:
        """Whether ``key`` is pinned now (must not be evicted). No lock, no I/O."""
        return self.expiry(key) is not None

    def expiry(self, key: OffloadKey) -> float | None:
        """When the pin of ``key`` ends (epoch seconds); None when it is not pinned now. No lock, no I/O."""
        expiry = self._expiry.get(key)
        return expiry if expiry is not None and expiry > self.clock() else None

    def pinned(self) -> dict[OffloadKey, float]:
        """The live pins as last read: key -> expiry (epoch seconds)."""
        now = self.clock()
        return {k: e for k, e in self._expiry.items() if e > now}

    def due(self) -> bool:
        """Whether a :meth:`refresh` is due; True once per interval (the caller queues it on an I/O thread). Cheap."""
        now = time.monotonic()
        if not self.enabled or now - self._last_refresh < self.refresh_interval_s:
            return False
        self._last_refresh = now  # one queued refresh per interval, however many stores ask
        return True

    def refresh(self) -> None:
        """Read every pin record from the medium; remove the expired and superseded ones (best effort).

        Never raises: a medium error is logged and the pins as last read stay in force (those that
        expire meanwhile end as they should). Does nothing while pinning is off (no request to the medium):
        every process sharing a tier sets ``max_pinned_bytes`` for all of them to honour the pins.
        """
        if not self.enabled:
            return
        try:
            with self._lock:
                self._read()
        except Exception as exc:
            logger.warning("%s: reading the pin records failed (the last read stays in force): %s", self.label, exc)

    def refresh_soon(self, submit_call: Callable[[Literal["read"], Callable[[], None]], None]) -> None:
        """Queue a :meth:`refresh` with ``submit_call("read", fn)`` (an I/O pool's) when one is :meth:`due`."""
        if self.due():
            submit_call("read", self.refresh)

    def _read(self) -> None:
        assert self.medium is not None
        self._last_refresh = time.monotonic()
        now = self.clock()
        latest: dict[OffloadKey, float] = {}
        records = list(self.medium.list_pins())
        for key, expiry in records:
            if expiry > latest.get(key, float("-inf")):
                latest[key] = expiry
        stale = [(k, e) for k, e in records if e <= now or e < latest[k]]
        self._expiry = {k: e for k, e in latest.items() if e > now}
        if stale:
            try:
                self.medium.remove_pins(stale)
            except Exception as exc:  # they are ignored while they stay: removed by a later refresh
                logger.warning("%s: removing %d expired pin records failed: %s", self.label, len(stale), exc)

    def pin(self, keys: Sequence[OffloadKey], ttl_s: float) -> float:
        """Pin ``keys`` for ``ttl_s`` seconds from now (all or none); returns the expiry (epoch seconds).

        Keys already pinned keep the later of their expiry and the new one.

        Raises:
            ValueError: ``ttl_s`` is not positive.
            PinRefusedError: pinning is off, the tier cannot pin, or the keys would pin more than
                ``max_pinned_bytes`` (the message says which); counted in ``pins_refused``.
            Exception: what the medium raised (nothing is pinned then).
        """
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 seconds, got {ttl_s}")
        unique = list(dict.fromkeys(keys))
        if not self.enabled:
            why = (
                "this tier cannot pin"
                if self.medium is None
                else (
                    "pinning is off (max_pinned_bytes is 0: set it in the tier's config, or pass tiering pin "
                    "--max-pinned-bytes SIZE)"
                )
            )
            self._refuse(len(unique))
            raise PinRefusedError(f"{self.label}: {why}")
        assert self.medium is not None
        with self._lock:
            self._read()
            live = self._expiry
            new = sum(1 for k in unique if k not in live)
            total = (len(live) + new) * self.block_bytes
            if total > self.max_pinned_bytes:
                self._refuse(len(unique))
                raise PinRefusedError(
                    f"{self.label}: pinning {new} more blocks would pin {total} bytes, over max_pinned_bytes "
                    f"{self.max_pinned_bytes} ({len(live)} blocks, {len(live) * self.block_bytes} bytes pinned now)"
                )
            expiry = saturate_expiry(self.clock() + ttl_s)  # a TTL of any size: no record a reader cannot parse
            try:
                self.medium.write_pins(unique, expiry)
            except Exception:  # all or none: take back the records already written (best effort)
                with contextlib.suppress(Exception):
                    self.medium.remove_pins([(k, expiry) for k in unique])
                raise
            superseded = [(k, live[k]) for k in unique if k in live and live[k] < expiry]
            self._expiry = {**live, **{k: max(expiry, live.get(k, expiry)) for k in unique}}
            if superseded:
                try:
                    self.medium.remove_pins(superseded)
                except Exception as exc:  # the later record wins anyway
                    logger.warning(
                        "%s: removing %d superseded pin records failed: %s", self.label, len(superseded), exc
                    )
        return expiry

    def unpin(self, keys: Sequence[OffloadKey]) -> int:
        """End the pins of ``keys`` now (they become evictable); returns how many were pinned.

        Raises:
            Exception: what the medium raised (the pins stay then).
        """
        if self.medium is None:
            return 0
        wanted = set(keys)
        with self._lock:
            records = [(k, e) for k, e in self.medium.list_pins() if k in wanted]
            if records:
                self.medium.remove_pins(records)
            gone = {k for k, _ in records}
            self._expiry = {k: e for k, e in self._expiry.items() if k not in wanted}
        return len(gone)

    def try_pin(self, keys: Sequence[OffloadKey], ttl_s: float) -> bool:
        """:meth:`pin`, answered True or False: a refusal or a medium error is logged (warning) and counted."""
        try:
            self.pin(keys, ttl_s)
            return True
        except PinRefusedError as exc:
            logger.warning("pin refused: %s", exc)
        except Exception as exc:
            self._refuse(len(set(keys)))
            logger.warning("%s: pin of %d blocks failed: %s", self.label, len(keys), exc)
        return False

    def try_unpin(self, keys: Sequence[OffloadKey]) -> None:
        """:meth:`unpin`; a medium error is logged (the pins then end at their expiry)."""
        try:
            self.unpin(keys)
        except Exception as exc:
            logger.warning(
                "%s: unpin of %d blocks failed (they stay pinned until they expire): %s", self.label, len(keys), exc
            )

    def _refuse(self, n: int) -> None:
        with self._count_lock:
            self._refused += n

    def stats(self, is_resident: Callable[[OffloadKey], bool]) -> dict[str, int]:
        """The pin figures (:data:`PIN_STATS`); ``is_resident`` tells which pinned keys the tier holds.

        ``pinned_blocks`` / ``pinned_bytes`` (pinned and stored), ``pins_pending`` (pinned, not stored here),
        ``pins_refused`` (keys whose pin was refused), ``max_pinned_bytes``.
        """
        live = self.pinned()
        stored = sum(1 for k in live if is_resident(k))
        return {
            "pinned_blocks": stored,
            "pinned_bytes": stored * self.block_bytes,
            "pins_pending": len(live) - stored,
            "pins_refused": self._refused,
            "max_pinned_bytes": self.max_pinned_bytes,
        }


class PinningTier:
    """Mixin of a tier that keeps a :class:`PinBook` as ``self.pins``: ``pin`` / ``unpin`` of the tier contract."""

    pins: PinBook

    def pin(self, keys: Sequence[OffloadKey], ttl_s: float) -> bool:
        """See :meth:`tiering.core.capabilities.PinnableTier.pin` (:meth:`PinBook.try_pin`)."""
        return self.pins.try_pin(keys, ttl_s)

    def unpin(self, keys: Sequence[OffloadKey]) -> None:
        """See :meth:`tiering.core.capabilities.PinnableTier.unpin` (:meth:`PinBook.try_unpin`)."""
        self.pins.try_unpin(keys)

    @property
    def pinning(self) -> bool:
        """See :attr:`tiering.core.capabilities.PinnableTier.pinning` (:attr:`PinBook.enabled`)."""
        return self.pins.enabled

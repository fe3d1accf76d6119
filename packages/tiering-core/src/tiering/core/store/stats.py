"""One stats vocabulary: the key names every tier's ``stats()`` uses, documented once.

A tier returns a flat ``dict[str, int | float]``; keys with the same meaning
have the same name in every tier, so ``tiering stat``, the metrics exporter
(:mod:`tiering.core.runtime.metrics`) and dashboards need no per-tier table. The
names are listed in :data:`STATS` (kind, unit, meaning); tier-specific
figures (``o_direct``, ``conditional_put_supported``, ``errors_<class>``...)
are allowed besides them.

Renamed from earlier backend releases (see the CHANGELOGs): ``inflight_jobs``
-> ``in_flight_jobs``; ``inflight_stores`` / ``inflight_loads`` ->
``in_flight_stores`` / ``in_flight_loads``; ``stores_skipped_present`` ->
``stores_already_present``; ``delete_failures`` -> ``failed_deletes``;
``heads_sent`` / ``heads_skipped`` -> ``lookup_probes`` /
``lookup_probes_skipped``; ``bad_files_removed`` -> ``bad_blocks_removed``.
``resident_blocks`` / ``resident_bytes`` (not "stored_blocks"), so that they
cannot be confused with the counters ``blocks_stored`` / ``bytes_stored``.

:class:`Counters` is a small thread-safe counter set that starts every
declared counter at 0, so a tier's ``stats()`` always has the same keys.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Iterable, Mapping
from typing import Literal

Kind = Literal["counter", "gauge"]


@dataclasses.dataclass(frozen=True)
class Stat:
    """One key of the vocabulary.

    Attributes:
        kind: ``"counter"`` (only grows while the tier lives) or ``"gauge"``.
        unit: ``"blocks"``, ``"bytes"``, ``"jobs"``, ``"keys"``, ``"seconds"``, ``"requests"``, ``"processes"``
            or ``"flag"``.
        meaning: one line.
    """

    kind: Kind
    unit: str
    meaning: str


STATS: Mapping[str, Stat] = {
    # lookups
    "lookups_hit": Stat("counter", "keys", "lookups answered True"),
    "lookups_miss": Stat("counter", "keys", "lookups answered False"),
    "lookups_pending": Stat("counter", "keys", "lookups answered None (store or probe in flight)"),
    "lookup_probes": Stat("counter", "keys", "keys checked against the storage for a lookup (HEAD, stat, EXISTS)"),
    "lookup_probes_skipped": Stat("counter", "keys", "lookups answered False because too many probes were pending"),
    # stores
    "blocks_stored": Stat("counter", "blocks", "blocks written by this process"),
    "bytes_stored": Stat("counter", "bytes", "payload bytes written (block bytes, headers excluded)"),
    "stores_already_present": Stat("counter", "blocks", "blocks of store jobs the tier already held (not rewritten)"),
    "store_failures": Stat("counter", "blocks", "blocks whose store failed (any cause)"),
    "store_jobs_failed": Stat("counter", "jobs", "store jobs reported failed"),
    "store_failed_<cause>": Stat("counter", "blocks", "blocks whose store failed, by cause (no_space, io_error, ...)"),
    # loads
    "blocks_loaded": Stat("counter", "blocks", "blocks read and verified into primary slots"),
    "bytes_loaded": Stat("counter", "bytes", "payload bytes loaded"),
    "load_failures": Stat("counter", "blocks", "blocks whose load failed (any cause)"),
    "verify_failures": Stat(
        "counter", "blocks", "blocks refused by verification (checksum, truncated, foreign, corrupt)"
    ),
    "load_jobs_failed": Stat("counter", "jobs", "load jobs reported failed"),
    "load_failed_<cause>": Stat("counter", "blocks", "blocks whose load failed, by cause (checksum, missing, ...)"),
    "bad_blocks_removed": Stat("counter", "blocks", "blocks deleted because they did not verify or had a wrong size"),
    # capacity and eviction
    "resident_blocks": Stat("gauge", "blocks", "blocks the tier answers True for"),
    "resident_bytes": Stat("gauge", "bytes", "bytes of those blocks as stored (headers/trailers included)"),
    "used_bytes": Stat(
        "gauge", "bytes", "bytes counted against the cap: resident + in-flight writes + pending deletes"
    ),
    "capacity_bytes": Stat("gauge", "bytes", "the cap (0: unbounded)"),
    "evictions": Stat("counter", "blocks", "blocks evicted to make room"),
    "evicted_bytes": Stat("counter", "bytes", "bytes evicted to make room"),
    "failed_deletes": Stat("counter", "blocks", "deletes that failed (bytes stay counted until retried or rescanned)"),
    "pending_delete_bytes": Stat("gauge", "bytes", "bytes of blocks whose delete is pending or failed"),
    "reserved_bytes": Stat("gauge", "bytes", "bytes reserved for writes in flight"),
    "room_wait_bytes": Stat(
        "gauge", "bytes", "bytes reserved for stores that wait for evicted blocks' deletes to free their room"
    ),
    # pins
    "pinned_blocks": Stat("gauge", "blocks", "blocks stored and pinned (never evicted before their pin expires)"),
    "pinned_bytes": Stat("gauge", "bytes", "bytes of those blocks as stored"),
    "pins_pending": Stat("gauge", "keys", "keys pinned but not stored in this tier (pinned once stored)"),
    "pins_refused": Stat("counter", "keys", "keys whose pin was refused (over max_pinned_bytes, or pinning off)"),
    "max_pinned_bytes": Stat("gauge", "bytes", "the bound on pinned bytes (0: pinning off)"),
    # tenants (a tier with a ``tenants`` config)
    "quota_evictions": Stat("counter", "blocks", "blocks a tenant's store evicted from its own, at its quota"),
    "expirations": Stat("counter", "blocks", "blocks found past their tenant's TTL, removed as misses"),
    "tenant:<name>:<figure>": Stat(
        "gauge",
        "bytes",
        "per tenant: resident_bytes/_blocks, reserved_bytes, quota_bytes, quota_evictions, expirations",
    ),
    # work in flight
    "in_flight_jobs": Stat("gauge", "jobs", "jobs accepted and not yet reported"),
    "in_flight_stores": Stat("gauge", "keys", "keys being written"),
    "in_flight_loads": Stat("gauge", "keys", "keys being read"),
    "forks": Stat("counter", "processes", "children forked since the tier was built (their copy refuses work)"),
    # scans
    "scans": Stat("counter", "requests", "listings of the namespace (start-up scan and rescans)"),
    "last_scan_s": Stat("gauge", "seconds", "duration of the last listing"),
    "temps_removed": Stat("counter", "blocks", "stale temporary files or objects removed"),
}
"""Every vocabulary key; ``<cause>`` stands for a cause label."""

VERIFY_CAUSES = ("checksum", "truncated", "foreign", "corrupt")
"""Load failure causes that count as ``verify_failures``."""


def is_known(name: str) -> bool:
    """Whether ``name`` is a vocabulary key (``store_failed_x`` / ``load_failed_x`` / ``tenant:x:y`` included)."""
    if name in STATS or (name.startswith("tenant:") and name.count(":") >= 2):
        return True
    return name.startswith(("store_failed_", "load_failed_")) and len(name) > len("load_failed_")


def failure_totals(stats: Mapping[str, int | float]) -> dict[str, int]:
    """``store_failures``, ``load_failures`` and ``verify_failures`` summed from the ``*_failed_<cause>`` keys."""
    out = {"store_failures": 0, "load_failures": 0, "verify_failures": 0}
    for name, value in stats.items():
        if name.startswith("store_failed_"):
            out["store_failures"] += int(value)
        elif name.startswith("load_failed_"):
            out["load_failures"] += int(value)
            if name.removeprefix("load_failed_") in VERIFY_CAUSES:
                out["verify_failures"] += int(value)
    return out


class Counters:
    """Thread-safe named counters that start at 0 (so ``stats()`` always has the declared keys).

    Args:
        names: counters present from the start.
    """

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: collections.Counter[str] = collections.Counter({name: 0 for name in names})

    def inc(self, name: str, n: int = 1) -> None:
        """Add ``n`` to ``name``."""
        with self._lock:
            self._values[name] += n

    def add(self, values: Mapping[str, int]) -> None:
        """Add several counters in one lock round."""
        counts = self._values
        with self._lock:
            for name, n in values.items():  # (Counter.update is a slower Python loop of its own)
                counts[name] += n

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter."""
        with self._lock:
            return dict(self._values)

"""Metrics of a tier stack: counters, gauges and latency histograms per tier.

Every figure is kept here as plain numbers (:meth:`StackMetrics.snapshot`);
:mod:`tiering.core.runtime.prometheus` exposes the same snapshot through
``prometheus_client`` when the ``metrics`` extra is installed. Names follow
Prometheus conventions under the prefix ``tiering_`` (``_total`` counters,
``_bytes`` sizes, ``_seconds`` durations); every sample carries the labels
``tier`` (the tier type, ``primary`` for the CPU tier) and ``index`` (the
position in ``secondary_tiers``, ``primary`` for the CPU tier).

Tiers contribute their own figures through
:meth:`~tiering.core.base.SecondaryTierManager.stats`, named by the stats
vocabulary (:data:`tiering.core.store.stats.STATS`): the keys
``resident_blocks``, ``resident_bytes``, ``used_bytes``,
``pending_delete_bytes``, ``capacity_bytes`` (gauges), ``evictions``,
``failed_deletes`` and ``store_failed_<cause>`` / ``load_failed_<cause>``
(counters of blocks; causes such as ``checksum``, ``truncated``, ``foreign``,
``io_error``, ``timeout``, ``throttled``, ``no_space``).
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
from collections import defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tiering.core.runtime.manager import TieringManager

PREFIX = "tiering_"

LATENCY_BUCKETS_S = tuple(m * 10.0**e for e in range(-5, 2) for m in (1.0, 2.0, 5.0))
"""Upper bounds (seconds) of the store/load job latency histograms."""

COUNTERS = {
    "lookups_total": "Block lookups answered by the tier, by outcome (hit, miss, in_flight).",
    "blocks_stored_total": "Blocks written into the tier.",
    "stored_bytes_total": "Bytes written into the tier.",
    "blocks_loaded_total": "Blocks read out of the tier (promotions; primary tier: blocks handed to the engine).",
    "loaded_bytes_total": "Bytes read out of the tier.",
    "store_failures_total": "Blocks or jobs that failed to store, by cause.",
    "load_failures_total": "Blocks or jobs that failed to load, by cause.",
    "evictions_total": "Blocks evicted to make room.",
    "failed_deletes_total": "Deletes (evictions, bad blocks) that failed; their bytes stay counted until retried.",
    "jobs_total": "Transfer jobs finished, by kind (store, load) and outcome (ok, failed).",
    "store_admission_total": (
        "Blocks a store offered to a tier with an admission policy, by outcome (admitted: written, declined: not)."
    ),
    "tier_errors_total": "Exceptions raised by a tier's methods (each turned into a miss or a failed job).",
    "store_offers_total": (
        "Blocks offered to a secondary tier's store, by origin (store: a primary store; fill: loaded from a lower "
        "tier; resighted: a resident block seen again, for second_sighting) and outcome (held: the tier had it, "
        "touched and not written again; offered: passed to admission, then written)."
    ),
    "store_job_failed_blocks_total": "Blocks of the store jobs the tier reported failed (causes: store_failures).",
    "loads_declined_total": (
        "Blocks found in the tier and left to recompute because loading them was predicted not to pay, "
        "by reason (cost, max_load_s, probing); counted once per request."
    ),
    "loads_unused_blocks_total": (
        "Blocks of loads whose request ended before the engine took them, by state (in_flight: still being "
        "promoted, its slots released when the job reports; reported: promoted and not completed, released "
        "at once)."
    ),
}
GAUGES = {
    "resident_blocks": "Blocks held by the tier.",
    "resident_bytes": "Bytes held by the tier.",
    "capacity_bytes": "Capacity of the tier in bytes (0: unbounded).",
    "used_bytes": "Bytes counted against the cap: resident, being written, and pending or failed deletes.",
    "pending_delete_bytes": "Bytes of blocks whose delete is pending or failed (still stored).",
    "in_flight_jobs": "Transfer jobs submitted to the tier and not yet reported.",
    "in_flight_store_blocks": "Blocks of the store jobs submitted to the tier and not yet reported.",
    "load_model_latency_seconds": "The cost model's fitted latency of one load job of the tier.",
    "load_model_bytes_per_second": "The cost model's fitted load throughput of the tier (0: not measured yet).",
    "recompute_tokens_per_second": "The recompute rate the cost model uses (0: unknown), labelled by its source.",
}
HISTOGRAMS = {
    "store_duration_seconds": "Time from submitting a store job to its report.",
    "load_duration_seconds": "Time from submitting a load (promotion) job to its report.",
    "load_predicted_seconds": "The cost model's predicted duration of each load job (compare load_duration_seconds).",
    "load_prediction_ratio": "Actual over predicted duration of each load job (1: exact; the model's error).",
}

Labels = tuple[tuple[str, str], ...]


@dataclasses.dataclass
class Histogram:
    """Cumulative-bucket histogram of durations in seconds (Prometheus semantics)."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = dataclasses.field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def copy(self) -> Histogram:
        """An independent copy."""
        return Histogram(self.buckets, list(self.counts), self.total, self.count)

    def observe(self, seconds: float) -> None:
        """Record one duration."""
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` pairs, ending with ``("+Inf", count)``."""
        out, running = [], 0
        for bound, n in zip((*map(str, self.buckets), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding quantile ``q`` (0..1); 0.0 when empty."""
        if not self.count:
            return 0.0
        target, running = q * self.count, 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            if running >= target:
                return bound
        return float("inf")


def label_key(labels: dict[str, str]) -> Labels:
    """The canonical (sorted) tuple form of ``labels``."""
    return tuple(sorted(labels.items()))


def tier_labels(tier: str, index: int | None) -> dict[str, str]:
    """Labels of a tier: ``index`` None means the CPU primary tier."""
    return {"tier": tier, "index": "primary" if index is None else str(index)}


class StackMetrics:
    """Thread-safe counters and histograms of one stack (the manager records, a scrape reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, dict[Labels, float]] = defaultdict(lambda: defaultdict(float))
        self._histograms: dict[str, dict[Labels, Histogram]] = defaultdict(dict)

    def inc(self, name: str, labels: dict[str, str] | Labels, value: float = 1.0) -> None:
        """Add ``value`` to counter ``name`` (a key of :data:`COUNTERS`).

        Args:
            name: the counter.
            labels: a dict, or a tuple made once by :func:`label_key` (the
                fast path for per-block calls on the scheduler's thread).
            value: the increment.

        Raises:
            KeyError: ``name`` is not a declared counter.
        """
        if name not in COUNTERS:
            raise KeyError(f"unknown counter {name!r}")
        key = labels if isinstance(labels, tuple) else label_key(labels)
        with self._lock:
            self._counters[name][key] += value

    def observe(self, name: str, labels: dict[str, str], seconds: float) -> None:
        """Record a duration in histogram ``name`` (a key of :data:`HISTOGRAMS`).

        Raises:
            KeyError: ``name`` is not a declared histogram.
        """
        if name not in HISTOGRAMS:
            raise KeyError(f"unknown histogram {name!r}")
        key = label_key(labels)
        with self._lock:
            self._histograms[name].setdefault(key, Histogram()).observe(seconds)

    def value(self, name: str, **labels: str) -> float:
        """Sum of counter ``name`` over the samples whose labels include ``labels``."""
        wanted = set(labels.items())
        with self._lock:
            return sum(v for k, v in self._counters.get(name, {}).items() if wanted <= set(k))

    def histogram(self, name: str, **labels: str) -> Histogram | None:
        """The histogram ``name`` with exactly ``labels``, if anything was observed."""
        with self._lock:
            return self._histograms.get(name, {}).get(label_key(labels))

    def samples(self) -> tuple[dict[str, dict[Labels, float]], dict[str, dict[Labels, Histogram]]]:
        """Copies of every counter and histogram sample, taken under the lock."""
        with self._lock:
            counters = {n: dict(s) for n, s in self._counters.items()}
            histograms = {n: {k: h.copy() for k, h in s.items()} for n, s in self._histograms.items()}
        return counters, histograms


def collect(
    manager: TieringManager,
) -> tuple[dict[str, dict[Labels, float]], dict[str, dict[Labels, float]], dict[str, dict[Labels, Histogram]]]:
    """Every figure of ``manager``'s stack: recorded counters and histograms plus tier state.

    Returns:
        ``(counters, gauges, histograms)``, each ``name -> {labels: value}``.
    """
    counters, histograms = manager.metrics.samples()
    gauges: dict[str, dict[Labels, float]] = defaultdict(dict)
    primary = manager.primary
    key = tuple(sorted(tier_labels("primary", None).items()))
    gauges["resident_blocks"][key] = primary.num_resident
    gauges["resident_bytes"][key] = primary.num_resident * primary.block_bytes
    gauges["capacity_bytes"][key] = primary.num_blocks * primary.block_bytes
    counters.setdefault("evictions_total", {})[key] = primary.evictions
    cost = manager.cost.state()
    rate_key = (("source", cost["recompute_rate_source"]),)
    gauges["recompute_tokens_per_second"][rate_key] = float(cost["recompute_tokens_per_s"] or 0.0)
    inflight, inflight_stores = manager.in_flight_jobs(), manager.in_flight_store_blocks()
    for idx, tier in enumerate(manager.secondary_tiers):
        key = tuple(sorted(tier_labels(tier.tier_type, idx).items()))
        gauges["in_flight_jobs"][key] = inflight.get(idx, 0)
        gauges["in_flight_store_blocks"][key] = inflight_stores.get(idx, 0)
        gauges["load_model_latency_seconds"][key] = cost["tiers"][idx]["latency_s"]
        gauges["load_model_bytes_per_second"][key] = cost["tiers"][idx]["bytes_per_s"]
        try:
            stats = dict(tier.stats())
        except Exception:
            stats = {}
        for name in ("resident_blocks", "resident_bytes", "capacity_bytes", "used_bytes", "pending_delete_bytes"):
            if name in stats:
                gauges[name][key] = float(stats[name])
        for name in ("evictions", "failed_deletes"):
            if name in stats:
                counters.setdefault(f"{name}_total", {})[key] = float(stats[name])
        for stat, value in stats.items():
            for kind in ("store", "load"):
                cause = stat.removeprefix(f"{kind}_failed_")
                if cause != stat and cause:
                    labels = tuple(sorted((*key, ("cause", cause))))
                    counters.setdefault(f"{kind}_failures_total", {})[labels] = float(value)
    return counters, dict(gauges), histograms


def snapshot(manager: TieringManager) -> dict[str, Any]:
    """:func:`collect` as JSON-ready data (see :func:`snapshot_dict`)."""
    return snapshot_dict(*collect(manager))


def snapshot_dict(
    counters: dict[str, dict[Labels, float]],
    gauges: dict[str, dict[Labels, float]],
    histograms: dict[str, dict[Labels, Histogram]],
) -> dict[str, Any]:
    """Samples as JSON-ready data: ``{"<prefix><name>": [{"labels": {...}, "value": ...}, ...]}``."""
    out: dict[str, Any] = {}
    for kind in (counters, gauges):
        for name, samples in kind.items():
            out[PREFIX + name] = [{"labels": dict(k), "value": v} for k, v in sorted(samples.items())]
    for name, hists in histograms.items():
        out[PREFIX + name] = [
            {
                "labels": dict(k),
                "count": h.count,
                "sum": h.total,
                "buckets": dict(h.cumulative()),
                "p50": h.quantile(0.5),
                "p99": h.quantile(0.99),
            }
            for k, h in sorted(hists.items())
        ]
    return out

"""Where every primary store of a replay went, per secondary tier: the report's ``blocks stored`` sub-lines.

Each block the primary tier stores is offered to every secondary tier (write-through). A tier either held it
already (its lookup said so: touched, not written again; e.g. a block whose store was still in flight when a
request looked it up, so the request recomputed and stored it again) or takes the offer, which its admission
policy declines or passes to a store job that is written, fails, or is still in flight when the figures are
read. Blocks loaded from a lower tier (``fill``) and, for ``second_sighting``, blocks seen again while resident
(``resighted``) are offered too, beyond the primary stores. So, per tier::

    primary stores + other offers == held + declined + written + failed + in flight

with every figure from the replay's metrics snapshot (:func:`tiering.core.runtime.metrics.snapshot`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["format_store_rows", "store_accounting"]

NAME_WIDTH = 18

_ORIGIN_WORDS = {"fill": "loaded from a lower tier", "resighted": "resident, seen again (second_sighting)"}


def _per_tier(metrics: Mapping[str, Any], name: str, **match: str) -> dict[str, int]:
    """``{"0:fs": total}`` of metric ``name``'s samples whose labels include ``match``."""
    out: dict[str, int] = {}
    for sample in metrics.get(name) or []:
        labels = sample.get("labels") or {}
        if not str(labels.get("index", "")).isdigit() or any(labels.get(k) != v for k, v in match.items()):
            continue  # the primary tier's samples, or another label value
        tier = f"{labels['index']}:{labels.get('tier')}"
        out[tier] = out.get(tier, 0) + int(sample.get("value", 0))
    return out


def store_accounting(metrics: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per secondary tier, what became of the blocks offered to it.

    Args:
        metrics: the replay's metrics snapshot (``{"tiering_<name>": [{"labels", "value"}, ...]}``).

    Returns:
        ``{"0:fs": {"primary_stores", "other_offers": {origin: blocks}, "held", "declined", "written", "failed",
        "in_flight"}}`` in blocks; ``primary_stores + sum(other_offers) == held + declined + written + failed +
        in_flight``.
    """
    m = {name.removeprefix("tiering_"): value for name, value in metrics.items()}
    held = _per_tier(m, "store_offers_total", origin="store", outcome="held")
    offered = _per_tier(m, "store_offers_total", origin="store", outcome="offered")
    others = {o: _per_tier(m, "store_offers_total", origin=o, outcome="offered") for o in _ORIGIN_WORDS}
    declined = _per_tier(m, "store_admission_total", outcome="declined")
    written = _per_tier(m, "blocks_stored_total")
    failed = _per_tier(m, "store_job_failed_blocks_total")
    in_flight = _per_tier(m, "in_flight_store_blocks")
    tiers = set(held) | set(offered) | set(written) | set(in_flight) | {t for o in others.values() for t in o}
    return {
        tier: {
            "primary_stores": held.get(tier, 0) + offered.get(tier, 0),
            "other_offers": {o: blocks[tier] for o, blocks in others.items() if blocks.get(tier)},
            "held": held.get(tier, 0),
            "declined": declined.get(tier, 0),
            "written": written.get(tier, 0),
            "failed": failed.get(tier, 0),
            "in_flight": in_flight.get(tier, 0),
        }
        for tier in sorted(tiers)
    }


def format_store_rows(accounting: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per secondary tier: its primary stores and where each went (they add up)."""
    lines = []
    for tier, a in accounting.items():
        others = "".join(f" + {n:,} {_ORIGIN_WORDS[origin]}" for origin, n in sorted(a["other_offers"].items()))
        lines.append(
            f"{'  ' + tier:<{NAME_WIDTH}} {a['primary_stores']:,} primary stores{others}: written {a['written']:,}, "
            f"already held {a['held']:,} (touched, not written again), declined by admission {a['declined']:,}, "
            f"failed {a['failed']:,}, in flight at the end {a['in_flight']:,}"
        )
    return lines

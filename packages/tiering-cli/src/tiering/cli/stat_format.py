"""The text of ``tiering stat``: each tier's state, not its counters (``--json`` has every counter).

A tier opened by ``stat`` has just started: its counters of stores, loads and
lookups are this process's, nearly all 0. What tells an operator something is
the state the start-up scan found: blocks and bytes stored, the cap and how
full it is, the pins, each tenant's blocks and quota (by the name the config
gives it, else by its tag), and what the scan removed or could not read.
Sizes are printed in binary units (:func:`tiering.core.units.format_bytes`)
with the exact byte count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tiering.core.units import format_bytes, format_count

WIDTH = 14

SCAN_FIGURES = ("bad_blocks_removed", "temps_removed", "failed_deletes", "forgotten_blocks")
"""Counters a start-up scan can move: printed when not 0."""


FLEET_CAP = "for the whole fleet (one LRU on the server, shared by every process, which evicts)"
"""How a cap every process of a fleet enforces together is shown (a redis tier with ``eviction: "tier"``)."""


def _bytes(n: float) -> str:
    """``"103.6 MiB = 108605440 bytes"``; a count under 1 KiB as ``"512 B"``."""
    return format_bytes(n) if n < 1024 else f"{format_bytes(n)} = {int(n)} bytes"


def _row(name: str, text: str) -> str:
    return f"  {name:<{WIDTH}} {text}"


def _capacity(stats: Mapping[str, Any], used: float) -> str:
    cap = stats.get("capacity_bytes") or 0
    configured = stats.get("configured_capacity_bytes") or 0
    if cap:
        return f"{_bytes(cap)}, {used / cap:.1%} used"
    if configured:
        return f"{_bytes(configured)} {FLEET_CAP}"
    return "unbounded (no capacity_bytes)"


def _pins(stats: Mapping[str, Any], on_medium: int) -> str:
    bound = int(stats.get("max_pinned_bytes", 0))
    pinned, pending = int(stats.get("pinned_blocks", 0)), int(stats.get("pins_pending", 0))
    if not bound and not pinned and not pending:
        held = f"; {on_medium:,} live pins on the tier, made with pinning on (tiering pin --list)" if on_medium else ""
        return f"pinning off in this config (max_pinned_bytes 0){held}"
    text = f"{format_count(pinned, 'block')} pinned ({format_bytes(stats.get('pinned_bytes', 0))})"
    text += f", {pending:,} pinned but not stored yet" if pending else ""
    return text + (f"; max_pinned_bytes {format_bytes(bound)}" if bound else "; pinning off in this config")


def _tenants(stats: Mapping[str, Any]) -> list[str]:
    figures: dict[str, dict[str, Any]] = {}
    for key, value in stats.items():
        if key.startswith("tenant:"):
            name, _, figure = key.removeprefix("tenant:").rpartition(":")
            figures.setdefault(name, {})[figure] = value
    lines: list[str] = []
    for name, f in sorted(figures.items()):
        quota = f.get("quota_bytes") or 0
        lines.append(
            _row(
                "tenant" if not lines else "",
                f"{name or '(default)'}: {int(f.get('resident_blocks', 0)):,} blocks "
                f"({format_bytes(f.get('resident_bytes', 0))}), quota {format_bytes(quota) if quota else 'none'}",
            )
        )
    return lines


def stat_lines(report: Mapping[str, Any]) -> list[str]:
    """The lines ``tiering stat`` prints for its report (the dict ``--json`` prints).

    Args:
        report: ``{"namespace", "primary": {"blocks", "capacity_bytes"}, "tiers": [{"index", "type", "stats",
            "location"?, "pins_on_medium"?}]}``; ``pins_on_medium``: live pins a tier holds where this config has
            pinning off (its counters then count none).
    """
    primary = report["primary"]
    lines = [
        f"namespace {report['namespace']}",
        f"primary: {primary['blocks']:,} blocks, {_bytes(primary['capacity_bytes'])} (the stack's CPU tier; "
        "stat does not fill it)",
    ]
    for entry in report["tiers"]:
        stats = entry["stats"]
        where = f" at {entry['location']}" if entry.get("location") else ""
        lines.append(f"secondary_tiers[{entry['index']}] {entry['type']}{where}")
        blocks = int(stats.get("resident_blocks", 0))
        used = stats.get("used_bytes", stats.get("resident_bytes", 0)) or 0
        stored = f"{blocks:,} blocks, {_bytes(stats.get('resident_bytes', 0))}"
        if used != stats.get("resident_bytes", 0):
            stored += f"; {_bytes(used)} used with writes in flight and blocks being deleted"
        lines.append(_row("stored", stored))
        if "capacity_bytes" in stats or "configured_capacity_bytes" in stats:
            lines.append(_row("capacity", _capacity(stats, used)))
        if "pinned_blocks" in stats:
            lines.append(_row("pins", _pins(stats, int(entry.get("pins_on_medium", 0)))))
        lines += _tenants(stats)
        if "scan_done" in stats:
            done = "done" if stats["scan_done"] else "still running (stat waited --wait seconds)"
            took = f" in {stats['last_scan_s']:.2f} s" if stats["scan_done"] and "last_scan_s" in stats else ""
            moved = ", ".join(f"{k} {int(stats[k]):,}" for k in SCAN_FIGURES if stats.get(k))
            lines.append(_row("start-up scan", f"{done}{took}" + (f"; {moved}" if moved else "")))
    lines.append("(every counter of each tier: tiering stat --json)")
    return lines

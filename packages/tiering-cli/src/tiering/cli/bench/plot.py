"""Plots of a replay report (the ``plot`` extra: ``pip install 'tiering-core[plot]'``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiering.core.units import format_bytes

GIB = 1 << 30


def _title(report: dict[str, Any]) -> str:
    """What was replayed through which stack, from the report (its ``stack`` when present)."""
    head = f"tiering bench: {report.get('trace', 'a trace')}, {report['requests']:,} requests"
    stack = report.get("stack")
    if not stack:
        return head
    tiers = "".join(
        f" + {t['name']} " + (f"capped at {format_bytes(t['capacity_bytes'])}" if t["capacity_bytes"] else "uncapped")
        for t in stack["tiers"]
    )
    primary = format_bytes(stack["primary_blocks"] * stack["block_bytes"])
    return (
        f"{head}\nprimary {primary}{tiers}; blocks of {stack['block_tokens']} tokens, "
        f"{format_bytes(stack['block_bytes'])} (storage path only: no engine, no GPU)"
    )


def plot_report(report: dict[str, Any], out: str | Path) -> Path:
    """Draw hit ratio per tier, bytes moved per tier and job latency percentiles into a PNG.

    Uses matplotlib's non-interactive Agg backend (no display needed).

    Args:
        report: the JSON report of ``tiering bench`` (needs ``series`` and ``latency``).
        out: the PNG path.

    Raises:
        ImportError: matplotlib is not installed (the message says how to install it).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install 'tiering-core[plot]'") from exc

    series = report["series"]
    fig, (ax_hit, ax_bytes, ax_lat) = plt.subplots(3, 1, figsize=(9, 11), constrained_layout=True)
    fig.suptitle(_title(report), fontsize="medium")
    for tier, values in series["hit_ratio"].items():
        ax_hit.plot(series["index"], values, label=tier)
    ax_hit.set(
        title=f"Hit ratio per tier (moving window of {series['window_requests']} requests)",
        xlabel="request",
        ylabel="hits / block lookups",
        ylim=(0, 1),
    )
    ax_hit.legend()
    for tier, values in series["bytes_stored"].items():
        ax_bytes.plot(series["index"], [v / GIB for v in values], label=f"{tier} written")
    for tier, values in series["bytes_loaded"].items():
        ax_bytes.plot(series["index"], [v / GIB for v in values], linestyle="--", label=f"{tier} served")
    ax_bytes.set(
        title="Payload bytes written into / served by each tier (cumulative, headers excluded)",
        xlabel="request",
        ylabel="GiB",
    )
    ax_bytes.legend(fontsize="small")
    rows = [(f"{r['tier']} {r['kind']}", r) for r in report.get("latency", [])]
    if rows:
        width = 0.25
        xs = range(len(rows))
        for offset, pct in enumerate(("p50", "p90", "p99")):
            ax_lat.bar([x + offset * width for x in xs], [r[pct] * 1e3 for _, r in rows], width, label=pct)
        ax_lat.set_xticks([x + width for x in xs], [name for name, _ in rows])
        ax_lat.legend()
    ax_lat.set(
        title="Store / load job latency, submit to report (histogram bucket upper bounds)",
        ylabel="ms (log scale)",
        yscale="log",
    )
    path = Path(out)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

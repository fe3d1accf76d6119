"""The human-readable report of ``tiering bench``."""

from __future__ import annotations

from typing import Any


def format_report(data: dict[str, Any], header: str | None = None) -> str:
    """The report text of a replay.

    Args:
        data: :meth:`tiering.core.bench.ReplayReport.to_dict` output (``locations`` optional).
        header: a first line (the stack and where its blocks were written).
    """
    lines = [header] if header else []
    if data.get("partial"):
        lines.append(
            f"PARTIAL REPORT: stopped by {data.get('stopped_by') or 'a stop request'} after {data['requests']} "
            "requests; the figures below cover those requests only"
        )
    lines += [
        f"requests           {data['requests']}",
        f"block lookups      {data['block_lookups']}",
        f"hits               {data['hits_total']}  ({1 - data['miss_ratio']:.1%})",
    ]
    lines += [f"  {tier:<16} {n}" for tier, n in sorted(data["hits"].items())]
    lines += [
        f"misses             {data['misses']}  (miss ratio {data['miss_ratio']:.1%})",
        f"blocks stored      {data['blocks_stored']}  (rejected: {data['store_rejected']})",
    ]
    for tier in sorted(set(data["bytes_stored"]) | set(data["bytes_loaded"])):
        stored, loaded = data["bytes_stored"].get(tier, 0), data["bytes_loaded"].get(tier, 0)
        lines.append(f"  {tier:<16} stored {stored / 1e6:10.1f} MB   loaded {loaded / 1e6:10.1f} MB")
    lat = data["scheduler_call_us"]
    lines += [
        f"verified blocks    {data['verified_blocks']} (every loaded byte matched)",
        f"short loads        {data['short_loads']} (requests that loaded fewer blocks than their lookup found:"
        " a promotion failed or no primary slot was free; the rest was recomputed)",
        f"throughput         {data['throughput_gb_s']:.3f} GB/s",
        f"scheduler calls    {data['scheduler_calls']}: p50 {lat['p50']:.1f} us, p90 {lat['p90']:.1f} us, "
        f"p99 {lat['p99']:.1f} us, max {lat['max']:.1f} us",
        f"wall time          {data['wall_s']:.2f} s",
    ]
    return "\n".join(lines)

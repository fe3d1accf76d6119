"""Admission policies compared on a trace: bytes written to the persistent tier per hit, and hit ratio.

:func:`admission_sweep` replays the same requests through the default bench
stack (:mod:`tiering.cli.bench.stack`: a CPU primary tier plus the first
installed local persistent tier) once per ``(cap, policy)`` pair, each on a
fresh stack in a fresh directory, every loaded byte verified as in
``tiering bench``; :func:`format_rows` prints one row per pair, the
policies of one cap next to each other. ``scripts/bench_admission.py`` is
its command line.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from tiering.cli.bench.replay import Replayer
from tiering.cli.bench.stack import bench_config, default_local_tier
from tiering.cli.bench.workload import Request
from tiering.core.runtime.tiering_spec import TieringOffloadingSpec
from tiering.core.units import format_bytes

__all__ = ["admission_row", "admission_sweep", "format_rows"]


def admission_row(
    requests: Sequence[Request],
    cap_bytes: int,
    policy: str,
    directory: str,
    block_bytes: int,
    cpu_bytes: int | None = None,
) -> dict[str, Any]:
    """Replay ``requests`` on a fresh default stack whose persistent tier has ``cap_bytes`` and ``policy``.

    Args:
        requests: the workload.
        cap_bytes: ``capacity_bytes`` of the persistent tier.
        policy: its ``admission`` (``"always"`` or ``"second_sighting"``).
        directory: an empty directory for the tier's blocks.
        block_bytes: bytes per block.
        cpu_bytes: bytes of the primary tier (None: the default stack's 1,024 blocks).

    Returns:
        ``policy``, ``cap_bytes``, ``block_lookups``, ``hits`` (any tier),
        ``tier_hits`` (blocks loaded from the persistent tier), ``hit_ratio``,
        ``bytes_written`` (into the persistent tier), ``written_per_hit``
        (bytes written per block hit, any tier; None without a hit), ``admitted`` / ``declined`` (blocks).

    Raises:
        RuntimeError: no installed tier keeps blocks in a local directory.
        VerificationError, TimeoutError: as :meth:`~tiering.cli.bench.replay.Replayer.run`.
    """
    entry = default_local_tier(directory)
    if entry is None:
        raise RuntimeError("no installed tier keeps blocks in a local directory (install tiering-fs)")
    entry = {**entry, "capacity_bytes": cap_bytes, "admission": policy}
    manager = TieringOffloadingSpec(bench_config([entry], block_bytes, cpu_bytes)).get_manager()
    name = f"0:{entry['type']}"
    try:
        report = Replayer(manager, [name]).run(requests)
    finally:
        manager.shutdown()
    count = manager.metrics.value
    hits = report.total_hits
    written = report.bytes_stored[name]
    return {
        "policy": policy,
        "cap_bytes": cap_bytes,
        "block_lookups": report.block_lookups,
        "hits": hits,
        "tier_hits": report.hits[name],
        "hit_ratio": hits / report.block_lookups if report.block_lookups else 0.0,
        "bytes_written": written,
        "written_per_hit": written / hits if hits else None,
        "admitted": int(count("store_admission_total", index="0", outcome="admitted")),
        "declined": int(count("store_admission_total", index="0", outcome="declined")),
    }


def admission_sweep(
    requests: Sequence[Request],
    caps: Sequence[int],
    policies: Sequence[str],
    block_bytes: int,
    cpu_bytes: int | None = None,
    progress: Callable[[dict[str, Any]], object] | None = None,
) -> list[dict[str, Any]]:
    """:func:`admission_row` for every cap and policy (policies of one cap together), each in a temporary directory.

    ``progress`` is called with each row as it is done.
    """
    rows = []
    for cap in caps:
        for policy in policies:
            with tempfile.TemporaryDirectory(prefix="tiering-admission-") as directory:
                row = admission_row(requests, cap, policy, directory, block_bytes, cpu_bytes)
            rows.append(row)
            if progress is not None:
                progress(row)
    return rows


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """A table of the rows; each policy after the first of a cap also shows its ratios to that first one."""
    lines = [
        f"{'cap':>9}  {'admission':<15} {'hit ratio':>9} {'tier hits':>9} {'written':>10} "
        f"{'written/hit':>11} {'declined':>8}  vs first policy"
    ]
    first: dict[int, dict[str, Any]] = {}
    for row in rows:
        base = first.setdefault(row["cap_bytes"], row)
        versus = ""
        if base is not row:
            versus = "(the first policy had no hit)"
            if base["hit_ratio"]:
                versus = f"hit ratio x{row['hit_ratio'] / base['hit_ratio']:.3f}"
            if row["written_per_hit"] is not None and base["written_per_hit"]:
                versus += f", written/hit {100 * (row['written_per_hit'] / base['written_per_hit'] - 1):+.1f}%"
        lines.append(
            f"{format_bytes(row['cap_bytes']):>9}  {row['policy']:<15} {row['hit_ratio']:>9.4f} "
            f"{row['tier_hits']:>9} {format_bytes(row['bytes_written']):>10} "
            f"{format_bytes(row['written_per_hit']) if row['hits'] else 'no hit':>11} {row['declined']:>8}  {versus}"
        )
    return "\n".join(lines)

"""The human-readable report of ``tiering bench``: what was measured, then what it did.

Sizes are printed in binary units (KiB, MiB, GiB: :func:`tiering.core.units.format_bytes`).
Payload bytes are block bytes; a persistent tier stores each block with a
header (and, for some tiers, padding), so its ``used`` and ``evicted``
figures, counted as stored, are larger per block than the payload.
"""

from __future__ import annotations

from typing import Any

from tiering.cli.bench.passes import declined_counts, format_declined_row, format_pass_rows, tenant_rows
from tiering.cli.bench.stack import CAPACITY_RULE
from tiering.cli.bench.stores import format_store_rows, store_accounting
from tiering.cli.stat_format import FLEET_CAP
from tiering.core.units import format_bytes

LLAMA_3_1_8B_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2
"""KV bytes per token of Llama-3.1-8B in bfloat16: 32 layers x (K, V) x 8 KV heads x 128 dims x 2 bytes (128 KiB)."""

NAME_WIDTH = 18

REAL_PRIMARY_BLOCKS = 16
"""Primary blocks the header advises for a replay with real block sizes (16 x 64 MiB = 1 GiB of memory).

A small primary tier evicts early, so the persistent tier (4 times it, 64 blocks) serves hits within the
advised 10 requests of the conversation trace; with 64 primary blocks it serves none before about 20."""


def describe_stack(spec: Any, tiers: list[dict[str, Any]], block_tokens: int, default_stack: bool) -> dict[str, Any]:
    """The stack a replay drives, JSON-ready (the report's ``stack``).

    Args:
        spec: the :class:`~tiering.core.runtime.tiering_spec.TieringOffloadingSpec`.
        tiers: per secondary tier ``{"name", "capacity_bytes" (0: unbounded), "location" (None: in memory),
            "temporary"}``.
        block_tokens: tokens per block of the workload (512 for the Mooncake traces): each of the trace's
            block hashes is one block, whatever the config's ``block_size`` says (kept as ``config_block_size``).
        default_stack: whether it is ``tiering bench``'s own stack (no ``--config``).
    """
    return {
        "primary_blocks": spec.num_primary_blocks,
        "block_bytes": spec.block_bytes,
        "block_tokens": block_tokens,
        "config_block_size": spec.block_size,
        "eviction_policy": spec.eviction_policy,
        "tiers": tiers,
        "default_stack": default_stack,
    }


def format_header(trace: str, requests: int, stack: dict[str, Any]) -> str:
    """What a replay measures: the workload, the storage path only, the stack, the block size and how it scales."""
    block, tokens = stack["block_bytes"], stack["block_tokens"]
    primary = stack["primary_blocks"]
    tiers = []
    for tier in stack["tiers"]:
        cap = f"capped at {format_bytes(tier['capacity_bytes'])}" if tier["capacity_bytes"] else "no cap"
        if tier["capacity_bytes"] and stack["default_stack"]:
            cap += f": the default stack's cap, {CAPACITY_RULE}"
        if not tier["capacity_bytes"] and tier.get("fleet_capacity_bytes"):  # a cap the fleet's processes share
            cap = f"capped at {format_bytes(tier['fleet_capacity_bytes'])} {FLEET_CAP}"
        where = f"blocks written to {tier['location']}" if tier["location"] else "in memory: nothing persistent"
        temporary = " (temporary, removed after the run)" if tier["temporary"] else ""
        tiers.append(f"{tier['name']} ({cap}), {where}{temporary}")
    real = LLAMA_3_1_8B_BYTES_PER_TOKEN * tokens
    if stack["default_stack"]:
        how = (
            f"--block-bytes {_size_argument(real)} --cpu-bytes {_size_argument(REAL_PRIMARY_BLOCKS * real)} "
            f"--requests 10 (a primary tier of {REAL_PRIMARY_BLOCKS} blocks; {primary:,} would need "
            f"{format_bytes(primary * real)} of memory), or --config with your block_bytes and cpu_bytes_to_use"
        )
    else:
        how = "block_bytes and cpu_bytes_to_use of the --config (or --block-bytes)"
    scale = (
        f"a Llama-3.1-8B block of {tokens} tokens (bf16) is {format_bytes(real)} "
        f"({format_bytes(LLAMA_3_1_8B_BYTES_PER_TOKEN)}/token)"
    )
    if block < real:
        scale = f"scaled down: {scale}; replay with real sizes: {how}"
    configured = stack.get("config_block_size", tokens)
    if configured != tokens:
        scale += (
            f"; the trace's blocks of {tokens} tokens are what counts (one per block hash), "
            f"not the config's block_size {configured}"
        )
    return "\n".join(
        [
            f"tiering bench: trace {trace}, {requests:,} requests",
            "measured: the storage path only: no engine, no model, no GPU. Per request the replay looks up its "
            "blocks, loads the leading run some tier holds into the CPU primary tier (every loaded byte checked), "
            "and stores the rest (primary, then every secondary tier), as an engine's offloading connector would.",
            f"stack: CPU primary tier {primary:,} blocks = {format_bytes(primary * block)} ({stack['eviction_policy']})"
            + "".join(f" -> {t}" for t in tiers),
            f"blocks: {tokens} tokens, {format_bytes(block)} of payload ({block / tokens:,.0f} B/token); {scale}.",
        ]
        + [stack[name] for name in ("throttle", "policies", "tenants") if stack.get(name)]
        + ([] if stack.get("policies") or not stack.get("load_cost_model") else [stack["load_cost_model"]])
    )


def _size_argument(n: int) -> str:
    """``67108864`` -> ``"64MiB"``: a size as ``--block-bytes`` takes it."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _ms(seconds: float) -> str:
    """Seconds as milliseconds, every latency of the report alike.

    ``16.9e-6`` -> ``"0.017 ms"``, ``0.05`` -> ``"50 ms"``, ``0.0389`` -> ``"38.9 ms"``, ``10.0`` -> ``"10,000 ms"``.
    """
    ms = seconds * 1e3
    if ms >= 100:
        return f"{ms:,.0f} ms"
    if ms >= 0.001:
        return f"{ms:.3g} ms" if ms >= 1 else f"{ms:.2g} ms"
    return f"{ms:.4f} ms"


def _primary_first(item: tuple[str, Any]) -> tuple[bool, str]:
    """Sort key of ``(tier name, value)`` pairs: the primary tier, then the secondary tiers in order."""
    return item[0] != "primary", item[0]


def _row(name: str, text: str) -> str:
    return f"{name:<{NAME_WIDTH}} {text}"


def _failed_stores(stats: dict[str, Any]) -> str:
    causes = [
        f"{name.removeprefix('store_failed_')} {int(n):,}"
        for name, n in sorted(stats.items())
        if name.startswith("store_failed_") and n
    ]
    return ", ".join(causes) or "none"


def _tier_rows(data: dict[str, Any]) -> list[str]:
    lines = [_row("tiers", "capacity, used at the end, evictions, failed stores by cause")]
    notes = []
    for name, stats in sorted(data["tier_stats"].items(), key=_primary_first):
        cap = stats.get("capacity_bytes")
        cap_text = "unknown" if cap is None else format_bytes(cap) if cap else "unbounded"
        if not cap and stats.get("configured_capacity_bytes"):  # a cap the fleet's processes share
            cap_text = f"{format_bytes(stats['configured_capacity_bytes'])} {FLEET_CAP}"
        used = stats.get("used_bytes", stats.get("resident_bytes"))
        used_text = "unknown" if used is None else format_bytes(used)
        if "resident_blocks" in stats:
            used_text += f" ({int(stats['resident_blocks']):,} blocks)"
        evictions = int(stats.get("evictions", 0))
        evicted = f" ({format_bytes(stats['evicted_bytes'])})" if evictions and "evicted_bytes" in stats else ""
        if "fleet_evictions" in stats:  # the fleet cap's victims this process deleted; the tier's own LRU has none
            evictions = int(stats["fleet_evictions"])
            evicted = " at the fleet's cap"
        if "quota_evictions" in stats or "expirations" in stats:  # a tier with tenants: evictions by cause
            quota = int(stats.get("quota_evictions", 0))
            evicted += (
                f": {evictions - quota:,} at the cap, {quota:,} at a tenant's quota; "
                f"{int(stats.get('expirations', 0)):,} expired (TTL);"
            )
        else:
            evicted += ","
        lines.append(
            _row(
                f"  {name}",
                f"capacity {cap_text}, used {used_text}, evictions {evictions:,}{evicted} "
                f"failed stores: {_failed_stores(stats)}",
            )
        )
        blocks, stored = int(stats.get("resident_blocks", 0)), int(stats.get("resident_bytes", 0))
        block = data["stack"]["block_bytes"]
        if name != "primary" and blocks and stored != blocks * block:
            notes.append(
                f"  {name} counts bytes as stored: {stored // blocks:,} B per {format_bytes(block)} block "
                f"({stored / blocks / block - 1:+.1%}: block header and padding included)".replace(".0%", "%")
            )
    return lines + notes


def _latency_rows(data: dict[str, Any]) -> list[str]:
    rows = data.get("latency") or []
    if not rows:
        return []
    lines = [
        _row(
            "job latency",
            "store/load jobs of each secondary tier, submit to report (p50 and p99 are the upper bounds of "
            "histogram buckets, so either may exceed the mean; the mean is exact)",
        )
    ]
    for r in rows:
        lines.append(
            _row(
                f"  {r['tier']} {r['kind']}",
                f"{r['jobs']:,} jobs: p50 {_ms(r['p50'])}, p99 {_ms(r['p99'])}, mean {_ms(r['mean'])}",
            )
        )
    return lines


def format_report(data: dict[str, Any], header: str | None = None) -> str:
    """The report text of a replay.

    Args:
        data: :meth:`tiering.cli.bench.ReplayReport.to_dict` output plus ``stack`` (:func:`describe_stack`).
        header: the lines before it (:func:`format_header`).
    """
    lines = [header] if header else []
    if data.get("partial"):
        lines.append(
            f"PARTIAL REPORT: stopped by {data.get('stopped_by') or 'a stop request'} after {data['requests']} "
            "requests; the figures below cover those requests only"
        )
    lookups = data["block_lookups"]
    lines += [
        _row("requests", f"{data['requests']:,}"),
        _row("lookups", f"{lookups:,} blocks, {data['tokens_looked_up']:,} tokens (the prompts)"),
        _row(
            "hits",
            f"{data['hits_total']:,} blocks ({1 - data['miss_ratio']:.1%}), {data['token_hits']:,} tokens "
            f"(token hit ratio {data['token_hit_ratio']:.1%})",
        ),
    ]
    lines += [_row(f"  {tier}", f"{n:,} blocks") for tier, n in sorted(data["hits"].items(), key=_primary_first)]
    lines += [
        _row("misses", f"{data['misses']:,} blocks ({data['miss_ratio']:.1%}): recomputed, then stored"),
        _row("verified blocks", f"{data['verified_blocks']:,} (every loaded byte matched)"),
        _row(
            "short loads",
            f"{data['short_loads']:,} (requests that loaded fewer blocks than their lookup found: a promotion "
            "failed or no primary slot was free; the rest was recomputed)",
        ),
        _row("blocks stored", f"{data['blocks_stored']:,} (no free primary slot: {data['store_rejected']:,})"),
    ]
    lines += format_store_rows(store_accounting(data.get("metrics") or {}))
    lines += [
        _row("payload bytes", "written into / served by each tier (block bytes, headers excluded)"),
    ]
    for tier in sorted(set(data["bytes_stored"]) | set(data["bytes_loaded"]), key=lambda t: _primary_first((t, 0))):
        stored, loaded = data["bytes_stored"].get(tier, 0), data["bytes_loaded"].get(tier, 0)
        lines.append(_row(f"  {tier}", f"written {format_bytes(stored)}, served {format_bytes(loaded)}"))
    lines += _tier_rows(data)
    lines += tenant_rows(data["tier_stats"])
    lines.append(format_declined_row(declined_counts(data.get("metrics") or {})))
    lines += _latency_rows(data)
    lat = data["scheduler_call_us"]
    lines += [
        _row(
            "throughput",
            f"{format_bytes(data['throughput_bytes_per_s'])}/s: the payload the requests loaded plus stored into "
            f"the primary tier ({format_bytes(data['request_bytes'])}) over the wall time; a stored block counts "
            "once, not again for each tier it is written to",
        ),
        _row(
            "scheduler calls",
            f"{data['scheduler_calls']:,} calls into the tiering manager from the request loop, as an engine's "
            f"scheduler makes them (lookup, prepare/complete load and store, get_finished): "
            + ", ".join(f"{q} {_ms(lat[q] / 1e6)}" for q in ("p50", "p90", "p99", "max")),
        ),
        _row("wall time", _wall_time(data)),
    ]
    lines += format_pass_rows(data.get("passes") or [])
    return "\n".join(lines)


def _wall_time(data: dict[str, Any]) -> str:
    """The replay's wall time and, when the command ran more (passes, stacks built and shut down), the command's."""
    text = f"{data['wall_s']:.2f} s (the requests' replay"
    passes = data.get("passes") or []
    text += f" of the last pass, {passes[-1]['name']})" if len(passes) > 1 else ")"
    if data.get("command_wall_s") is not None:
        text += f"; the whole command {data['command_wall_s']:.2f} s"
        text += (
            f" ({len(passes)} passes, each stack built and shut down)"
            if len(passes) > 1
            else " (stack built and shut down)"
        )
    return text

"""``tiering bench --pin N``: what pinning the trace's N most shared blocks does to the rest.

The replay runs twice, each on a fresh stack: without pins, then with the N
blocks that the most requests share (a fleet's system prompts and shared
documents) pinned in every secondary tier before the first request. Both
passes count lookups and hits of the pinned blocks and of the rest apart,
and after each pass every pinned block is looked up once more: with pins,
every one of them must still be there (``survived`` = N), however many
times over the replay filled the tiers.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import Any

from tiering.cli.bench.workload import Request
from tiering.core.base import OffloadKey, ReqContext
from tiering.core.factory import SecondaryTierFactory

PIN_TTL_S = 86400.0
"""Lifetime of the bench's pins: longer than any replay (they are never renewed)."""
PIN_OVERHEAD_BYTES = 8192
"""Bytes counted per pinned block above ``block_bytes`` when the bench sets ``max_pinned_bytes`` itself
(covers every shipped tier's header or trailer)."""


def pin_candidates(requests: Sequence[Request], n: int) -> list[OffloadKey]:
    """The ``n`` blocks the most requests look up (ties: the block seen first), most shared first."""
    shared: collections.Counter[OffloadKey] = collections.Counter()
    for req in requests:
        shared.update(set(req.keys))
    first = {key: i for i, key in reversed(list(enumerate(k for r in requests for k in r.keys)))}
    return sorted(shared, key=lambda k: (-shared[k], first[k]))[:n]


def with_pin_budget(config: dict[str, Any], n: int, block_bytes: int) -> dict[str, Any]:
    """``config`` with ``max_pinned_bytes`` room for ``n`` blocks in every tier that declares the key and lacks it."""
    tiers = []
    for entry in config.get("secondary_tiers", []):
        cls = SecondaryTierFactory.get_class(entry.get("type", ""), entry.get("module_path"))
        schema = getattr(cls, "config_schema", None)
        if schema is not None and "max_pinned_bytes" in schema.keys and "max_pinned_bytes" not in entry:
            entry = {**entry, "max_pinned_bytes": n * (block_bytes + PIN_OVERHEAD_BYTES)}
        tiers.append(entry)
    return {**config, "secondary_tiers": tiers}


def survivors(manager: Any, keys: Sequence[OffloadKey], timeout_s: float = 10.0) -> int:
    """How many of ``keys`` some secondary tier still holds (lookups answered None are asked again)."""
    ctx = ReqContext("bench-pins")
    found = 0
    for key in keys:
        deadline = time.monotonic() + timeout_s
        for tier in manager.secondary_tiers:
            while (verdict := tier.lookup(key, ctx)) is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if verdict:
                found += 1
                break
    return found


def pin_figures(data: dict[str, Any], pinned: int, survived: int, pinned_in: list[bool]) -> dict[str, Any]:
    """The pass's pin figures from its report data (``pinned_lookups`` / ``pinned_hits`` among them)."""
    lookups, hits = data["block_lookups"], data["hits_total"]
    p_lookups, p_hits = data["pinned_lookups"], data["pinned_hits"]
    rest_lookups, rest_hits = lookups - p_lookups, hits - p_hits
    return {
        "blocks": pinned,
        "pinned_in_tiers": pinned_in,
        "survived": survived,
        "pinned_lookups": p_lookups,
        "pinned_hit_ratio": p_hits / p_lookups if p_lookups else 0.0,
        "rest_lookups": rest_lookups,
        "rest_hit_ratio": rest_hits / rest_lookups if rest_lookups else 0.0,
    }


def format_pin_rows(passes: dict[str, dict[str, Any]]) -> list[str]:
    """The report's rows comparing the passes (``"pins off"``, ``"pins on"``)."""
    rows = ["pinned prefixes (the trace's most shared blocks):"]
    for name, fig in passes.items():
        rows.append(
            f"  {name:<9} {fig['blocks']} blocks, {fig['survived']} still stored at the end; hit ratio: pinned "
            f"{fig['pinned_hit_ratio']:.2%} of {fig['pinned_lookups']} lookups, rest {fig['rest_hit_ratio']:.2%} "
            f"of {fig['rest_lookups']}"
        )
    return rows

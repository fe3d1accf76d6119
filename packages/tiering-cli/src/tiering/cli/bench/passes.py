"""What ``tiering bench``'s text report says of its passes and policies, besides the tables of one pass.

- :func:`policies_line`: the policies a stack applies (admission per tier, the load cost model, tenants' quotas
  and TTL per tier), one header line;
- :func:`declined_counts`: blocks an admission policy did not write and hits the load cost model left to
  recompute, per tier, from a replay's metrics snapshot;
- :func:`pass_summary` / :func:`format_pass_rows`: one line per pass that ran (``--recompute-tokens-per-s`` and
  ``--pin`` replay twice) and which pass the tables show;
- :func:`name_tenants`: the tenants of a replay's tier figures by name (``tenant:t0:...``), not by tag.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tiering.core.declared import tenant_quotas
from tiering.core.policies.admission import ALWAYS, admission_config
from tiering.core.policies.tenancy import tenant_tag
from tiering.core.units import format_bytes, parse_duration

NAME_WIDTH = 18


def _row(name: str, text: str) -> str:
    return f"{name:<{NAME_WIDTH}} {text}"


def _tenants_text(tenants: Mapping[str, Any]) -> str:
    """``"default quota 4.0 MiB, TTL 2 s; t1 quota 2.0 MiB"`` of a tier's ``tenants`` value (sizes as given)."""
    parts = []
    quotas = dict(tenant_quotas(tenants))
    overrides = tenants.get("overrides")
    names = [("default", tenants.get("default"))]
    names += list(overrides.items()) if isinstance(overrides, Mapping) else []
    for name, limits in names:
        if not isinstance(limits, Mapping):
            continue
        where = "default" if name == "default" else f"overrides.{name}"
        figures = []
        if f"{where}.quota_bytes" in quotas:
            figures.append(f"quota {format_bytes(quotas[f'{where}.quota_bytes'])}")
        ttl = limits.get("ttl_s")
        if ttl is not None:  # seconds or a duration with a unit ("1h"), as the tier's own parser takes it
            figures.append(f"TTL {parse_duration(ttl) if isinstance(ttl, str) else ttl:g} s")
        if figures:
            parts.append(f"{name} {', '.join(figures)}")
    return "; ".join(parts) or "no quota, no TTL"


def policies_line(tier_configs: Sequence[Mapping[str, Any]], load_cost: str) -> str:
    """The policies of a stack in one line: ``policies: admission 0:fs second_sighting ...; load cost model: ...``.

    Args:
        tier_configs: the spec's ``secondary_tiers`` entries, in order.
        load_cost: the load cost model's own description (:meth:`LoadCostModel.describe`).
    """
    admission, tenants = [], []
    for index, entry in enumerate(tier_configs):
        name = f"{index}:{entry.get('type')}"
        config = admission_config(entry, index)
        sketch = f" (sketch of {format_bytes(config.sketch_bytes)})" if config.policy != ALWAYS else ""
        admission.append(f"{name} {config.policy}{sketch}")
        if isinstance(entry.get("tenants"), Mapping):
            tenants.append(f"{name} {_tenants_text(entry['tenants'])}")
    parts = [f"admission: {', '.join(admission) or 'no secondary tier'}", load_cost]
    parts.append(f"tenant limits: {' | '.join(tenants)}" if tenants else "tenant limits: none")
    return "policies: " + "; ".join(parts)


def _values(metrics: Mapping[str, Any], name: str) -> Iterable[tuple[dict[str, str], float]]:
    for sample in metrics.get(name) or []:
        if isinstance(sample, Mapping) and isinstance(sample.get("labels"), Mapping):
            yield dict(sample["labels"]), float(sample.get("value", 0))


def declined_counts(metrics: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Declined blocks per tier (``"0:fs"``) from a metrics snapshot (:func:`tiering.core.runtime.metrics.snapshot`).

    Returns:
        ``{"admission": {tier: blocks not written}, "load_cost": {tier: blocks left to recompute},
        "load_cost_max_load_s": {tier: of those, cut by max_load_s}}``; tiers with none are left out.
    """
    out: dict[str, dict[str, int]] = {"admission": {}, "load_cost": {}, "load_cost_max_load_s": {}}
    for labels, value in _values(metrics, "tiering_store_admission_total"):
        if labels.get("outcome") == "declined" and value:
            tier = f"{labels.get('index')}:{labels.get('tier')}"
            out["admission"][tier] = out["admission"].get(tier, 0) + int(value)
    for labels, value in _values(metrics, "tiering_loads_declined_total"):
        if value:
            tier = f"{labels.get('index')}:{labels.get('tier')}"
            out["load_cost"][tier] = out["load_cost"].get(tier, 0) + int(value)
            if labels.get("reason") == "max_load_s":
                out["load_cost_max_load_s"][tier] = out["load_cost_max_load_s"].get(tier, 0) + int(value)
    return out


def format_declined_row(declined: Mapping[str, Mapping[str, int]]) -> str:
    """The report's ``declined`` line: blocks not written by admission, hits not loaded by the load cost model."""
    admission = ", ".join(f"{t} {n:,} blocks" for t, n in sorted(declined.get("admission", {}).items()))
    cut = declined.get("load_cost_max_load_s", {})
    cost = ", ".join(
        f"{t} {n:,} blocks" + (f" ({cut[t]:,} by max_load_s)" if cut.get(t) else "")
        for t, n in sorted(declined.get("load_cost", {}).items())
    )
    return _row(
        "declined",
        f"admission (not written): {admission or 'none'}; load cost model (found, left to recompute): {cost or 'none'}",
    )


def pass_summary(name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """One pass's figures for its line of the report (and JSON ``passes``)."""
    return {
        "name": name,
        "requests": data["requests"],
        "hits_total": data["hits_total"],
        "hit_ratio": 1 - data["miss_ratio"],
        "hits": dict(data["hits"]),
        "declined": declined_counts(data.get("metrics") or {}),
        "wall_s": data["wall_s"],
    }


def format_pass_rows(passes: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line per pass that ran; the last is the one the tables show. Nothing for a single pass."""
    if len(passes) < 2:
        return []
    lines = [
        _row(
            "passes",
            f"{len(passes)} replays of the same requests, each on a fresh stack; "
            f"the tables above are those of the last ({passes[-1]['name']})",
        )
    ]
    for p in passes:
        served = ", ".join(f"{t} {n:,}" for t, n in sorted(p["hits"].items()) if t != "primary") or "none"
        declined = sum(p["declined"]["load_cost"].values())
        not_written = sum(p["declined"]["admission"].values())
        lines.append(
            _row(
                f"  {p['name']}",
                f"{p['requests']:,} requests, hits {p['hits_total']:,} blocks ({p['hit_ratio']:.1%}; secondary "
                f"tiers served {served}), declined by the load cost model {declined:,}, not written by admission "
                f"{not_written:,}, replay {p['wall_s']:.2f} s",
            )
        )
    return lines


def name_tenants(stats: Mapping[str, Any], names: Iterable[str]) -> dict[str, Any]:
    """``stats`` with each ``tenant:tag:<hex>:<figure>`` of a tenant in ``names`` as ``tenant:<name>:<figure>``.

    A tier names a tenant by its config (overrides) or by one it saw in a store; the bench knows the names of the
    tenants it gave requests to (``t0``, ``t1``...), also of those whose blocks a tier only counted.
    """
    by_tag = {f"tenant:tag:{tenant_tag(name).hex()}:": f"tenant:{name}:" for name in names if name}
    out: dict[str, Any] = {}
    for key, value in stats.items():
        prefix = key[: len("tenant:tag:") + 32 + 1]
        out[by_tag[prefix] + key[len(prefix) :] if prefix in by_tag else key] = value
    return out


def tenant_rows(tier_stats: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report's per-tenant lines of each tier with tenant figures: resident, quota, quota evictions, TTL."""
    lines = []
    for tier, stats in sorted(tier_stats.items()):
        figures: dict[str, dict[str, float]] = {}
        for key, value in stats.items():
            if key.startswith("tenant:"):
                name, _, figure = key.removeprefix("tenant:").rpartition(":")
                figures.setdefault(name, {})[figure] = value
        for name, f in sorted(figures.items()):
            quota = f.get("quota_bytes") or 0
            lines.append(
                _row(
                    f"  {tier} {name or '(default)'}",
                    f"{int(f.get('resident_blocks', 0)):,} blocks ({format_bytes(f.get('resident_bytes', 0))}), "
                    f"quota {format_bytes(quota) if quota else 'none'}, evicted at its quota "
                    f"{int(f.get('quota_evictions', 0)):,}, expired (TTL) {int(f.get('expirations', 0)):,}",
                )
            )
    if not lines:
        return []
    return [
        _row("tenants", "per tier and tenant: resident at the end, quota, blocks evicted at the quota, expired"),
        *lines,
    ]

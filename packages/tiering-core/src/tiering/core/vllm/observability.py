"""What vLLM sees of a tiering tier: its stats as vLLM gauges, its config-info labels and its KV events.

The tier wrapper (:class:`~tiering.core.vllm.tier.TieringSecondaryTier`)
hands these to vLLM's offloading metrics (``get_stats``,
``build_metric_definitions``, ``config_info`` on vLLM >= 0.33) and to vLLM's
KV-event publisher (``take_events``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

from tiering.core.base import SecondaryTierManager as TieringTierManager
from tiering.core.events import BlockRemoved, KVEvent
from tiering.core.vllm.compat import (
    ConfigInfoMapping,
    OffloadingConnectorStats,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
)

STAT_METRIC = "vllm:kv_offload_tiering_backend_stat"
"""The gauge carrying a tiering tier's :meth:`~tiering.core.base.SecondaryTierManager.stats`."""
STAT_LABELS = ("tiering_tier", "stat")
"""Labels of :data:`STAT_METRIC`: the ``type`` of the tier entry and the stat's name."""
INFO_KEYS = ("tiering_tier", "tiering_namespace")
"""Labels a tiering tier adds to vLLM's ``vllm:kv_offload_config_info`` (vLLM >= 0.33)."""


def metric_definitions() -> dict[str, OffloadingMetricMetadata]:
    """Declare :data:`STAT_METRIC`, the gauge that carries a tier's ``stats()``."""
    return {
        STAT_METRIC: OffloadingGaugeMetadata(
            documentation=(
                "A tiering secondary tier's own counters and levels (hits, failures by cause, "
                "bytes, resident blocks, ...), as the tier reports them, labeled by tier type and stat name."
            ),
            labelnames=STAT_LABELS,
        )
    }


def stats_payload(tier_type: str, stats: Mapping[str, int | float]) -> Any:
    """``stats`` (stat name -> value) as vLLM ``OffloadingConnectorStats`` gauges of :data:`STAT_METRIC`."""
    payload = OffloadingConnectorStats()
    for name, value in stats.items():
        payload.set_gauge(STAT_METRIC, float(value), (tier_type, str(name)))
    return payload


def config_info_of(name: str, tier: TieringTierManager, namespace_digest: str) -> ConfigInfoMapping:
    """The :data:`INFO_KEYS` labels: the tier's name, class and package version, and its namespace digest."""
    inner = type(tier)
    package = sys.modules.get(".".join(inner.__module__.split(".")[:2]))
    version = getattr(package, "__version__", None)
    dist = f" {version}" if isinstance(version, str) else ""
    return {
        "tiering_tier": f"{name} ({inner.__module__}.{inner.__qualname__}{dist})",
        "tiering_namespace": namespace_digest,
    }


def to_offloading_events(events: Iterable[KVEvent], medium: Any, locality: Any, ownership: str) -> list[Any]:
    """A tiering tier's KV events as vLLM ``OffloadingEvent`` s.

    ``BlockStored`` becomes a stored event with ``removal_expected`` (a
    removal will follow), ``BlockRemoved`` a removed one; each carries the
    tier's vLLM ``medium`` and ``locality`` and ``ownership`` (the entry's
    ``type``), so vLLM tracks the tier's residency apart from the primary
    tier's. Events without keys are dropped.
    """
    return [
        OffloadingEvent(
            keys=[OffloadKey(bytes(k)) for k in event.keys],
            medium=medium,
            removed=isinstance(event, BlockRemoved),
            locality=locality,
            ownership=ownership,
            removal_expected=not isinstance(event, BlockRemoved),
        )
        for event in events
        if event.keys
    ]

"""Prometheus exposition of a stack's metrics (the ``metrics`` extra: ``pip install 'tiering-core[metrics]'``).

A custom collector turns :func:`tiering.core.runtime.metrics.collect` into metric
families at every scrape, so the numbers are the very ones of the plain
snapshot; nothing is registered in ``prometheus_client``'s global registry
unless asked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tiering.core.runtime.metrics import COUNTERS, GAUGES, HISTOGRAMS, PREFIX, Labels, collect

try:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised in the core-only environment
    raise ImportError("Prometheus metrics need prometheus_client: pip install 'tiering-core[metrics]'") from exc

if TYPE_CHECKING:
    from tiering.core.runtime.manager import TieringManager


class StackCollector(Collector):
    """Collects every metric of ``manager``'s stack on each scrape.

    Args:
        manager: the stack to expose.
    """

    def __init__(self, manager: TieringManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator[Any]:
        counters, gauges, histograms = collect(self.manager)
        for name, doc in COUNTERS.items():
            samples = counters.get(name, {})
            if not samples:
                continue
            labels = _label_names(samples)
            # CounterMetricFamily adds the _total suffix itself.
            family = CounterMetricFamily(PREFIX + name.removesuffix("_total"), doc, labels=labels)
            for key, value in sorted(samples.items()):
                family.add_metric(_label_values(key, labels), value)
            yield family
        for name, doc in GAUGES.items():
            samples = gauges.get(name, {})
            if not samples:
                continue
            labels = _label_names(samples)
            gauge = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            for key, value in sorted(samples.items()):
                gauge.add_metric(_label_values(key, labels), value)
            yield gauge
        for name, doc in HISTOGRAMS.items():
            hists = histograms.get(name, {})
            if not hists:
                continue
            labels = _label_names(hists)
            histogram = HistogramMetricFamily(PREFIX + name, doc, labels=labels)
            for key, hist in sorted(hists.items()):
                histogram.add_metric(_label_values(key, labels), hist.cumulative(), sum_value=hist.total)
            yield histogram


def _label_names(samples: dict[Labels, Any]) -> list[str]:
    return sorted({name for key in samples for name, _ in key})


def _label_values(key: Labels, names: list[str]) -> list[str]:
    return [dict(key).get(name, "") for name in names]


def registry_for(manager: TieringManager) -> CollectorRegistry:
    """A fresh ``CollectorRegistry`` holding a :class:`StackCollector` of ``manager``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StackCollector(manager))
    return registry


def serve(manager: TieringManager, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` for ``manager`` on ``addr:port`` from a daemon thread.

    Returns:
        What ``prometheus_client.start_http_server`` returns (server, thread).

    Raises:
        OSError: the port cannot be bound.
    """
    return start_http_server(port, addr=addr, registry=registry_for(manager))

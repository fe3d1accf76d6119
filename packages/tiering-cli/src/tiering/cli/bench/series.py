"""Time series of a replay: hit ratio and bytes moved per tier, by request index."""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from typing import Any

WINDOW = 100
"""Requests in the moving window of the hit-ratio series."""

MAX_POINTS = 400
"""At most this many points per series (evenly spaced samples)."""


@dataclasses.dataclass
class ReplaySeries:
    """Per-request samples of a replay.

    Attributes:
        index: request index of each point.
        timestamp_ms: the request's trace time.
        hit_ratio: per tier label, hits / lookups over the last :data:`WINDOW` requests.
        bytes_stored: per tier label, cumulative bytes written into the tier.
        bytes_loaded: per tier label, cumulative bytes the tier served to requests
            (the report's ``bytes_loaded``).
    """

    index: list[int] = dataclasses.field(default_factory=list)
    timestamp_ms: list[float] = dataclasses.field(default_factory=list)
    hit_ratio: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    bytes_stored: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    bytes_loaded: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    _window: deque[tuple[Counter[str], int]] = dataclasses.field(default_factory=lambda: deque(maxlen=WINDOW))

    def record(
        self,
        index: int,
        timestamp_ms: float,
        hits: Counter[str],
        lookups: int,
        stored: dict[str, int],
        loaded: dict[str, int],
        tiers: list[str],
    ) -> None:
        """Add one request's outcome (``hits`` per tier label, ``lookups`` blocks, cumulative bytes)."""
        self._window.append((hits, lookups))
        total = sum(n for _, n in self._window) or 1
        self.index.append(index)
        self.timestamp_ms.append(timestamp_ms)
        for tier in tiers:
            self.hit_ratio.setdefault(tier, []).append(sum(h[tier] for h, _ in self._window) / total)
            self.bytes_stored.setdefault(tier, []).append(stored.get(tier, 0))
            self.bytes_loaded.setdefault(tier, []).append(loaded.get(tier, 0))

    def to_dict(self) -> dict[str, Any]:
        """At most :data:`MAX_POINTS` evenly spaced points of every series, JSON-ready."""
        step = max(1, len(self.index) // MAX_POINTS)
        pick = slice(None, None, step)
        return {
            "window_requests": WINDOW,
            "index": self.index[pick],
            "timestamp_ms": self.timestamp_ms[pick],
            "hit_ratio": {k: v[pick] for k, v in self.hit_ratio.items()},
            "bytes_stored": {k: v[pick] for k, v in self.bytes_stored.items()},
            "bytes_loaded": {k: v[pick] for k, v in self.bytes_loaded.items()},
        }

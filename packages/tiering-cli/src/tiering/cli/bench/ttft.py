"""The modelled time to first token of a replay: each request's loads against recomputing what it misses.

The replay records, per request, its prompt tokens, the tokens it loaded and
the seconds from its first lookup to its loaded blocks being readable
(:class:`RequestTimings`). At a recompute rate ``R`` (tokens per second) its
modelled time to first token is ``load_s + (prompt_tokens - loaded_tokens) / R``
and recomputing the whole prompt takes ``prompt_tokens / R``
(:func:`modelled_ttft`). The engine's own overheads (scheduling, the copy
to the device, sampling) are left out: both figures would carry them.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from tiering.cli.bench.report import _row


@dataclasses.dataclass
class RequestTimings:
    """Per request of a replay, in order: prompt tokens, tokens loaded, seconds spent in lookup and load."""

    prompt_tokens: list[int] = dataclasses.field(default_factory=list)
    loaded_tokens: list[int] = dataclasses.field(default_factory=list)
    load_s: list[float] = dataclasses.field(default_factory=list)

    def record(self, prompt_tokens: int, loaded_tokens: int, load_s: float) -> None:
        """Append one request."""
        self.prompt_tokens.append(prompt_tokens)
        self.loaded_tokens.append(loaded_tokens)
        self.load_s.append(load_s)

    def to_dict(self) -> dict[str, list[Any]]:
        """The three lists, JSON-ready."""
        return dataclasses.asdict(self)


def modelled_ttft(timings: dict[str, list[Any]], tokens_per_s: float) -> dict[str, float]:
    """Modelled time to first token of every request of a replay at ``tokens_per_s``.

    Args:
        timings: :meth:`RequestTimings.to_dict` output.
        tokens_per_s: the recompute rate (> 0).

    Returns:
        ``requests``; ``mean_s`` / ``p50_s`` / ``p90_s`` of the modelled TTFT;
        ``recompute_mean_s`` (every prompt recomputed); ``ratio`` (mean over
        recompute mean, < 1: the tiers shorten TTFT); ``load_s`` (mean load
        time); ``worse_requests`` (requests whose modelled TTFT exceeds their
        recompute time by more than 5%).

    Raises:
        ValueError: ``tokens_per_s`` is not > 0.
    """
    if not tokens_per_s > 0:
        raise ValueError(f"recompute rate must be > 0 tokens/s, got {tokens_per_s!r}")
    ttft, recompute, worse = [], [], 0
    for prompt, loaded, load_s in zip(
        timings["prompt_tokens"], timings["loaded_tokens"], timings["load_s"], strict=True
    ):
        full = prompt / tokens_per_s
        mine = load_s + (prompt - loaded) / tokens_per_s
        ttft.append(mine)
        recompute.append(full)
        worse += mine > 1.05 * full
    if not ttft:
        return {
            "requests": 0,
            "mean_s": 0.0,
            "p50_s": 0.0,
            "p90_s": 0.0,
            "recompute_mean_s": 0.0,
            "ratio": 0.0,
            "load_s": 0.0,
            "worse_requests": 0,
        }
    ordered = sorted(ttft)
    mean = statistics.fmean(ttft)
    recompute_mean = statistics.fmean(recompute)
    return {
        "requests": len(ttft),
        "mean_s": mean,
        "p50_s": ordered[len(ordered) // 2],
        "p90_s": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "recompute_mean_s": recompute_mean,
        "ratio": mean / recompute_mean if recompute_mean else 0.0,
        "load_s": statistics.fmean(timings["load_s"]),
        "worse_requests": worse,
    }


def format_ttft_rows(views: dict[str, dict[str, float]], tokens_per_s: float) -> list[str]:
    """Report lines: one per view (``"model off"``, ``"model on"``) of :func:`modelled_ttft` figures."""
    lines = [
        _row(
            "modelled TTFT",
            f"per request: its lookup and load time plus its missing tokens recomputed at {tokens_per_s:g} "
            "tokens/s, against recomputing the whole prompt",
        )
    ]
    for name, v in views.items():
        lines.append(
            _row(
                f"  {name}",
                f"mean {v['mean_s'] * 1e3:.1f} ms ({v['ratio']:.3f}x recompute "
                f"{v['recompute_mean_s'] * 1e3:.1f} ms), p50 {v['p50_s'] * 1e3:.1f} ms, p90 {v['p90_s'] * 1e3:.1f} ms, "
                f"mean load {v['load_s'] * 1e3:.1f} ms; {v['worse_requests']:,} requests > 1.05x their recompute",
            )
        )
    return lines

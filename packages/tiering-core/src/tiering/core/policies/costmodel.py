"""Load only when it pays: a measured model of each tier's load time against recompute.

A cached prefix is worth loading only while loading it is faster than the
engine computing the same tokens again. :class:`LoadTimeModel` predicts the
seconds of one load job of a tier (``latency + bytes / throughput``) from the
tier's own finished load jobs; :class:`LoadCostModel` holds one per tier and,
at lookup, cuts a found prefix where loading stops paying
(:meth:`LoadCostModel.plan`): the blocks in the CPU primary tier always pay
(no load), then each further block counts at its tier's predicted time, the
tiers' jobs running side by side. The recompute rate (tokens per second) is
configured (``recompute_tokens_per_s``); without it only ``max_load_s``
bounds a load.

Config keys (top level of the offloading config, :data:`COST_SCHEMA`):
``load_cost_model`` (on by default), ``recompute_tokens_per_s``,
``max_load_s`` and ``load_cost_margin``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from tiering.core.base import PRIMARY
from tiering.core.schema import ConfigKey, ConfigSchema, TierConfigError

COST_SCHEMA = ConfigSchema(
    "cost model",
    [
        ConfigKey(
            "load_cost_model",
            (bool,),
            default=True,
            doc="cut a found prefix where loading it is predicted slower than recomputing it; false loads every hit",
        ),
        ConfigKey(
            "recompute_tokens_per_s",
            (float,),
            nullable=True,
            minimum=0,
            exclusive_minimum=True,
            doc="the engine's prefill rate in tokens per second (null: loads are bounded by max_load_s only)",
        ),
        ConfigKey(
            "max_load_s",
            (float,),
            nullable=True,
            minimum=0,
            exclusive_minimum=True,
            doc="the longest predicted load time in seconds a lookup accepts (null: no fixed bound)",
        ),
        ConfigKey(
            "load_cost_margin",
            (float,),
            default=1.1,
            minimum=1,
            doc="a load must be predicted this many times faster than recomputing its tokens",
        ),
    ],
)
"""The cost model's keys of the offloading config (``tiering check`` validates them)."""

COST_KEYS = frozenset(COST_SCHEMA.keys)
"""Names of the cost model's config keys."""

REPROBE_S = 10.0
"""Seconds after which a tier whose loads are all declined gets one load again: its model learns whether
the tier became faster (a declined tier produces no measurement otherwise). One load, not a window: until
its measurement comes (or for another ``REPROBE_S`` if it never does), every other decision keeps the old fit,
so a slow tier's re-probe cannot send every request that arrives meanwhile to it."""

SEED_JOBS = 3
"""Load jobs a tier's model waits for before it predicts; they are fitted median first, so one slow
first job (a cold cache, a connection being opened) cannot shut a fast tier out. They run one at a time:
while one is in flight (up to ``REPROBE_S``), the tier's blocks are declined with reason ``"probing"``,
so a tier slower than recompute costs its first requests one slow load each, not one per request
arriving before three loads have reported."""

PROBING = (math.inf, math.inf)
"""The fit :meth:`LoadCostModel._fits` gives a tier not measured yet whose measuring load is in flight."""


@dataclasses.dataclass(frozen=True)
class LoadCostConfig:
    """The cost model's settings, read from the offloading config.

    Attributes:
        enabled: ``load_cost_model``.
        recompute_tokens_per_s: tokens per second the engine prefills, None when unknown.
        max_load_s: the longest predicted load accepted (seconds), None for no bound.
        margin: loading must be predicted ``margin`` times faster than recomputing.
    """

    enabled: bool = True
    recompute_tokens_per_s: float | None = None
    max_load_s: float | None = None
    margin: float = 1.1

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LoadCostConfig:
        """Read the :data:`COST_KEYS` of an offloading config (other keys are ignored).

        Raises:
            ValueError: a value is of the wrong type or range; the message names the key.
        """
        try:
            values = COST_SCHEMA.validate({k: v for k, v in config.items() if k in COST_KEYS})
        except TierConfigError as exc:
            raise ValueError(f"config key {exc.key!r}: {exc.problem}") from None
        return cls(
            values["load_cost_model"],
            values["recompute_tokens_per_s"],
            values["max_load_s"],
            values["load_cost_margin"],
        )

    @property
    def rate_source(self) -> str:
        """Where the recompute rate comes from: ``"configured"`` or ``"none"``."""
        return "configured" if self.recompute_tokens_per_s else "none"

    def describe(self) -> str:
        """One line for ``tiering check`` and reports."""
        if not self.enabled:
            return "load cost model: off (every hit is loaded)"
        rate = (
            f"recompute {self.recompute_tokens_per_s:g} tokens/s (configured)"
            if self.recompute_tokens_per_s
            else "recompute rate unknown (set recompute_tokens_per_s)"
        )
        bound = f"max_load_s {self.max_load_s:g}" if self.max_load_s else "no max_load_s"
        return f"load cost model: on; {rate}; {bound}; margin {self.margin:g}"


class LoadTimeModel:
    """Predicted seconds of one load job of one tier: ``latency_s + bytes / bytes_per_s``.

    Fitted by exponentially weighted least squares over the tier's finished
    load jobs (each a pair: bytes, seconds from submission to report). An
    outlier (a job stalled behind a garbage collection, a network hiccup) is
    clipped to the prediction plus three times the mean absolute error (at
    least half the prediction) before it counts, so one slow job moves the
    model by a bounded step while a lasting change still wins within a few jobs.
    Nothing is predicted before :data:`SEED_JOBS` jobs, which are fitted
    closest to their median first.

    Args:
        weight: weight of the newest job (0..1]; older ones decay by ``1 - weight``.
    """

    def __init__(self, weight: float = 0.2) -> None:
        self.weight = weight
        self.jobs = 0
        self.last_update = 0.0
        self.probe_since: float | None = None  # when the load measuring the tier (seed or re-probe) was let through
        self.probe_owner: str | None = None  # the request a seed load was let through for
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self._abs_err: float | None = None
        self._seed: list[tuple[int, float]] = []
        self._fitted = 0

    def observe(self, nbytes: int, seconds: float, now: float) -> None:
        """Count one finished load job of ``nbytes`` bytes that took ``seconds``; ``now`` is monotonic seconds."""
        self.jobs += 1
        self.last_update = now
        self.probe_since = self.probe_owner = None
        if self.jobs < SEED_JOBS:
            self._seed.append((nbytes, seconds))
            return
        if self._seed:
            seed, self._seed = [*self._seed, (nbytes, seconds)], []
            median = sorted(t for _, t in seed)[len(seed) // 2]
            for job in sorted(seed, key=lambda job: abs(job[1] - median)):
                self._fit_job(*job)
            return
        self._fit_job(nbytes, seconds)

    def _fit_job(self, nbytes: int, seconds: float) -> None:
        predicted = self.predict(nbytes) if self._fitted else None
        if predicted is not None:
            spread = max(3 * (self._abs_err or 0.0), 0.5 * predicted)
            seconds = min(max(seconds, predicted - spread), predicted + spread)
            err = abs(seconds - predicted)
            self._abs_err = err if self._abs_err is None else self._abs_err + self.weight * (err - self._abs_err)
        keep = 1.0 - self.weight
        x, y = float(nbytes), seconds
        self._w = self._w * keep + 1.0
        self._x = self._x * keep + x
        self._y = self._y * keep + y
        self._xx = self._xx * keep + x * x
        self._xy = self._xy * keep + x * y
        self._fitted += 1

    def fit(self) -> tuple[float, float] | None:
        """``(latency_s, seconds_per_byte)``, or None before :data:`SEED_JOBS` jobs.

        Jobs all of one size cannot tell latency from throughput: then the
        whole time is counted per byte (latency 0).
        """
        if not self._fitted:
            return None
        mx, my = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mx * mx
        cov = self._xy / self._w - mx * my
        if mx > 0 and var > (0.05 * mx) ** 2 and cov > 0:
            slope = cov / var
            latency = my - slope * mx
            if latency >= 0:
                return latency, slope
        return 0.0, (my / mx if mx > 0 else 0.0)

    def predict(self, nbytes: int) -> float | None:
        """Predicted seconds of a job of ``nbytes`` bytes; None before :data:`SEED_JOBS` jobs."""
        fitted = self.fit()
        if fitted is None:
            return None
        latency, per_byte = fitted
        return max(latency + per_byte * nbytes, 0.0)

    def state(self) -> dict[str, float]:
        """``jobs``, ``latency_s`` and ``bytes_per_s`` (0 while unknown) for metrics and reports."""
        fitted = self.fit()
        latency, per_byte = fitted if fitted is not None else (0.0, 0.0)
        return {"jobs": self.jobs, "latency_s": latency, "bytes_per_s": 1.0 / per_byte if per_byte > 0 else 0.0}


@dataclasses.dataclass(frozen=True)
class LoadPlan:
    """What :meth:`LoadCostModel.plan` decided for one found prefix.

    Attributes:
        serve: how many leading blocks to load (the rest are recomputed).
        declined: per secondary tier index, blocks it holds that are left to recompute.
        reason: ``"cost"`` (slower than recompute), ``"max_load_s"``, ``"probing"`` (a tier not measured
            yet is being measured by another request's load), or ``""`` when nothing was declined.
        predicted_s: the predicted load time of the served blocks, seconds.
    """

    serve: int
    declined: dict[int, int]
    reason: str
    predicted_s: float


class LoadCostModel:
    """One :class:`LoadTimeModel` per secondary tier and the decision of how much of a prefix to load.

    Args:
        config: the settings.
        num_tiers: secondary tiers in the stack.
        block_bytes: bytes per block.
        block_tokens: tokens per block (recomputed per declined block).
        clock: monotonic seconds (a test passes its own).
    """

    def __init__(
        self,
        config: LoadCostConfig,
        num_tiers: int,
        block_bytes: int,
        block_tokens: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.block_bytes = block_bytes
        self.block_tokens = block_tokens
        self.clock = clock
        self.tiers = [LoadTimeModel() for _ in range(num_tiers)]

    def observe(self, tier_idx: int, nbytes: int, seconds: float) -> None:
        """Count a finished load job of tier ``tier_idx``."""
        self.tiers[tier_idx].observe(nbytes, seconds, self.clock())

    def predict(self, tier_idx: int, nbytes: int) -> float | None:
        """Predicted seconds of a job of ``nbytes`` bytes from tier ``tier_idx`` (None: not measured yet)."""
        return self.tiers[tier_idx].predict(nbytes)

    def recompute_s(self, blocks: int) -> float | None:
        """Predicted seconds to recompute ``blocks`` blocks' tokens (None: the rate is unknown)."""
        rate = self.config.recompute_tokens_per_s
        return blocks * self.block_tokens / rate if rate else None

    def _fits(self, now: float, loading: Collection[int], owner: str | None) -> list[tuple[float, float] | None]:
        # Per tier (latency_s, seconds per block); None: the tier counts as free, its load is the measurement.
        # A tier of ``loading`` not measured for REPROBE_S counts as free once, for the decision asking now
        # (its load re-measures it); until that measurement comes, its old fit holds.
        # A tier not measured yet is measured by one request at a time (``owner``, asking as often as it
        # needs): while that request's load is in flight the tier has no fit to decide the others by, so
        # their blocks there are declined (PROBING).
        fits: list[tuple[float, float] | None] = []
        for idx, model in enumerate(self.tiers):
            fitted = model.fit()
            probing = model.probe_since is not None and now - model.probe_since < REPROBE_S
            if fitted is None and probing:
                fits.append(None if owner is not None and model.probe_owner == owner else PROBING)
            elif (fitted is None or now - model.last_update >= REPROBE_S) and not probing and idx in loading:
                model.probe_since, model.probe_owner = now, owner if fitted is None else None
                fits.append(None)
            else:
                fits.append(None if fitted is None else (fitted[0], fitted[1] * self.block_bytes))
        return fits

    def plan(self, sources: Sequence[int], owner: str | None = None) -> LoadPlan:
        """How many leading blocks of a found prefix to load.

        Args:
            sources: per block of the prefix, :data:`~tiering.core.base.PRIMARY` or
                the index of the secondary tier that would serve it.
            owner: the request asking (its id); a request whose load measures a tier not measured yet
                gets the same answer each time it asks (:data:`SEED_JOBS`). None: every ask is a new request.

        Returns:
            The longest prefix with the largest predicted saving (recompute
            time of its blocks minus ``margin`` times its load time, never
            negative) whose predicted load time is at most ``max_load_s``;
            the whole prefix when the model is off. Without a recompute rate
            only ``max_load_s`` cuts.
        """
        cfg = self.config
        unbounded = cfg.recompute_tokens_per_s is None and cfg.max_load_s is None
        if not cfg.enabled or unbounded or all(s == PRIMARY for s in sources):
            return LoadPlan(len(sources), {}, "", 0.0)
        fits = self._fits(self.clock(), set(sources), owner)
        # The tiers' jobs run side by side: a load takes as long as its slowest job.
        counts: dict[int, int] = defaultdict(int)
        best, best_gain, best_load, load, reason = 0, 0.0, 0.0, 0.0, ""
        for n, source in enumerate(sources, 1):
            fit = fits[source] if source != PRIMARY else None
            if fit is PROBING:
                reason = "probing"
                break
            if fit is not None:
                counts[source] += 1
                load = max(load, fit[0] + fit[1] * counts[source])
            if cfg.max_load_s is not None and load > cfg.max_load_s:
                reason = "max_load_s"
                break
            recompute = self.recompute_s(n)
            gain = 0.0 if recompute is None else recompute - cfg.margin * load
            if recompute is None or gain >= best_gain:
                best, best_gain, best_load = n, gain, load
        if best < len(sources) and not reason:
            reason = "cost"
        declined: dict[int, int] = defaultdict(int)
        for source in sources[best:]:
            if source != PRIMARY:
                declined[source] += 1
        return LoadPlan(best, dict(declined), reason if declined else "", best_load)

    def admits(self, tier_idx: int, blocks: int, owner: str | None = None) -> str:
        """Whether block number ``blocks`` (from 1) of a request is still worth loading from tier ``tier_idx``.

        For an engine that asks a tier one block at a time (vLLM), without
        the rest of the prefix: the block pays when the tier's time per
        block, times ``margin``, is below the block's recompute time, and
        the ``blocks`` blocks' predicted load stays within ``max_load_s``.
        The tier's latency is not held against the first blocks (the
        prefix may run long enough to amortize it). ``owner``: as for :meth:`plan`; the request measuring a
        tier not measured yet has every block it finds there admitted, so its load is one job of its size.

        Returns:
            ``""`` to load it, else the reason: ``"cost"``, ``"max_load_s"`` or ``"probing"`` (the tier is
            not measured yet and its measuring load is in flight: :data:`SEED_JOBS`).
        """
        cfg = self.config
        if not cfg.enabled or (cfg.recompute_tokens_per_s is None and cfg.max_load_s is None):
            return ""
        fit = self._fits(self.clock(), (tier_idx,), owner)[tier_idx]
        if fit is None:
            return ""
        if fit is PROBING:
            return "probing"
        latency, per_block = fit
        if cfg.max_load_s is not None and latency + per_block * blocks > cfg.max_load_s:
            return "max_load_s"
        recompute = self.recompute_s(1)
        if recompute is not None and cfg.margin * per_block > recompute:
            return "cost"
        return ""

    def state(self) -> dict[str, Any]:
        """The model's state: settings, rate source and each tier's fit (``tiers[i]``: :meth:`LoadTimeModel.state`)."""
        return {
            "enabled": self.config.enabled,
            "recompute_tokens_per_s": self.config.recompute_tokens_per_s,
            "recompute_rate_source": self.config.rate_source,
            "max_load_s": self.config.max_load_s,
            "margin": self.config.margin,
            "tiers": [t.state() for t in self.tiers],
        }

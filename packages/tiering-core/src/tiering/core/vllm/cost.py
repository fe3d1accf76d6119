"""The load cost model inside vLLM, one tier at a time.

vLLM's own manager answers the engine's lookups and asks each secondary
tier block by block (see ``docs/content/costmodel.md``), so a tier wrapper
cannot cut a prefix as tiering's manager does. :class:`LoadGate` gives it
what it can decide alone: it measures the tier's promotions (submission to
report) and answers MISS for a request's next block once the tier's time per
block exceeds recomputing it, or the request's blocks from this tier exceed
``max_load_s`` (:meth:`~tiering.core.policies.costmodel.LoadCostModel.admits`). With
neither ``recompute_tokens_per_s`` nor ``max_load_s`` configured it never
declines. Before the tier is measured, one request at a time loads from it (every
block it finds there), and the others' blocks are MISS with reason
``probing`` until that load reports
(:data:`~tiering.core.policies.costmodel.SEED_JOBS`). Imports nothing from vLLM.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from tiering.core.policies.costmodel import LoadCostConfig, LoadCostModel


class LoadGate:
    """Decides, per block a tier is asked for, whether loading it still pays.

    Args:
        extra_config: the offloading config (its cost model keys are read).
        block_bytes: bytes per block (vLLM's chunk).
        block_tokens: tokens per block.
        clock: monotonic seconds (a test passes its own).

    Raises:
        ValueError: a cost model key is of the wrong type or range; the message names it.
    """

    def __init__(
        self,
        extra_config: Mapping[str, Any],
        block_bytes: int,
        block_tokens: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = LoadCostModel(LoadCostConfig.from_config(extra_config), 1, block_bytes, block_tokens, clock)
        self._clock = clock
        self._loads: dict[int, tuple[float, int]] = {}  # job id -> (submitted, blocks)
        self._admitted: Counter[str] = Counter()  # request id -> blocks admitted so far
        self.declined: Counter[str] = Counter()  # reason -> blocks declined

    def admit(self, req_id: str) -> bool:
        """Whether the request's next block found in the tier is to be loaded (False: answer MISS)."""
        reason = self.model.admits(0, self._admitted[req_id] + 1, req_id)
        if reason:
            self.declined[reason] += 1
            return False
        self._admitted[req_id] += 1
        return True

    def loading(self, job_id: int, blocks: int) -> None:
        """A promotion of ``blocks`` blocks was submitted to the tier."""
        self._loads[job_id] = (self._clock(), blocks)

    def finished(self, job_id: int, success: bool) -> None:
        """A promotion was reported; a whole one measures the tier."""
        started = self._loads.pop(job_id, None)
        if started is not None and success:
            submitted, blocks = started
            self.model.observe(0, blocks * self.model.block_bytes, self._clock() - submitted)

    def forget(self, req_id: str) -> None:
        """The request ended."""
        self._admitted.pop(req_id, None)

    def stats(self) -> dict[str, float]:
        """The gate's figures for the tier's stats gauge.

        ``loads_declined_<reason>`` (blocks), the fitted ``load_model_latency_s``
        and ``load_model_bytes_per_s``, the configured ``recompute_tokens_per_s`` (0: unknown).
        """
        fit = self.model.tiers[0].state()
        return {
            **{f"loads_declined_{reason}": float(n) for reason, n in self.declined.items()},
            "load_model_latency_s": fit["latency_s"],
            "load_model_bytes_per_s": fit["bytes_per_s"],
            "recompute_tokens_per_s": float(self.model.config.recompute_tokens_per_s or 0.0),
        }

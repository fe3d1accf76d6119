"""The load cost model through vLLM's own TieringOffloadingManager: a slow tier's blocks declined, a fast one's kept."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from tiering.core.policies.costmodel import SEED_JOBS
from tiering.testing import requires_tier, requires_vllm

# the slow tier is the bench's throttle (tiering-cli); vLLM's environments install it, core alone does not
ThrottledTier = pytest.importorskip("tiering.cli.bench.throttle").ThrottledTier

pytestmark = [requires_vllm(), requires_tier("example")]

ROW = 16384
RATE = 1600  # tokens/s: a chunk of 16 tokens recomputes in 10 ms
SLOW_S = 0.3  # per promotion job: 8 chunks take 37.5 ms each, more than recomputing them


class SlowExampleTier(ThrottledTier):
    """The example tier with every load reported :data:`SLOW_S` after it was submitted."""

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str) -> None:
        from tiering.example import ExampleSecondaryTierManager

        super().__init__(ExampleSecondaryTierManager(offloading_spec, primary_kv_view, tier_type), SLOW_S)


def stack(tier: str) -> Any:
    from tiering.core.factory import register_tier
    from tiering.testing import vllm_driver as testing

    with contextlib.suppress(ValueError):  # registered by an earlier test
        register_tier("slowexample", __name__, "SlowExampleTier")
    extra = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 64 * ROW,
        "recompute_tokens_per_s": RATE,
        "secondary_tiers": [{"type": f"tiering_{tier}", "module_path": "tiering.core.vllm.tiers"}],
    }
    return testing.vllm_manager(extra, worker_kv_bytes_per_block=ROW)


def served_after_measuring(tier: str) -> tuple[list[int], Any]:
    """Store 8 chunks; SEED_JOBS times empty the primary tier and load them back; then how many a lookup serves."""
    from tiering.testing import vllm_driver as testing

    keys = [testing.make_key(i) for i in range(8)]
    with stack(tier) as (_spec, manager, driver):
        driver.finish(driver.store([keys], lambda key: testing.payload(key, ROW)))
        driver.wait_idle()
        for _ in range(SEED_JOBS):
            driver.evict_all()
            ctx = driver.new_context()
            assert driver.lookup([keys], [ctx]).hits == [8]  # measured: loaded in full
            assert driver.read(keys, ctx) == [testing.payload(key, ROW) for key in keys]
            driver.finish([ctx])
        driver.evict_all()
        ctx = driver.new_context()
        hits = driver.lookup([keys], [ctx]).hits
        driver.finish([ctx])
        return hits, manager.secondary_tiers[0].get_stats()


def gauges(stats: Any) -> dict[str, float]:
    from tiering.core.vllm.observability import STAT_METRIC

    return {labels[1]: value for labels, value in stats._values[STAT_METRIC].items()}


def test_vllm_manager_recomputes_what_a_tier_slower_than_recompute_holds() -> None:
    hits, stats = served_after_measuring("slowexample")
    assert hits == [0]
    figures = gauges(stats)
    assert figures["loads_declined_cost"] == 1.0  # vLLM stops at the first MISS
    assert figures["recompute_tokens_per_s"] == RATE
    assert figures["load_model_bytes_per_s"] == pytest.approx(8 * ROW / SLOW_S, rel=0.5)


def test_vllm_manager_keeps_loading_from_a_fast_tier() -> None:
    hits, stats = served_after_measuring("example")
    assert hits == [8]
    assert "loads_declined_cost" not in gauges(stats)

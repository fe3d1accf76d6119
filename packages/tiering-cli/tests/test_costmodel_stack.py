"""The load cost model in a real stack: a throttled tier's loads declined, a fast tier's kept, the metrics."""

import time

import pytest

from tiering.cli.bench.throttle import ThrottledTier, parse_throttle
from tiering.core import ReqContext, TieringOffloadingSpec
from tiering.core.base import block_view
from tiering.core.policies.costmodel import SEED_JOBS
from tiering.core.runtime.manager import TieringManager
from tiering.core.runtime.metrics import snapshot
from tiering.testing import block_payload, make_key, requires_tier, wait_until

pytestmark = requires_tier("example")

BLOCK = 16 * 1024
TOKENS = 512  # 8 blocks: 205 ms to recompute at 20,000 tokens/s


def build(throttle=None, **keys):
    spec = TieringOffloadingSpec(
        {
            "cpu_bytes_to_use": 8 * BLOCK,
            "block_bytes": BLOCK,
            "block_size": TOKENS,
            "recompute_tokens_per_s": 20000,
            "secondary_tiers": [{"type": "example"}],
            **keys,
        }
    )
    primary = spec.create_primary()
    tiers = spec.create_secondary_tiers(primary.kv_view)
    if throttle is not None:
        tiers = [ThrottledTier(tiers[0], *throttle)]
    return TieringManager(primary, tiers, load_cost=spec.load_cost, block_tokens=TOKENS)


def store(manager, keys, req_id):
    ctx = ReqContext(req_id)
    alloc = manager.prepare_store(keys, ctx)
    for key, slot in zip(alloc.keys, alloc.block_ids, strict=True):
        block_view(manager.primary.kv_view, slot)[:] = block_payload(key, BLOCK)
    manager.complete_store(alloc.keys, ctx)
    manager.on_request_finished(ctx)
    wait_until(lambda: not manager.has_pending_work())


def load(manager, keys, req_id):
    """Lookup then load as an engine does; the number of blocks served (each checked)."""
    ctx = ReqContext(req_id)
    wait_until(lambda: manager.lookup(keys, ctx) is not None)
    n = manager.lookup(keys, ctx)
    loaded = 0
    if n:
        manager.prepare_load(keys[:n], ctx)
        results = []
        wait_until(lambda: results.extend(manager.get_finished()) or results, timeout_s=30)
        (result,) = results
        for key, slot in zip(result.keys, result.block_ids, strict=True):
            assert block_view(manager.primary.kv_view, slot) == block_payload(key, BLOCK)
        loaded = len(result.keys)
        manager.complete_load(ctx)
    manager.on_request_finished(ctx)
    return loaded


def evict(manager, salt):
    store(manager, [make_key(i, salt) for i in range(8)], f"evict-{salt!r}")


def measure(manager, prefix, rounds=SEED_JOBS):
    """Store ``prefix``, then ``rounds`` times: evict it from the primary tier and load it back from the tier."""
    store(manager, prefix, "first")
    for round_ in range(rounds):
        evict(manager, bytes([round_]))
        assert load(manager, prefix, f"measure-{round_}") == 8  # loaded in full: the tier is being measured
    evict(manager, b"last")


@pytest.fixture
def prefix():
    return [make_key(i, b"prefix") for i in range(8)]


def test_tier_slower_than_recompute_is_measured_then_declined(prefix):
    manager = build(throttle=(0.3, None))  # 300 ms per load > 205 ms of recompute for 8 blocks
    try:
        measure(manager, prefix)
        ctx = ReqContext("declined")
        assert manager.lookup(prefix, ctx) == 0
        assert manager.lookup(prefix, ctx) == 0  # looked up again at the next step: counted once
        assert manager.metrics.value("loads_declined_total", index="0", reason="cost") == 8
        state = manager.cost.state()
        assert state["recompute_rate_source"] == "configured"
        assert state["tiers"][0]["jobs"] == SEED_JOBS
        assert state["tiers"][0]["bytes_per_s"] == pytest.approx(8 * BLOCK / 0.3, rel=0.3)
        metrics = snapshot(manager)
        assert metrics["tiering_recompute_tokens_per_second"] == [
            {"labels": {"source": "configured"}, "value": 20000.0}
        ]
        (gauge,) = metrics["tiering_load_model_bytes_per_second"]
        assert gauge["labels"] == {"tier": "example", "index": "0"} and gauge["value"] > 0
    finally:
        manager.shutdown()


def test_fast_tier_keeps_loading_and_its_predictions_are_recorded(prefix):
    manager = build()
    try:
        measure(manager, prefix, SEED_JOBS + 2)
        assert manager.metrics.value("loads_declined_total") == 0
        labels = {"tier": "example", "index": "0"}
        # the seed jobs had no prediction; each job after them had one
        assert manager.metrics.histogram("load_predicted_seconds", **labels).count == 2
        assert manager.metrics.histogram("load_prediction_ratio", **labels).count == 2
    finally:
        manager.shutdown()


def test_model_off_and_max_load_s(prefix):
    off = build(throttle=(0.3, None), load_cost_model=False)
    bounded = build(throttle=(0.05, None), max_load_s=0.004)  # jobs of one size: 6.25 ms per block
    try:
        for manager in (off, bounded):
            measure(manager, prefix)
        assert load(off, prefix, "again") == 8
        assert bounded.lookup(prefix, ReqContext("again")) == 0
        assert bounded.metrics.value("loads_declined_total", reason="max_load_s") == 8
    finally:
        off.shutdown()
        bounded.shutdown()


def test_throttled_tier_reports_a_load_after_latency_plus_bytes_over_bandwidth(prefix):
    manager = build(throttle=parse_throttle(f"0.1,{8 * BLOCK * 5}"))  # 8 blocks: 0.1 s + 0.2 s
    try:
        measure(manager, prefix, rounds=0)
        start = time.monotonic()
        assert load(manager, prefix, "timed") == 8
        assert time.monotonic() - start >= 0.3
    finally:
        manager.shutdown()


def test_parse_throttle_rejects_bad_text():
    assert parse_throttle("0.05,20MiB") == (0.05, 20 * 1024 * 1024)
    assert parse_throttle("0") == (0.0, None)
    with pytest.raises(ValueError, match="expected LATENCY_S"):
        parse_throttle("fast")
    with pytest.raises(ValueError, match="bandwidth > 0"):
        parse_throttle("0.1,0")

"""The load cost model: fitted load times, the decision of how much of a prefix to load, its config keys."""

import pytest

from tiering.core import TieringOffloadingSpec
from tiering.core.base import PRIMARY
from tiering.core.policies.costmodel import REPROBE_S, SEED_JOBS, LoadCostConfig, LoadCostModel, LoadTimeModel

MIB = 1 << 20
BLOCK = 16 * 1024
TOKENS = 512  # per block: 25.6 ms to recompute at 20,000 tokens/s


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def model(rate=20000.0, max_load_s=None, enabled=True, tiers=2, clock=None):
    cfg = LoadCostConfig(enabled, rate, max_load_s, 1.1)
    return LoadCostModel(cfg, tiers, BLOCK, TOKENS, clock=clock or Clock())


def test_fit_separates_latency_and_throughput():
    m = LoadTimeModel()
    for nbytes in (1 * MIB, 4 * MIB, 2 * MIB, 8 * MIB) * 3:
        m.observe(nbytes, 0.010 + nbytes / (100 * MIB), now=0.0)
    state = m.state()
    assert state["jobs"] == 12
    assert state["latency_s"] == pytest.approx(0.010, rel=1e-6)
    assert state["bytes_per_s"] == pytest.approx(100 * MIB, rel=1e-6)
    assert m.predict(16 * MIB) == pytest.approx(0.17, rel=1e-6)


def test_one_slow_first_job_cannot_shut_a_fast_tier_out():
    m = LoadTimeModel()
    for seconds in (2.0, 0.01, 0.01):  # a cold first read, then the tier's real speed
        m.observe(MIB, seconds, now=0.0)
    assert m.predict(MIB) < 0.015


def test_jobs_of_one_size_count_the_whole_time_per_byte():
    m = LoadTimeModel()
    assert m.predict(MIB) is None
    for _ in range(3):
        m.observe(MIB, 0.02, now=0.0)
    assert m.fit() == (0.0, pytest.approx(0.02 / MIB))
    assert m.predict(2 * MIB) == pytest.approx(0.04)


def test_one_outlier_moves_the_prediction_a_bounded_step_a_lasting_change_wins():
    m = LoadTimeModel()
    for _ in range(10):
        m.observe(MIB, 0.01, now=0.0)
    m.observe(MIB, 5.0, now=0.0)  # one job stalled 500x
    assert m.predict(MIB) < 0.012  # clipped to 1.5x, weighted 0.2: at most +10%
    for _ in range(30):
        m.observe(MIB, 0.1, now=0.0)  # the tier really became 10x slower
    assert m.predict(MIB) == pytest.approx(0.1, rel=0.05)


def test_plan_takes_the_local_disk_and_recomputes_the_slow_remote_tail():
    m = model()
    for _ in range(3):
        m.observe(0, 4 * BLOCK, 0.004)  # local disk: 1 ms per block, far below 25.6 ms of recompute
        m.observe(1, 4 * BLOCK, 0.4)  # remote: 100 ms per block
    plan = m.plan([PRIMARY] * 4 + [0] * 4 + [1] * 4)
    assert plan.serve == 8
    assert plan.declined == {1: 4}
    assert plan.reason == "cost"
    assert plan.predicted_s == pytest.approx(0.004)


def test_plan_loads_a_remote_tier_that_is_faster_than_recompute():
    m = model()
    for _ in range(3):
        m.observe(1, 4 * BLOCK, 0.04)  # 10 ms per block
    assert m.plan([PRIMARY, 1, 1, 1, 1]).serve == 5


def test_plan_loads_a_tier_not_measured_yet_and_one_not_measured_for_reprobe_s():
    clock = Clock()
    m = model(clock=clock)
    for _ in range(SEED_JOBS - 1):
        assert m.plan([1, 1, 1]).serve == 3  # not measured yet: the loads are the measurements
        m.observe(1, BLOCK, 1.0)
    assert m.plan([1, 1, 1]).serve == 3
    m.observe(1, BLOCK, 1.0)
    assert m.plan([1, 1, 1]).serve == 0
    clock.now += REPROBE_S
    assert m.plan([1, 1, 1]).serve == 3


def test_a_tier_not_measured_yet_is_measured_by_one_load_at_a_time():
    """While a seed load is in flight, other prefixes are cut where that tier's blocks begin ("probing")."""
    clock = Clock()
    m = model(clock=clock)
    for _ in range(3):
        m.observe(0, 4 * BLOCK, 0.004)  # tier 0 measured: fast
    assert m.plan([0, 1, 1], "seed").serve == 3  # the seed load of tier 1
    assert m.plan([0, 1, 1], "seed").serve == 3  # its request asks again (the next engine step): same answer
    plan = m.plan([PRIMARY, 0, 1, 1], "other")
    assert (plan.serve, plan.declined, plan.reason) == (2, {1: 2}, "probing")
    assert m.plan([0, 0], "other").serve == 2  # a prefix without tier 1 is not held up
    assert m.admits(1, 1) == "probing"
    assert m.admits(1, 5, "seed") == ""
    m.observe(1, 3 * BLOCK, 3.0)  # the seed reported (1 s per block): the next request seeds
    assert m.plan([1, 1]).serve == 2
    assert m.plan([1]).reason == "probing"
    clock.now += REPROBE_S  # a seed that never reports holds the tier for REPROBE_S at most
    assert m.plan([1, 1]).serve == 2
    m.observe(1, 2 * BLOCK, 2.0)
    m.observe(1, 2 * BLOCK, 2.0)
    assert m.tiers[1].jobs == SEED_JOBS
    assert m.plan([1, 1]).serve == 0  # measured: slower than recompute
    assert m.plan([1, 1]).reason == "cost"


def test_without_rate_or_bound_no_tier_is_probed():
    m = model(rate=None)
    assert [m.plan([1, 1]).serve for _ in range(3)] == [2, 2, 2]
    assert [m.admits(1, 1) for _ in range(3)] == ["", "", ""]


def test_a_stale_tier_gets_one_measuring_load_and_the_old_fit_holds_until_it_reports():
    """A re-probe is one load: the requests that arrive while it runs are decided by the old fit, not let through."""
    clock = Clock()
    m = model(clock=clock)
    for _ in range(SEED_JOBS):
        m.observe(1, BLOCK, 1.0)  # 1 s per block against 25.6 ms to recompute it
    clock.now += REPROBE_S
    assert m.plan([PRIMARY, 0]).serve == 2  # a prefix without tier 1 does not spend tier 1's re-probe
    assert m.plan([1, 1, 1]).serve == 3  # the re-probe
    assert [m.plan([1, 1, 1]).serve for _ in range(5)] == [0] * 5  # meanwhile: the old fit
    assert m.admits(1, 1) == "cost"
    m.observe(1, BLOCK, 1.0)  # the re-probe measured the tier: still slow
    clock.now += REPROBE_S - 0.1
    assert m.plan([1, 1, 1]).serve == 0
    clock.now += 0.1
    assert m.admits(1, 1) == ""  # the next re-probe (vLLM's gate asks block by block)
    assert m.admits(1, 2) == "cost"
    clock.now += REPROBE_S  # that load never reported (a failed job measures nothing): another re-probe
    assert m.plan([1, 1, 1]).serve == 3


def test_max_load_s_cuts_even_without_a_recompute_rate():
    m = model(rate=None, max_load_s=0.05)
    for _ in range(3):
        m.observe(0, BLOCK, 0.02)
    plan = m.plan([PRIMARY, 0, 0, 0, 0])
    assert plan.serve == 3  # 2 blocks: 40 ms; 3 blocks: 60 ms > 50 ms
    assert (plan.declined, plan.reason) == ({0: 2}, "max_load_s")
    assert model(rate=None).plan([0] * 4).serve == 4  # no rate, no bound: every hit


def test_model_off_loads_every_hit():
    m = model(enabled=False)
    m.observe(1, BLOCK, 10.0)
    assert m.plan([1, 1]).serve == 2


def test_cost_keys_are_read_and_checked_by_the_spec():
    base = {"cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK}
    spec = TieringOffloadingSpec({**base, "recompute_tokens_per_s": 5000, "max_load_s": 2})
    assert spec.load_cost == LoadCostConfig(True, 5000.0, 2.0, 1.1)
    assert spec.load_cost.rate_source == "configured"
    assert TieringOffloadingSpec(base).load_cost.rate_source == "none"
    with pytest.raises(ValueError, match=r"'recompute_tokens_per_s': must be a number > 0 or null, got 0"):
        TieringOffloadingSpec({**base, "recompute_tokens_per_s": 0})
    with pytest.raises(ValueError, match=r"'load_cost_model': must be true or false, got 'no'"):
        TieringOffloadingSpec({**base, "load_cost_model": "no"})
    with pytest.raises(ValueError, match=r"'max_load_sec' \(did you mean 'max_load_s'\?\)"):
        TieringOffloadingSpec({**base, "max_load_sec": 1})

"""The load cost model in the vLLM binding: a tier asked block by block (no vLLM needed)."""

import pytest

from tiering.core.policies.costmodel import SEED_JOBS
from tiering.core.vllm.cost import LoadGate

BLOCK = 384 * 1024
TOKENS = 32  # per block: 32 ms to recompute at 1,000 tokens/s


class Clock:
    def __init__(self):
        self.now = 50.0

    def __call__(self):
        return self.now


def seeded(seconds_per_block, clock=None, **config):
    """A gate whose tier answered SEED_JOBS promotions of 4 blocks, each taking ``4 * seconds_per_block``."""
    clock = clock or Clock()
    gate = LoadGate(config, BLOCK, TOKENS, clock=clock)
    for job_id in range(SEED_JOBS):
        gate.loading(job_id, 4)
        clock.now += 4 * seconds_per_block
        gate.finished(job_id, True)
    return gate


def test_slow_tier_blocks_are_declined_once_measured():
    gate = seeded(0.1, recompute_tokens_per_s=1000)  # 100 ms per block > 32 ms of recompute
    assert not gate.admit("r1")
    assert gate.declined == {"cost": 1}
    stats = gate.stats()
    assert stats["loads_declined_cost"] == 1.0
    assert stats["load_model_bytes_per_s"] == pytest.approx(BLOCK / 0.1)
    assert stats["recompute_tokens_per_s"] == 1000.0


def test_fast_tier_blocks_are_loaded():
    gate = seeded(0.01, recompute_tokens_per_s=1000)
    assert all(gate.admit("r1") for _ in range(50))
    assert gate.declined == {}


def test_tier_not_measured_yet_is_loaded_and_failed_jobs_do_not_measure():
    clock = Clock()
    gate = LoadGate({"recompute_tokens_per_s": 1000}, BLOCK, TOKENS, clock=clock)
    for job_id in range(SEED_JOBS):
        assert gate.admit("r1")
        gate.loading(job_id, 1)
        clock.now += 5.0
        gate.finished(job_id, False)
    assert gate.admit("r1")
    assert gate.model.tiers[0].jobs == 0


def test_one_request_at_a_time_measures_a_tier_not_measured_yet():
    """The seeding request loads every block the tier holds of it; the others are MISS until it reports."""
    clock = Clock()
    gate = LoadGate({"recompute_tokens_per_s": 1000}, BLOCK, TOKENS, clock=clock)
    assert all(gate.admit("seed") for _ in range(30))
    assert not gate.admit("other")
    assert gate.declined == {"probing": 1}
    gate.loading(1, 30)
    clock.now += 3.0  # 100 ms per block: slower than recompute, but one measurement is not a fit
    gate.finished(1, True)
    assert gate.admit("other")  # the next seed
    assert not gate.admit("third")
    gate.loading(2, 1)
    clock.now += 0.1
    gate.finished(2, True)
    assert gate.admit("third")
    gate.loading(3, 1)
    clock.now += 0.1
    gate.finished(3, True)
    assert not gate.admit("seed")  # measured (3 jobs): 100 ms per block > 32 ms of recompute
    assert gate.declined == {"probing": 2, "cost": 1}
    assert gate.stats()["loads_declined_probing"] == 2.0


def test_max_load_s_bounds_the_blocks_of_one_request():
    gate = seeded(0.01, max_load_s=0.035)  # 10 ms per block, no latency: 3 blocks fit
    assert [gate.admit("r1") for _ in range(5)] == [True, True, True, False, False]
    assert gate.declined == {"max_load_s": 2}
    gate.forget("r1")
    assert gate.admit("r1")


def test_without_rate_or_bound_nothing_is_declined():
    gate = seeded(10.0)
    assert gate.admit("r1")


def test_bad_key_names_it():
    with pytest.raises(ValueError, match="'max_load_s': must be a number > 0 or null"):
        LoadGate({"max_load_s": 0}, BLOCK, TOKENS)

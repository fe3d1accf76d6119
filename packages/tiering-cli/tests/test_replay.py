"""Replays of the real Mooncake trace, checked against an independent LRU simulation."""

import json
from collections import OrderedDict
from pathlib import Path

import pytest

from tiering.cli.bench import Replayer, VerificationError, load_mooncake_trace, payload_for, synthetic_chat
from tiering.cli.bench.workload import SHIPPED_TRACES, resolve_trace
from tiering.core import ReqContext, TieringOffloadingSpec
from tiering.core.base import block_view
from tiering.testing import requires_tier

TRACE = resolve_trace("mooncake-conversation")  # shipped inside tiering-core
SHARED = Path(__file__).resolve().parents[3] / ".." / "shared" / "traces"
BLOCK = 1024
CAPACITY = 500


def test_shipped_traces_are_the_published_files():
    for name, filename in SHIPPED_TRACES.items():
        shipped = resolve_trace(name).read_bytes()
        assert shipped.count(b"\n") == {"mooncake-conversation": 12031, "mooncake-synthetic": 3993}[name]
        if (SHARED / filename).exists():
            assert shipped == (SHARED / filename).read_bytes()
    data = resolve_trace("mooncake-conversation").parent
    assert "Apache License" in data.joinpath("LICENSE-APACHE-2.0").read_text()
    assert "kvcache-ai/Mooncake" in data.joinpath("README.md").read_text()


def test_unknown_trace_names_the_shipped_ones(tmp_path):
    with pytest.raises(ValueError, match="mooncake-conversation, mooncake-synthetic"):
        resolve_trace(str(tmp_path / "nope.jsonl"))


def simulate_lru(requests, capacity):
    """Straightforward prefix-cache LRU: hits are the leading run; later blocks are inserted or touched."""
    cache = OrderedDict()
    hits = 0
    for hash_ids in requests:
        n = 0
        while n < len(hash_ids) and hash_ids[n] in cache:
            n += 1
        hits += n
        for h in hash_ids:
            if h in cache:
                cache.move_to_end(h)
            else:
                if len(cache) >= capacity:
                    cache.popitem(last=False)
                cache[h] = None
    return hits


def primary_only(capacity, policy="lru"):
    spec = TieringOffloadingSpec(
        {"cpu_bytes_to_use": capacity * BLOCK, "block_bytes": BLOCK, "eviction_policy": policy}
    )
    return spec.get_manager()


def test_replay_hits_equal_independent_lru_simulation():
    with TRACE.open() as f:
        raw = [json.loads(line)["hash_ids"] for _, line in zip(range(2000), f)]
    expected = simulate_lru(raw, CAPACITY)
    report = Replayer(primary_only(CAPACITY), []).run(load_mooncake_trace(TRACE, 2000))
    assert report.requests == 2000
    assert report.block_lookups == sum(map(len, raw))
    assert report.total_hits == expected
    assert report.hits["primary"] == expected
    assert report.verified_blocks == expected
    assert expected > 1000  # the trace really reuses prefixes at this capacity


@requires_tier("example")
def test_replay_through_example_tier_serves_more_and_verifies():
    spec = TieringOffloadingSpec(
        {
            "cpu_bytes_to_use": CAPACITY * BLOCK,
            "block_bytes": BLOCK,
            "secondary_tiers": [{"type": "example"}],
        }
    )
    report = Replayer(spec.get_manager(), ["0:example"]).run(load_mooncake_trace(TRACE, 2000))
    with TRACE.open() as f:
        raw = [json.loads(line)["hash_ids"] for _, line in zip(range(2000), f)]
    unbounded = simulate_lru(raw, capacity=10**9)
    assert report.total_hits == unbounded  # the example tier is unbounded: every reuse hits
    assert report.hits["0:example"] > 0
    assert report.verified_blocks == report.total_hits
    assert report.bytes_stored["0:example"] == report.blocks_stored * BLOCK


def test_corrupted_primary_block_fails_the_replay():
    manager = primary_only(8)
    replayer = Replayer(manager, [])
    (req,) = list(synthetic_chat(1, 16, conversations=1, system_prompt_tokens=64, turn_tokens=(0, 0)))
    replayer.replay_one(req)
    block_view(manager.primary.kv_view, manager.primary.block_id(req.keys[0]))[:4] = b"evil"
    with pytest.raises(VerificationError, match="differs"):
        replayer.replay_one(req)


def test_synthetic_workload_is_deterministic_and_reuses_prefixes():
    a = list(synthetic_chat(50, 16, seed=3))
    b = list(synthetic_chat(50, 16, seed=3))
    assert a == b
    report = Replayer(primary_only(4096), []).run(a)
    assert report.total_hits > report.block_lookups // 2


def test_bad_trace_line_names_file_and_line(tmp_path):
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"hash_ids": [1]}\n{"timestamp": 0}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2"):
        list(load_mooncake_trace(bad))


def test_payload_is_key_specific():
    assert payload_for(b"a", 100) != payload_for(b"b", 100)
    assert len(payload_for(b"a", 100)) == 100


def test_replay_context_ids_are_unique():
    keys = {r.req_id for r in synthetic_chat(20, 16)}
    assert len(keys) == 20
    assert ReqContext("x").req_id == "x"

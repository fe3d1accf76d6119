"""``tiering bench --tenants N``: the stated rule, isolation on the real trace, the report header."""

import json
from collections import OrderedDict

import pytest

from tiering.cli.bench import Replayer, VerificationError, load_mooncake_trace
from tiering.cli.bench.workload import assign_tenants, resolve_trace, tenant_rule
from tiering.cli.main import main
from tiering.core import TieringOffloadingSpec

TRACE = resolve_trace("mooncake-conversation")
BLOCK = 1024
CAPACITY = 500
REQUESTS = 600


def _lru_hits(requests, capacity):
    """Leading-run hits of a plain LRU prefix cache over ``(tenant, hash_id)`` names."""
    cache, hits = OrderedDict(), 0
    for names in requests:
        n = 0
        while n < len(names) and names[n] in cache:
            n += 1
        hits += n
        for name in names:
            if name in cache:
                cache.move_to_end(name)
            else:
                if len(cache) >= capacity:
                    cache.popitem(last=False)
                cache[name] = None
    return hits


def _manager():
    return TieringOffloadingSpec({"cpu_bytes_to_use": CAPACITY * BLOCK, "block_bytes": BLOCK}).get_manager()


def test_rule_is_request_index_mod_n_and_one_tenant_changes_nothing():
    requests = list(load_mooncake_trace(TRACE, 7))
    assert assign_tenants(requests, 1) is requests
    assert [r.tenant for r in assign_tenants(requests, 3)] == ["t0", "t1", "t2", "t0", "t1", "t2", "t0"]
    assert [r.keys for r in assign_tenants(requests, 3)] == [r.keys for r in requests]
    with pytest.raises(ValueError, match="tenants must be at least 1, got 0"):
        assign_tenants(requests, 0)
    assert "request i of the trace belongs to tenant t<i mod 4>" in tenant_rule(4)


@pytest.mark.parametrize("tenants", [1, 3])
def test_replay_with_tenants_hits_exactly_what_per_tenant_names_give(tenants):
    with TRACE.open() as f:
        raw = [json.loads(line)["hash_ids"] for _, line in zip(range(REQUESTS), f)]
    named = [[(i % tenants, h) for h in ids] for i, ids in enumerate(raw)]
    requests = assign_tenants(list(load_mooncake_trace(TRACE, REQUESTS)), tenants)
    report = Replayer(_manager(), []).run(requests)
    assert report.total_hits == report.verified_blocks == _lru_hits(named, CAPACITY)
    if tenants > 1:  # identical prefixes of different tenants no longer hit each other
        assert report.total_hits < _lru_hits(raw, CAPACITY)


def test_a_block_served_to_another_tenant_fails_verification(monkeypatch):
    # A manager that kept the tenant out of the key (as before tenants) serves tenant a's block to tenant b:
    # the replay's per-tenant payloads catch it.
    monkeypatch.setattr("tiering.core.runtime.manager.scope_keys", lambda tenant, keys: list(keys))
    replayer = Replayer(_manager(), [])
    (req,) = list(load_mooncake_trace(TRACE, 1))
    a, b = assign_tenants([req, req], 2)
    replayer.replay_one(a)
    with pytest.raises(VerificationError, match="differs"):
        replayer.replay_one(b)


def test_bench_header_states_the_rule(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 64 * BLOCK, "block_bytes": BLOCK}))
    assert main(["bench", "--config", str(config), "--requests", "20", "--tenants", "4"]) == 0
    assert tenant_rule(4) in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--config", str(config), "--requests", "1", "--tenants", "0"])
    assert "argument --tenants: must be a positive integer, got 0" in capsys.readouterr().err

"""``tiering bench``'s text report: every pass, the command's wall time, policies, declined counts, causes."""

import json
import os
import subprocess
import sys

from tiering.cli.bench.passes import declined_counts, name_tenants, policies_line, tenant_rows
from tiering.cli.bench.report import format_header, format_report
from tiering.core.policies.tenancy import tenant_tag


def _primary_only(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": 64 * 1024, "block_bytes": 1024}))
    return str(path)


def _data(**extra):
    data = {
        "requests": 10,
        "block_lookups": 20,
        "tokens_looked_up": 10240,
        "hits_total": 5,
        "miss_ratio": 0.75,
        "token_hits": 2560,
        "token_hit_ratio": 0.25,
        "hits": {"primary": 2, "0:fs": 3},
        "misses": 15,
        "verified_blocks": 5,
        "short_loads": 0,
        "blocks_stored": 15,
        "store_rejected": 0,
        "bytes_stored": {"primary": 15 << 10},
        "bytes_loaded": {"primary": 2 << 10},
        "tier_stats": {},
        "stack": {"block_bytes": 1024},
        "throughput_bytes_per_s": 1 << 20,
        "request_bytes": 17 << 10,
        "scheduler_calls": 40,
        "scheduler_call_us": {"p50": 10, "p90": 20, "p99": 30, "max": 40},
        "wall_s": 1.5,
    }
    return {**data, **extra}


METRICS = {
    "tiering_store_admission_total": [
        {"labels": {"index": "0", "outcome": "admitted", "tier": "fs"}, "value": 7.0},
        {"labels": {"index": "0", "outcome": "declined", "tier": "fs"}, "value": 2968.0},
    ],
    "tiering_loads_declined_total": [
        {"labels": {"index": "0", "tier": "fs", "reason": "cost"}, "value": 40.0},
        {"labels": {"index": "0", "tier": "fs", "reason": "max_load_s"}, "value": 2.0},
    ],
}


def test_declined_counts_read_admission_and_load_cost_declines_per_tier():
    assert declined_counts(METRICS) == {
        "admission": {"0:fs": 2968},
        "load_cost": {"0:fs": 42},
        "load_cost_max_load_s": {"0:fs": 2},
    }
    assert declined_counts({}) == {"admission": {}, "load_cost": {}, "load_cost_max_load_s": {}}


def test_the_report_has_a_declined_line_and_evictions_by_cause_and_tenants_by_name():
    stats = {
        "capacity_bytes": 1 << 20,
        "used_bytes": 1 << 19,
        "resident_blocks": 20,
        "resident_bytes": 20 * 1024,
        "evictions": 30,
        "evicted_bytes": 30 * 1024,
        "quota_evictions": 12,
        "expirations": 4,
        "tenant:acme:resident_blocks": 20,
        "tenant:acme:resident_bytes": 20 * 1024,
        "tenant:acme:quota_bytes": 1 << 19,
        "tenant:acme:quota_evictions": 12,
        "tenant:acme:expirations": 4,
    }
    text = format_report(_data(tier_stats={"0:fs": stats}, metrics=METRICS))
    assert (
        "evictions 30 (30.0 KiB): 18 at the cap, 12 at a tenant's quota; 4 expired (TTL); failed stores: none" in text
    )
    assert "  0:fs acme        20 blocks (20.0 KiB), quota 512.0 KiB, evicted at its quota 12, expired (TTL) 4" in text
    assert (
        "declined           admission (not written): 0:fs 2,968 blocks; load cost model (found, left to recompute): "
        "0:fs 42 blocks (2 by max_load_s)"
    ) in text


def test_a_tier_without_tenants_keeps_its_one_eviction_count():
    stats = {"capacity_bytes": 1 << 20, "used_bytes": 0, "evictions": 3, "evicted_bytes": 3072}
    text = format_report(_data(tier_stats={"0:fs": stats}))
    assert "evictions 3 (3.0 KiB), failed stores: none" in text
    assert "tenants  " not in text
    assert "declined           admission (not written): none; load cost model (found, left to recompute): none" in text


def test_the_report_has_a_line_per_pass_and_the_commands_wall_time():
    passes = [
        {"name": "model off", "requests": 10, "hits_total": 4, "hit_ratio": 0.2, "hits": {"primary": 1, "0:fs": 3},
         "declined": declined_counts({}), "wall_s": 1.25},
        {"name": "model on", "requests": 10, "hits_total": 5, "hit_ratio": 0.25, "hits": {"primary": 2, "0:fs": 3},
         "declined": declined_counts(METRICS), "wall_s": 1.5},
    ]  # fmt: skip
    text = format_report(_data(passes=passes, command_wall_s=293.0))
    assert (
        "wall time          1.50 s (the requests' replay of the last pass, model on); the whole command 293.00 s "
        "(2 passes, each stack built and shut down)"
    ) in text
    assert (
        "passes             2 replays of the same requests, each on a fresh stack; the tables above are those of "
        "the last (model on)"
    ) in text
    assert (
        "  model off        10 requests, hits 4 blocks (20.0%; secondary tiers served 0:fs 3), declined by the load "
        "cost model 0, not written by admission 0, replay 1.25 s"
    ) in text
    assert (
        "  model on         10 requests, hits 5 blocks (25.0%; secondary tiers served 0:fs 3), declined by the " in text
    )
    assert "cost model 42, not written by admission 2,968, replay 1.50 s" in text
    single = format_report(_data(passes=[], command_wall_s=2.0))
    assert (
        "wall time          1.50 s (the requests' replay); the whole command 2.00 s (stack built and shut down)"
        in single
    )
    assert "passes " not in single


def test_policies_line_names_admission_the_cost_model_and_tenant_limits():
    tiers = [
        {"type": "fs", "root": "/x", "admission": "second_sighting",
         "tenants": {"default": {"quota_bytes": "4MiB", "ttl_s": 2},
                     "overrides": {"t1": {"quota_bytes": 2 << 20}, "t2": {"ttl_s": "1h"}}}},
        {"type": "s3", "bucket": "b"},
    ]  # fmt: skip
    assert policies_line(tiers, "load cost model: off (every hit is loaded)") == (
        "policies: admission: 0:fs second_sighting (sketch of 1.0 MiB), 1:s3 always; "
        "load cost model: off (every hit is loaded); tenant limits: 0:fs default quota 4.0 MiB, TTL 2 s; "
        "t1 quota 2.0 MiB; t2 TTL 3600 s"
    )
    assert policies_line([], "load cost model: off (every hit is loaded)").endswith("; tenant limits: none")


def test_a_tier_capped_for_the_whole_fleet_is_not_shown_without_a_cap():
    stack = {
        "block_bytes": 1024,
        "block_tokens": 512,
        "primary_blocks": 64,
        "eviction_policy": "lru",
        "default_stack": False,
        "tiers": [
            {"name": "0:redis", "capacity_bytes": 0, "fleet_capacity_bytes": 8 << 20, "location": "redis://h",
             "temporary": False},
        ],
    }  # fmt: skip
    header = format_header("t", 10, stack)
    assert "-> 0:redis (capped at 8.0 MiB for the whole fleet (one LRU on the server, shared by every process" in header
    assert "no cap" not in header
    stats = {"capacity_bytes": 0, "configured_capacity_bytes": 8 << 20, "used_bytes": 0, "fleet_evictions": 42}
    text = format_report(_data(tier_stats={"0:redis": stats}))
    assert "capacity 8.0 MiB for the whole fleet (one LRU on the server, shared by every process, which evicts)" in text
    assert "evictions 42 at the fleet's cap, failed stores" in text  # the tier's victims, not its own LRU's 0
    assert "unbounded" not in text


def test_name_tenants_names_the_tags_of_known_tenants_only():
    tag = tenant_tag("t0").hex()
    other = tenant_tag("zz").hex()
    stats = {f"tenant:tag:{tag}:resident_blocks": 3, f"tenant:tag:{other}:resident_blocks": 1, "evictions": 0}
    assert name_tenants(stats, {"t0", ""}) == {
        "tenant:t0:resident_blocks": 3,
        f"tenant:tag:{other}:resident_blocks": 1,
        "evictions": 0,
    }
    assert tenant_rows({"0:fs": {"evictions": 0}}) == []


def test_two_passes_into_one_file_print_the_header_once_and_a_line_per_pass(tmp_path):
    log = tmp_path / "log"
    argv = [sys.executable, "-m", "tiering.cli.main", "bench", "--config", _primary_only(tmp_path), "--requests", "4"]
    argv += ["--recompute-tokens-per-s", "20000", "--json", str(tmp_path / "r.json")]
    with open(log, "w") as f:
        done = subprocess.run(argv, stdout=f, stderr=f, timeout=120, env=os.environ.copy(), check=False)
    text = log.read_text()
    assert done.returncode == 0, text
    assert text.count("measured: the storage path only") == 1
    assert "pass 1 of 2, model off: policies: admission: no secondary tier; load cost model: off" in text
    assert "tiering bench: pass 2 of 2, model on: policies: " in text
    assert "passes             2 replays of the same requests" in text
    assert "\n  model off        4 requests, hits " in text and "\n  model on         4 requests, hits " in text
    assert "; the whole command " in text
    data = json.loads((tmp_path / "r.json").read_text())
    assert [p["name"] for p in data["passes"]] == ["model off", "model on"]
    assert data["command_wall_s"] >= data["passes"][0]["wall_s"] + data["passes"][1]["wall_s"]

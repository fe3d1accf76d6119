"""Lookups against real servers: a scheduler step's 4,096 unknown keys resolve by the next round; ACLs; cluster."""

import itertools
import threading
import time

from tiering.core import create_secondary_tier
from tiering.core.base import JobMetadata, ReqContext, block_view
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.testing import block_payload, make_key, wait_for_jobs, wait_for_lookup

CTX = ReqContext("lookups")
BLOCK = 16 * 1024
_ids = itertools.count(1)
STEP_S = 0.025
"""The pause between two scheduler rounds: a decode step of a busy engine is 10-30 ms; generous for a loaded CI box."""


def make_tier(config):
    view = allocate_host_buffer(32, BLOCK)
    spec = OffloadingSpec({"cpu_bytes_to_use": 32 * BLOCK, "block_bytes": BLOCK, "model": "redis/lookups"})
    return create_secondary_tier({"type": "redis", **config}, view, spec), view


def store(tier, view, keys):
    for i, key in enumerate(keys):
        block_view(view, i)[:] = block_payload(key, BLOCK)
    job = JobMetadata(next(_ids), keys, list(range(len(keys))), False, CTX)
    tier.submit_store(job)
    return wait_for_jobs(tier, [job.job_id], 30.0)[job.job_id]


def rounds_to_resolve(tier, keys, step_s=STEP_S, deadline_s=60.0):
    """Ask every key once per scheduler round until none answers None (or ``deadline_s``); (rounds, answers).

    How many rounds it takes depends on the machine's speed (the package README's benchmark measures it);
    the tests assert what does not: every key is answered, and rightly, within the deadline.

    Rounds are ``step_s`` apart, or as far apart as the first round took when
    that is longer: on a loaded machine the scheduler's own 4,096 calls slow
    down as much as the resolution, and an engine step (scheduling plus a
    forward pass) is never shorter than its scheduling.
    """
    answers = {}
    pending = list(keys)
    rounds = 0
    pause = step_s
    deadline = time.monotonic() + deadline_s
    while pending and time.monotonic() < deadline:
        rounds += 1
        started = time.monotonic()
        for key in pending:
            answers[key] = tier.lookup(key, CTX)
        if rounds == 1:
            pause = max(step_s, time.monotonic() - started)
        pending = [k for k in pending if answers[k] is None]
        if pending:
            time.sleep(pause)
    return rounds, answers


def test_4096_unknown_keys_resolve_each_asked_of_the_server_once(redis_server, prefix):
    """4,096 keys (16 stored) asked every scheduler round until each is answered: all rightly, each probed once.

    How many rounds that takes depends on the machine's speed (2 on a quiet machine: the benchmark in the
    package README measures it); a test asserts only what no load changes.
    """
    writer, view = make_tier({"url": redis_server.url, "prefix": prefix})
    try:
        stored = [make_key(i, b"many") for i in range(16)]
        assert store(writer, view, stored)
        reader, _ = make_tier({"url": redis_server.url, "prefix": prefix, "startup_scan": False})
        keys = stored + [make_key(i, b"many-absent") for i in range(4096 - 16)]
        n, answers = rounds_to_resolve(reader, keys)
        assert [answers[k] for k in keys] == [True] * 16 + [False] * (4096 - 16), f"{n} rounds"
        stats = reader.stats()
        assert stats["lookup_probes"] == 4096  # each key asked once
        assert stats["lookup_batches"] <= 64  # batches of <= 1,024 keys (smaller when a round stalls)
        reader.shutdown()
    finally:
        writer.shutdown()


def test_a_rounds_4096_lookups_take_one_existence_check_and_the_next_round_answers_every_key(redis_server, prefix):
    """Counted in rounds and round trips, not time: the keys one scheduler round asks go in one ``STRLEN`` request.

    The tier's I/O threads are held busy while round 1 asks, so its resolution starts only once the round is
    over (as when the scheduler asks faster than a thread frees up); round 2, asked once that resolution is
    done, answers every key. Batches of 1,024 keys took four round trips one after the other for such a round,
    and left keys unanswered at the next scheduler step.
    """
    writer, view = make_tier({"url": redis_server.url, "prefix": prefix})
    reader, _ = make_tier({"url": redis_server.url, "prefix": prefix, "startup_scan": False})
    gate = threading.Event()
    try:
        stored = [make_key(i, b"one-check") for i in range(16)]
        assert store(writer, view, stored)
        keys = stored + [make_key(i, b"one-check-absent") for i in range(4096 - 16)]
        for _ in range(reader.pool.n_read_threads + reader.pool.n_write_threads):
            reader.pool.submit_call("read", lambda: gate.wait(60))
        before = reader.stats()
        assert [reader.lookup(k, CTX) for k in keys] == [None] * 4096  # round 1: every key goes to the server
        gate.set()
        deadline = time.monotonic() + 60
        while reader.stats()["lookup_probes_pending"] and time.monotonic() < deadline:
            time.sleep(0.005)
        stats = reader.stats()
        assert stats["lookup_probes_pending"] == 0
        assert stats["lookup_batches"] - before["lookup_batches"] == 1
        assert stats["pipelines"] - before["pipelines"] == 1  # one STRLEN request for the 4,096 keys
        assert [reader.lookup(k, CTX) for k in keys] == [True] * 16 + [False] * (4096 - 16)  # round 2: all answered
        assert reader.stats()["lookup_probes"] == 4096  # each key asked of the server once
    finally:
        gate.set()
        reader.shutdown()
        writer.shutdown()


def test_cluster_lookups_group_keys_per_node_and_resolve_every_key(redis_cluster, prefix):
    config = {"mode": "cluster", "url": redis_cluster.url, "prefix": prefix}
    writer, view = make_tier(config)
    try:
        stored = [make_key(i, b"cluster-many") for i in range(24)]
        for start in range(0, 24, 8):
            assert store(writer, view, stored[start : start + 8])
        reader, _ = make_tier({**config, "startup_scan": False})
        keys = stored + [make_key(i, b"cluster-absent") for i in range(4096 - 24)]
        n, answers = rounds_to_resolve(reader, keys, step_s=0.05)
        assert [answers[k] for k in keys] == [True] * 24 + [False] * (4096 - 24), f"{n} rounds"
        assert reader.stats()["lookup_probes"] == 4096
        reader.shutdown()
    finally:
        writer.shutdown()


def test_acl_user_without_scripting_gets_lookups_and_the_fleet_cap_and_key_patterns_hold(redis_server, prefix, caplog):
    client = redis_server.client()
    client.acl_setuser(
        "noscript", enabled=True, passwords=["+noscript-pw-1"], keys=[f"{prefix}:*"],
        commands=["+@all", "-@scripting"],
    )  # fmt: skip
    client.close()
    config = {
        "url": redis_server.url, "prefix": prefix, "username": "noscript", "password": "noscript-pw-1",
        "eviction": "tier", "capacity_bytes": 4 * (BLOCK + 128),  # the fleet cap needs no scripting either
    }  # fmt: skip
    tier, view = make_tier(config)
    try:
        key = make_key(1, b"acl")
        assert store(tier, view, [key])
        tier.pool.wait_idle(10)
        assert tier.stats()["fleet_used_bytes"] == BLOCK + 128
        assert sum(v for k, v in tier.stats().items() if k.startswith("errors_")) == 0
        other, _ = make_tier(config)
        assert wait_for_lookup(other, key, CTX) is True
        assert wait_for_lookup(other, make_key(2, b"acl"), CTX) is False
        assert other.stats()["lookup_errors"] == 0
        assert "noscript-pw-1" not in caplog.text
        other.shutdown()
    finally:
        tier.shutdown()


def test_lookups_read_through_redis_py_when_hiredis_is_missing(redis_server, prefix, monkeypatch):
    from tiering.redis import wire

    monkeypatch.setattr(wire, "hiredis", None)
    writer, view = make_tier({"url": redis_server.url, "prefix": prefix})
    try:
        stored = [make_key(i, b"no-hiredis") for i in range(8)]
        assert store(writer, view, stored)
        reader, _ = make_tier({"url": redis_server.url, "prefix": prefix, "startup_scan": False})
        keys = stored + [make_key(i, b"no-hiredis-absent") for i in range(1000)]
        _, answers = rounds_to_resolve(reader, keys)
        assert [answers[k] for k in keys] == [True] * 8 + [False] * 1000
        reader.shutdown()
    finally:
        writer.shutdown()

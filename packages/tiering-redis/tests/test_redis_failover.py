"""A Sentinel failover under load: bounded jobs, then the new primary serves without an engine restart."""

import itertools
import threading
import time

import pytest

from tiering.core import create_secondary_tier
from tiering.core.base import JobMetadata, ReqContext, block_view
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.redis.testing import LocalSentinel, have_redis_server
from tiering.testing import block_payload, make_key, wait_for_jobs, wait_for_lookup

pytestmark = pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed")

BLOCK = 32 * 1024
SLOTS = 32
CTX = ReqContext("failover")
_ids = itertools.count(1)
JOB_BOUND_S = 15.0
"""Longest a job may take while the primary changes: timeouts x (retries + 1) + backoff, with margin."""


def sentinel_tier(sentinel, service_name, prefix, retries, model):
    """A redis tier through ``sentinel`` (2 s socket timeout, 1 s connect timeout) and its primary view."""
    config = {
        "type": "redis", "mode": "sentinel", "sentinels": sentinel.sentinels, "service_name": service_name,
        "prefix": prefix, "socket_timeout_s": 2, "socket_connect_timeout_s": 1, "retries": retries,
    }  # fmt: skip
    view = allocate_host_buffer(SLOTS, BLOCK)
    spec = OffloadingSpec({"cpu_bytes_to_use": SLOTS * BLOCK, "block_bytes": BLOCK, "model": model})
    return create_secondary_tier(config, view, spec), view


def store(tier, view, keys, timeout_s=60.0):
    for i, key in enumerate(keys):
        block_view(view, i)[:] = block_payload(key, BLOCK)
    job = JobMetadata(next(_ids), keys, list(range(len(keys))), False, CTX)
    tier.submit_store(job)
    return wait_for_jobs(tier, [job.job_id], timeout_s)[job.job_id]


def load(tier, view, keys, timeout_s=60.0):
    block_ids = list(range(SLOTS - len(keys), SLOTS))
    for i in block_ids:
        block_view(view, i)[:] = bytes(BLOCK)
    job = JobMetadata(next(_ids), keys, block_ids, True, CTX)
    tier.submit_load(job)
    ok = wait_for_jobs(tier, [job.job_id], timeout_s)[job.job_id]
    return ok, [block_view(view, i).tobytes() for i in block_ids]


def wait_for_primary_change(tier, view, keys, timeout_s=30.0):
    """Load ``keys`` until the tier has seen the new primary (it checks before a pipeline, at most once a second)."""
    deadline = time.monotonic() + timeout_s
    while tier.stats().get("failovers", 0) + tier.stats()["server_restarts"] == 0:
        assert time.monotonic() < deadline, "the tier did not see the new primary"
        load(tier, view, keys)
        time.sleep(0.1)


def test_a_new_primary_continues_the_old_data_set_only_when_promoted_from_its_replica():
    from tiering.redis.probe import Primaries

    def primaries(*nodes):  # (run_id, master_replid, master_replid2) per primary, as INFO gives them
        return Primaries.from_info([{"run_id": r, "master_replid": a, "master_replid2": b} for r, a, b in nodes])

    old = primaries(("run-a", "repl-a", "0"))
    assert primaries(("run-b", "repl-b", "repl-a")).continues(old)  # a replica of a, promoted
    assert not primaries(("run-c", "repl-c", "0")).continues(old)  # restarted empty: a new history
    assert not primaries(("run-d", "repl-d", "repl-x")).continues(old)  # promoted from another server's replica
    assert not primaries(("run-b", "repl-b", "repl-a")).continues(Primaries())  # nothing known before
    cluster = primaries(("r1", "p1", "0"), ("r2", "p2", "0"), ("r3", "p3", "0"))
    assert primaries(("r1", "p1", "0"), ("r2", "p2", "0"), ("r4", "p4", "p3")).continues(cluster)
    assert not primaries(("r1", "p1", "0"), ("r2", "p2", "0"), ("r5", "p5", "0")).continues(cluster)


def test_sentinel_failover_fails_or_serves_jobs_in_bounded_time_then_the_new_primary_serves(prefix):
    with LocalSentinel(service_name="fo", replicas=1) as sentinel:
        old_primary = sentinel.primary
        tier, view = sentinel_tier(sentinel, "fo", prefix, retries=3, model="redis/failover")
        try:
            before = [make_key(i, b"before") for i in range(16)]
            assert store(tier, view, before[:8]) and store(tier, view, before[8:])
            with old_primary.client() as client:
                assert client.wait(1, 5000) == 1  # the replica has every block before the failover

            durations, wrong, outcomes = [], [], []
            stop = threading.Event()

            def traffic():
                for n in itertools.count():
                    if stop.is_set():
                        return
                    keys = [make_key(n * 4 + j, b"during") for j in range(4)]
                    started = time.monotonic()
                    outcomes.append(("store", store(tier, view, keys)))
                    durations.append(time.monotonic() - started)
                    started = time.monotonic()
                    ok, slots = load(tier, view, before[:4])
                    durations.append(time.monotonic() - started)
                    outcomes.append(("load", ok))
                    if ok and slots != [block_payload(k, BLOCK) for k in before[:4]]:
                        wrong.append(n)

            thread = threading.Thread(target=traffic)
            thread.start()
            try:
                time.sleep(0.3)
                new_primary = sentinel.failover()
                time.sleep(1.0)
            finally:
                stop.set()
                thread.join(120)
            assert not thread.is_alive(), "a job hung through the failover"
            assert new_primary.port != old_primary.port
            assert not wrong, "a load returned other bytes"
            assert outcomes and max(durations) < JOB_BOUND_S, max(durations)

            # No engine restart: the same tier stores and loads through the new primary.
            after = [make_key(i, b"after") for i in range(8)]
            deadline = time.monotonic() + 30
            while not store(tier, view, after):
                assert time.monotonic() < deadline, "no store succeeded after the failover"
                time.sleep(0.2)
            ok, slots = load(tier, view, after)
            assert ok and slots == [block_payload(k, BLOCK) for k in after], {
                k: v for k, v in tier.stats().items() if v and ("fail" in k or "error" in k)
            }
            with new_primary.client() as client:
                assert client.exists(*(tier.blocks.block_key(k) for k in after)) == len(
                    after
                )  # written to the new primary
                assert client.info("replication")["role"] == "master"
            ok, slots = load(tier, view, before[8:])  # replicated before the failover: still there, same bytes
            assert ok and slots == [block_payload(k, BLOCK) for k in before[8:]]
            wait_for_primary_change(tier, view, after)
            stats = tier.stats()
            assert stats["verify_failures"] == 0
            assert stats["failovers"] == 1 and stats["server_restarts"] == 0  # the new primary held the blocks
        finally:
            tier.shutdown()


def test_c23_killed_primary_the_promoted_replica_keeps_the_blocks_as_hits_and_the_failover_is_counted(prefix):
    """SIGKILL of the primary under store/load traffic: the promoted replica's blocks stay known, stores resume."""
    # down-after 2 s: a quick promotion, yet long enough that a loaded 2-core machine does not fail over by itself
    with LocalSentinel(service_name="c23", replicas=1, down_after_ms=2000) as sentinel:
        old_primary = sentinel.primary
        tier, view = sentinel_tier(sentinel, "c23", prefix, retries=2, model="redis/c23")
        try:
            assert tier.wait_for_scan(30)
            before = [make_key(i, b"c23-before") for i in range(96)]
            for start in range(0, len(before), 16):
                assert store(tier, view, before[start : start + 16])
            with old_primary.client() as client:
                assert client.wait(1, 10_000) == 1  # the replica holds every block before the kill
            # Writes that never reached the replica: 8 blocks taken off it (a replica that lags looks the same).
            kept, lost = before[:-8], before[-8:]
            with sentinel.replicas[0].client() as client:
                client.config_set("replica-read-only", "no")
                assert client.delete(*(tier.blocks.block_key(k) for k in lost)) == len(lost)
            traffic_keys = before[:4]  # loaded during the failover; the others are not touched by the traffic

            durations, wrong, outcomes = [], [], []
            stop = threading.Event()

            def traffic():
                for n in itertools.count():
                    if stop.is_set():
                        return
                    started = time.monotonic()
                    keys = [make_key(n * 4 + j, b"c23-during") for j in range(4)]
                    outcomes.append(("store", store(tier, view, keys)))
                    ok, slots = load(tier, view, traffic_keys)
                    durations.append(time.monotonic() - started)
                    outcomes.append(("load", ok))
                    if ok and slots != [block_payload(k, BLOCK) for k in traffic_keys]:
                        wrong.append(n)

            thread = threading.Thread(target=traffic)
            thread.start()
            try:
                time.sleep(0.3)
                new_primary = sentinel.kill_primary(timeout_s=90)
                promoted = len(outcomes)  # jobs finished from here on ran after the old primary died
                deadline = time.monotonic() + 60  # stores resume: a store job through the new primary succeeds
                while ("store", True) not in outcomes[promoted:]:
                    assert time.monotonic() < deadline, "no store succeeded after the promotion"
                    time.sleep(0.1)
            finally:
                stop.set()
                thread.join(120)
            assert not thread.is_alive(), "a job hung through the failover"
            assert new_primary.port != old_primary.port
            assert not wrong, "a load returned other bytes"
            assert max(durations) < 2 * JOB_BOUND_S, max(durations)

            wait_for_primary_change(tier, view, traffic_keys)
            # Kept: every block the replica held answers True at once, without asking the server.
            pending = tier.stats()["lookups_pending"]
            assert [tier.lookup(k, CTX) for k in kept] == [True] * len(kept)
            stats = tier.stats()
            assert stats["lookups_pending"] == pending
            assert stats["failovers"] == 1 and stats["server_restarts"] == 0, stats
            # The re-scan of the new primary forgets what it lacks (a lookup asks the server: absent).
            assert tier.wait_for_scan(60)
            assert all(k in tier.index for k in kept) and not any(k in tier.index for k in lost)
            assert [wait_for_lookup(tier, k, CTX) for k in lost] == [False] * len(lost)
            for start in range(0, len(kept), 16):  # the kept ones load, verified, with their exact bytes
                keys = kept[start : start + 16]
                ok, slots = load(tier, view, keys)
                assert ok and slots == [block_payload(k, BLOCK) for k in keys]

            after = [make_key(i, b"c23-after") for i in range(8)]
            assert store(tier, view, after)
            with new_primary.client() as client:
                assert client.exists(*(tier.blocks.block_key(k) for k in after)) == len(after)
            stats = tier.stats()
            assert stats["verify_failures"] == 0 and stats["failovers"] == 1 and stats["server_restarts"] == 0
        finally:
            tier.shutdown()

"""Redis-specific behaviour against real servers: sharing, NX, server eviction, restarts, corruption, resharding."""

import itertools
import json
import logging
import shutil
import subprocess
import sys
import threading
import time

import pytest

from tiering.core import create_secondary_tier
from tiering.core.base import JobMetadata, ReqContext, block_view
from tiering.core.format import HEADER_SIZE
from tiering.core.primary import allocate_host_buffer
from tiering.core.schema import InvalidValueError, UnknownKeyError
from tiering.core.spec import OffloadingSpec
from tiering.redis import RedisStartupError
from tiering.redis.testing import LocalRedis
from tiering.testing import block_payload, make_key, wait_for_jobs, wait_for_lookup

BLOCK = 64 * 1024
SLOTS = 32
CTX = ReqContext("r")
_ids = itertools.count(1)


def spec(block_bytes=BLOCK, slots=SLOTS):
    return OffloadingSpec({"cpu_bytes_to_use": slots * block_bytes, "block_bytes": block_bytes, "model": "redis/test"})


def make_tier(config, view=None, block_bytes=BLOCK):
    view = view if view is not None else allocate_host_buffer(SLOTS, block_bytes)
    return create_secondary_tier({"type": "redis", **config}, view, spec(block_bytes)), view


def store(tier, view, keys, payload=block_payload, timeout_s=30.0):
    block_ids = list(range(len(keys)))
    for key, i in zip(keys, block_ids):
        block_view(view, i)[:] = payload(key, BLOCK)
    job = JobMetadata(next(_ids), keys, block_ids, False, CTX)
    tier.submit_store(job)
    return wait_for_jobs(tier, [job.job_id], timeout_s)[job.job_id]


def load(tier, view, keys, timeout_s=30.0):
    """Load ``keys`` into the upper slots; returns (success, [slot bytes])."""
    block_ids = list(range(SLOTS - len(keys), SLOTS))
    for i in block_ids:
        block_view(view, i)[:] = bytes(BLOCK)
    job = JobMetadata(next(_ids), keys, block_ids, True, CTX)
    tier.submit_load(job)
    ok = wait_for_jobs(tier, [job.job_id], timeout_s)[job.job_id]
    return ok, [block_view(view, i).tobytes() for i in block_ids]


# -- configuration -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        ({"nope": 1}, UnknownKeyError, "nope"),
        ({"url": "http://x:1"}, InvalidValueError, "url"),
        ({"mode": "sentinel", "sentinels": [["h", 1]]}, InvalidValueError, "service_name"),
        ({"mode": "sentinel", "service_name": "m"}, InvalidValueError, "sentinels"),
        ({"sentinels": [["h", 1]]}, InvalidValueError, "sentinels"),
        ({"capacity_bytes": 10**9}, InvalidValueError, "capacity_bytes"),
        ({"eviction": "tier"}, InvalidValueError, "capacity_bytes"),
        ({"prefix": "a{b}"}, InvalidValueError, "hash tag"),
        ({"url": "redis://:pw@h:1/0", "password": "pw2"}, InvalidValueError, "password"),
        ({"url": "redis://h:1/0", "port": 2}, InvalidValueError, "port"),
        ({"mode": "cluster", "db": 3}, InvalidValueError, "db"),
        ({"socket_timeout_s": 0}, InvalidValueError, "socket_timeout_s"),
    ],
)
def test_bad_config_names_the_key(config, error, match):
    with pytest.raises(error, match=match):
        make_tier(config)


@pytest.mark.parametrize("eviction", ["process", "tier"])
def test_capacity_below_one_block_is_a_config_error_naming_the_key(eviction):
    # Checked before any connection: no server needed (the port is one nothing listens on).
    with pytest.raises(InvalidValueError) as info:
        make_tier({"url": "redis://127.0.0.1:1/0", "eviction": eviction, "capacity_bytes": BLOCK})
    assert info.value.key == "capacity_bytes"
    assert f"capacity_bytes {BLOCK} " in str(info.value) and f"({BLOCK + HEADER_SIZE} bytes" in str(info.value)


def test_secret_value_never_in_config_error():
    with pytest.raises(Exception) as info:
        make_tier({"password": 12345678})
    assert "12345678" not in str(info.value)


def test_unreachable_server_is_a_startup_error_without_password(caplog):
    port = LocalRedis().port  # free, nothing listens
    with pytest.raises(RedisStartupError) as info:
        make_tier({"url": f"redis://user:hunter22@127.0.0.1:{port}/0", "retries": 0})
    assert info.value.cause == "connection"
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "hunter22" not in str(info.value) and "hunter22" not in caplog.text


def test_wrong_password_is_a_credentials_error_and_password_is_never_shown(caplog, capsys):
    with LocalRedis(password="right-pass-123") as server:
        with pytest.raises(RedisStartupError) as info:
            make_tier({"url": f"redis://:wrong-pass-456@127.0.0.1:{server.port}/0"})
        assert info.value.cause == "credentials"
        assert "wrong-pass-456" not in str(info.value)
        caplog.set_level(logging.DEBUG)
        tier, view = make_tier({"url": server.url, "password": "right-pass-123"})
        try:
            assert store(tier, view, [make_key(1, b"pw")])
            texts = [repr(tier), str(tier.stats()), caplog.text, tier.blocks.location, str(tier.settings)]
        finally:
            tier.shutdown()
        texts.append(caplog.text + capsys.readouterr().out)
        assert all("right-pass-123" not in text for text in texts)


def test_warns_when_neither_server_nor_tier_bounds_the_blocks(redis_server, prefix, caplog):
    tier, _ = make_tier({"url": redis_server.url, "prefix": prefix})
    tier.shutdown()
    assert "has no maxmemory and the tier no capacity_bytes" in caplog.text


def test_a_job_goes_out_in_pipelines_of_pipeline_blocks(redis_server, prefix):
    config = {"url": redis_server.url, "prefix": prefix, "max_connections": 2, "pipeline_blocks": 8}
    tier, view = make_tier({**config, "startup_scan": False})
    try:
        assert store(tier, view, [make_key(i, b"pipes") for i in range(32)])
        assert tier.stats()["pipelines"] <= 8  # shares of up to 8 blocks, not one round trip per block
    finally:
        tier.shutdown()


# -- the key layout and values ----------------------------------------------------------
def test_keys_values_and_ttl(redis_server, prefix):
    tier, view = make_tier({"url": redis_server.url, "prefix": prefix, "ttl_s": 600})
    key = make_key(7, b"layout")
    try:
        assert store(tier, view, [key])
        client = redis_server.client()
        name = f"{prefix}:{tier.blocks.digest}:{key.hex()}"
        assert client.strlen(name) == 128 + BLOCK
        assert 0 < client.ttl(name) <= 600
        assert client.get(name)[128:] == block_payload(key, BLOCK)
        assert b'"model": "redis/test"' in client.get(f"{prefix}:{tier.blocks.digest}:namespace")
        client.close()
    finally:
        tier.shutdown()


def test_ttl_takes_a_duration_with_a_unit(redis_server, prefix):
    tier, view = make_tier({"url": redis_server.url, "prefix": prefix, "ttl_s": "10m"})  # as a tenant's ttl_s
    key = make_key(8, b"layout")
    try:
        assert store(tier, view, [key])
        client = redis_server.client()
        assert 60 < client.ttl(f"{prefix}:{tier.blocks.digest}:{key.hex()}") <= 600
        client.close()
    finally:
        tier.shutdown()


# -- two processes, one server -----------------------------------------------------------
CHILD = """
import json, sys
from tiering.core import create_secondary_tier
from tiering.core.base import JobMetadata, ReqContext, block_view
from tiering.core.format import HEADER_SIZE
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.testing import make_key, wait_for_jobs
config, salt, n, fill, block = json.loads(sys.argv[1])
spec = OffloadingSpec({"cpu_bytes_to_use": 32 * block, "block_bytes": block, "model": "redis/test"})
view = allocate_host_buffer(32, block)
tier = create_secondary_tier(config, view, spec)
ok = True
for start in range(0, n, 8):
    keys = [make_key(i, salt.encode()) for i in range(start, start + 8)]
    for i in range(8):
        block_view(view, i)[:] = fill.encode() * block
    tier.submit_store(JobMetadata(start + 1, keys, list(range(8)), False, ReqContext("child")))
    ok = wait_for_jobs(tier, [start + 1])[start + 1] and ok
tier.pool.wait_idle(10)
print(json.dumps({"ok": ok, "stats": tier.stats()}))
tier.shutdown()
"""


def run_children(configs):
    """Start one process per ``(config, salt, n, fill)``, in parallel; returns their JSON reports."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps([{"type": "redis", **c}, salt, n, fill, BLOCK])],
            stdout=subprocess.PIPE,
            text=True,
        )
        for c, salt, n, fill in configs
    ]
    return [json.loads(p.communicate(timeout=120)[0]) for p in procs]


def test_two_processes_share_blocks_and_nx_keeps_the_first_writer(redis_server, prefix):
    [child] = run_children([({"url": redis_server.url, "prefix": prefix}, "shared", 8, "A")])
    assert child["ok"] and child["stats"]["blocks_stored"] == 8
    tier, view = make_tier({"url": redis_server.url, "prefix": prefix})
    try:
        keys = [make_key(i, b"shared") for i in range(8)]
        assert store(tier, view, keys, payload=lambda key, size: b"B" * size)  # SET NX refused: counts as stored
        stats = tier.stats()
        assert stats["blocks_stored"] == 0 and stats["stores_already_present"] == 8
        assert all(wait_for_lookup(tier, k, CTX) for k in keys)  # the other process's blocks
        ok, slots = load(tier, view, keys)
        assert ok and all(s == b"A" * BLOCK for s in slots)  # the first writer's bytes
    finally:
        tier.shutdown()


def test_two_processes_racing_on_the_same_keys_store_each_block_once(redis_server, prefix):
    config = {"url": redis_server.url, "prefix": prefix}
    reports = run_children([(config, "race", 64, "A"), (config, "race", 64, "B")])
    assert all(r["ok"] for r in reports)
    assert sum(r["stats"]["blocks_stored"] for r in reports) == 64  # NX: every block written once
    tier, view = make_tier(config)
    try:
        keys = [make_key(i, b"race") for i in range(64)]
        for start in range(0, 64, 8):
            ok, slots = load(tier, view, keys[start : start + 8])
            assert ok and all(s in (b"A" * BLOCK, b"B" * BLOCK) for s in slots)
    finally:
        tier.shutdown()


def test_tier_cap_is_per_process_and_holds_for_two_processes(redis_server, prefix):
    cap = 8 * (BLOCK + 128)
    config = {"url": redis_server.url, "prefix": prefix, "eviction": "process", "capacity_bytes": cap}
    reports = run_children([(config, "p1", 24, "A"), (config, "p2", 24, "B")])
    assert all(r["stats"]["resident_bytes"] <= cap and r["stats"]["evictions"] >= 16 for r in reports)
    client = redis_server.client()
    stored = sum(client.strlen(k) for k in client.scan_iter(match=f"{prefix}:*") if not k.endswith(b":namespace"))
    client.close()
    assert 0 < stored <= 2 * cap  # each process's cap holds; the fleet's total is the sum of the caps


def test_c21_process_cap_holds_on_the_server_when_unlink_starts_failing(redis_server, prefix):
    """Case C21: ``eviction: "process"`` deletes its own victims; UNLINK works at first, then is denied (ACL)."""
    admin = redis_server.client()
    user = f"c21-{prefix}"
    admin.acl_setuser(user, enabled=True, passwords=["+c21-pw-1"], keys=[f"{prefix}:*"], commands=["+@all"])
    cap = 4 * (BLOCK + 128)
    config = {"url": redis_server.url, "prefix": prefix, "username": user, "password": "c21-pw-1",
              "eviction": "process", "capacity_bytes": cap}  # fmt: skip
    peak, watching = [0], threading.Event()

    # Bytes of block values at one instant: a script runs atomically on the server (a SCAN followed by STRLENs
    # could count a victim deleted mid-scan and the block written in its room both).
    sum_blocks = admin.register_script(
        "local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do "
        "if not string.find(k, ':namespace$') then n = n + redis.call('STRLEN', k) end end return n"
    )

    def held():
        return int(sum_blocks(args=[f"{prefix}:*"]))

    def watch():
        while not watching.is_set():
            peak[0] = max(peak[0], held())

    tier, view = make_tier(config)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        keys = [make_key(i, b"c21") for i in range(10)]
        assert store(tier, view, keys[:4]) and store(tier, view, keys[4:6])  # evicts keys[:2]: UNLINK works
        admin.acl_setuser(user, commands=["-unlink"])  # from now on every delete fails
        assert not store(tier, view, keys[6:10])  # no room comes: refused as no space
        tier.pool.wait_idle(10)
        stats, final = tier.stats(), held()
    finally:
        watching.set()
        watcher.join()
        tier.shutdown()
        admin.acl_deluser(user)
        admin.close()
    assert peak[0] <= cap  # at no instant more than the cap on the server
    assert stats["store_failed_no_space"] == 4 and stats["failed_deletes"] == 4
    assert stats["used_bytes"] == cap == final  # the stats are the server


# -- the server evicts ------------------------------------------------------------------
def test_server_lru_evictions_are_misses_never_errors_or_wrong_bytes(prefix):
    with LocalRedis(args=["--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru"]) as server:
        tier, view = make_tier({"url": server.url, "prefix": prefix})
        try:
            keys = [make_key(i, b"lru") for i in range(160)]  # ~10 MiB into a 3 MiB server
            for start in range(0, len(keys), 16):
                assert store(tier, view, keys[start : start + 16])
            hits = misses = 0
            for key in keys:
                ok, slots = load(tier, view, [key])
                if ok:
                    hits += 1
                    assert slots[0] == block_payload(key, BLOCK)
                else:
                    misses += 1
            stats = tier.stats()
            assert hits > 0 and misses > 0
            assert stats["load_failed_missing"] == misses
            assert sum(v for k, v in stats.items() if k.startswith("errors_")) == 0
            assert stats["server_evicts"] == 1
            assert not any(wait_for_lookup(tier, k, CTX) for k in keys[:1] if k not in tier.index)
        finally:
            tier.shutdown()


# -- failures ----------------------------------------------------------------------------
def test_c23_a_quick_restart_that_raises_no_error_is_seen_and_the_blocks_forgotten(prefix):
    """Killed and restarted empty between two jobs: redis-py reconnects silently; the run_id check still sees it."""
    with LocalRedis() as server:
        tier, view = make_tier({"url": server.url, "prefix": prefix})
        try:
            keys = [make_key(i, b"quick") for i in range(8)]
            assert store(tier, view, keys) and all(k in tier.index for k in keys)
            server.kill()
            server.start()  # same port, empty: the pooled connections are re-made without an error
            deadline = time.monotonic() + 20  # the check runs at most once a second, before a pipeline
            for n in itertools.count():
                assert store(tier, view, [make_key(n, b"quick-after")])
                if tier.stats()["server_restarts"]:
                    break
                assert time.monotonic() < deadline, "the restart was not seen"
                time.sleep(0.2)
            stats = tier.stats()
            assert stats["server_restarts"] == 1 and stats["failovers"] == 0 and stats["errors_connection"] == 0
            assert not any(k in tier.index for k in keys)
            assert [wait_for_lookup(tier, k, CTX) for k in keys] == [False] * len(keys)
        finally:
            tier.shutdown()


def test_server_killed_mid_run_gives_failed_jobs_then_recovers(prefix):
    server = LocalRedis().start()
    try:
        config = {"url": server.url, "prefix": prefix, "socket_timeout_s": 1, "socket_connect_timeout_s": 0.5}
        tier, view = make_tier({**config, "retries": 1})
        keys = [make_key(i, b"restart") for i in range(8)]
        assert store(tier, view, keys)
        server.kill()
        started = time.monotonic()
        assert store(tier, view, [make_key(i, b"while-down") for i in range(8)], timeout_s=20) is False
        assert load(tier, view, keys, timeout_s=20)[0] is False
        assert wait_for_lookup(tier, make_key(1, b"unknown"), CTX, timeout_s=20) is False
        assert time.monotonic() - started < 15  # bounded by timeouts and retries, no hang
        stats = tier.stats()
        assert stats["errors_connection"] > 0 and stats["store_jobs_failed"] == 1
        server.start()  # same port, empty (no persistence)
        fresh = [make_key(i, b"after-restart") for i in range(8)]
        deadline = time.monotonic() + 20
        while not store(tier, view, fresh):
            assert time.monotonic() < deadline, "no recovery after the restart"
            time.sleep(0.2)
        ok, slots = load(tier, view, fresh)
        assert ok and slots == [block_payload(k, BLOCK) for k in fresh]
        assert load(tier, view, keys)[0] is False  # lost with the server's memory: a miss, then forgotten
        stats = tier.stats()
        assert stats["server_restarts"] == 1 and stats["failovers"] == 0 and stats["load_failed_missing"] >= 1
        with server.client() as client:  # the empty server describes the namespace again
            assert client.exists(tier.blocks.layout.namespace_key(tier.blocks.digest)) == 1
        assert store(tier, view, keys)
        ok, slots = load(tier, view, keys)
        assert ok and slots == [block_payload(k, BLOCK) for k in keys]
        tier.shutdown()
    finally:
        server.stop()


def test_block_corrupted_in_place_is_refused_by_the_checksum(redis_server, prefix):
    tier, view = make_tier({"url": redis_server.url, "prefix": prefix})
    key = make_key(3, b"corrupt")
    try:
        assert store(tier, view, [key])
        client = redis_server.client()
        name = tier.blocks.block_key(key)
        client.setrange(name, 128 + 1000, b"\xff\x00\xff")
        ok, _ = load(tier, view, [key])
        assert not ok
        stats = tier.stats()
        assert stats["load_failed_checksum"] == 1 and stats["verify_failures"] == 1
        deadline = time.monotonic() + 5
        while client.exists(name) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not client.exists(name)  # deleted, so a writer can store it again
        assert wait_for_lookup(tier, key, CTX) is False
        client.close()
    finally:
        tier.shutdown()


def test_out_of_memory_server_fails_stores_with_no_space(prefix):
    with LocalRedis(args=["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]) as server:
        tier, view = make_tier({"url": server.url, "prefix": prefix})
        try:
            results = [store(tier, view, [make_key(i, b"oom") for i in range(s, s + 8)]) for s in range(0, 64, 8)]
            assert results[0] is True and results[-1] is False
            assert tier.stats()["store_failed_no_space"] > 0
        finally:
            tier.shutdown()


# -- cluster -----------------------------------------------------------------------------
def test_cluster_keys_spread_over_every_primary(redis_cluster, prefix):
    tier, view = make_tier({"mode": "cluster", "url": redis_cluster.url, "prefix": prefix})
    try:
        assert store(tier, view, [make_key(i, b"spread") for i in range(24)])
        counts = []
        for node in redis_cluster.nodes:
            client = node.client()
            counts.append(sum(1 for _ in client.scan_iter(match=f"{prefix}:*", count=1000)))
            client.close()
        assert all(c > 0 for c in counts), counts
    finally:
        tier.shutdown()


def test_cluster_resharding_during_a_run_loses_nothing(redis_cluster, prefix):
    tier, view = make_tier({"mode": "cluster", "url": redis_cluster.url, "prefix": prefix})
    stored, failures = [], []
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set() and i < 2000:
            keys = [make_key(j, b"reshard") for j in range(i, i + 8)]
            (stored if store(tier, view, keys) else failures).extend(keys)
            i += 8

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        nodes = redis_cluster.nodes
        redis_cluster.reshard(2000, nodes[0], nodes[1])
        redis_cluster.reshard(2000, nodes[1], nodes[0])
    finally:
        stop.set()
        thread.join(60)
    try:
        assert len(stored) >= 8 and not failures  # redis-py follows MOVED / ASK: no store fails either
        fresh, _ = make_tier({"mode": "cluster", "url": redis_cluster.url, "prefix": prefix}, view)
        for start in range(0, len(stored), 8):
            keys = stored[start : start + 8]
            ok, slots = load(fresh, view, keys)
            assert ok and slots == [block_payload(k, BLOCK) for k in keys]
        fresh.shutdown()
    finally:
        tier.shutdown()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_tls_round_trip_and_an_unverified_certificate_is_refused(tmp_path, prefix):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    with LocalRedis(tls=(str(cert), str(key))) as server:
        assert server.url.startswith("rediss://")
        with pytest.raises(RedisStartupError):  # the system CAs do not know the self-signed certificate
            make_tier({"url": server.url, "prefix": prefix, "retries": 0})
        tier, view = make_tier({"url": server.url, "prefix": prefix, "ssl_ca_certs": str(cert)})
        try:
            keys = [make_key(i, b"tls") for i in range(4)]
            assert store(tier, view, keys)
            ok, slots = load(tier, view, keys)
            assert ok and slots == [block_payload(k, BLOCK) for k in keys]
        finally:
            tier.shutdown()


def test_with_server_eviction_the_index_forgets_beyond_maxmemory_and_deletes_nothing(prefix):
    with LocalRedis(args=["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]) as server:
        tier, view = make_tier({"url": server.url, "prefix": prefix})
        try:
            for start in range(0, 128, 16):
                assert store(tier, view, [make_key(i, b"forget") for i in range(start, start + 16)])
            stats = tier.stats()
            assert stats["resident_bytes"] <= 4 * 1024 * 1024 < 128 * (BLOCK + 128)
            assert stats["forgotten_blocks"] > 0 and "evictions" not in stats and stats["capacity_bytes"] == 0
            client = server.client()
            assert client.info("commandstats")["cmdstat_unlink"]["calls"] == 1  # the start-up probe's, no other
            client.close()
        finally:
            tier.shutdown()


def test_capacity_with_a_unit_reaches_the_tier_as_bytes(redis_server, prefix):
    tier, _ = make_tier({"url": redis_server.url, "prefix": prefix, "eviction": "process", "capacity_bytes": "1MiB"})
    try:
        assert tier.stats()["capacity_bytes"] == 1 << 20
    finally:
        tier.shutdown()

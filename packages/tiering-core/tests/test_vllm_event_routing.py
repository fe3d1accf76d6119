"""A router's index rebuilt from our KV events over ZMQ, in vLLM's wire format, against the tiers' truth.

A real subscriber (a ZMQ SUB socket, vLLM's own ``KVEventBatch`` decoder)
keeps one index per tier (``ownership``) from the events an fs tier and a
redis tier (through a Sentinel) publish with vLLM's ``ZmqEventPublisher``
(:class:`~tiering.core.vllm.publish.StackEventPublisher`: our binding's
translation, without an engine). After every phase (stores, evictions, a
corrupt block dropped, a restart of the stack with a block deleted while it
was down, ``tiering gc``, ``verify --remove``, a Sentinel failover that lost
writes) the index equals what listing each medium finds: drift 0.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("vllm", "zmq", "tiering.fs", "tiering.redis")),
    reason="needs vLLM with pyzmq, tiering-fs and tiering-redis (the vllm-cpu env of hatch.toml)",
)

BLOCK = 16 * 1024
SLOTS = 16
TOPIC = "kv"
_ids = itertools.count(1)


class Router:
    """A KV-event consumer: per tier (``ownership``) the set of (group, block hash) it was told is held."""

    def __init__(self) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import KVEventBatch

        self.index: dict[str, set[tuple[int, Any]]] = {}
        self.received = 0
        self.gaps: list[tuple[int, int]] = []
        self._seq = -1
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self.port = self._sub.bind_to_random_port("tcp://127.0.0.1")  # the publisher connects: nothing binds 0.0.0.0
        self._sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        self._decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        while not self._stop.is_set():
            if not self._sub.poll(50):
                continue
            _topic, seq_bytes, payload = self._sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            batch = self._decoder.decode(payload)
            with self._lock:
                if seq != self._seq + 1 and seq != 0:  # a new publisher (a restarted stack) starts again at 0
                    self.gaps.append((self._seq, seq))
                self._seq = seq
                for event in batch.events:
                    self.received += 1
                    if isinstance(event, AllBlocksCleared):
                        self.index.clear()
                        continue
                    held = self.index.setdefault(event.ownership, set())
                    entries = {(event.group_idx, h) for h in event.block_hashes}
                    if isinstance(event, BlockStored):
                        held |= entries
                    elif isinstance(event, BlockRemoved):
                        held -= entries

    def snapshot(self, ownership: str) -> set[tuple[int, Any]]:
        with self._lock:
            return set(self.index.get(ownership, ()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sub.close(0)
        self._ctx.term()


def _entries(keys: Any) -> set[tuple[int, Any]]:
    from tiering.core.vllm.compat import get_offload_group_idx
    from tiering.core.vllm.publish import block_hash_of

    return {(get_offload_group_idx(bytes(k)), block_hash_of(bytes(k))) for k in keys}


def _truth(tier_config: dict[str, Any]) -> set[tuple[int, Any]]:
    """What the medium holds: every block of every namespace, as ``tiering ls`` lists them."""
    from tiering.core.inspection import inspector_for

    inspector = inspector_for(tier_config)
    assert inspector is not None
    return _entries(b.key for digest in inspector.namespaces() for b in inspector.blocks(digest))


class Stack:
    """An fs tier and a redis tier (through a Sentinel) publishing to ``router`` with vLLM's ZmqEventPublisher."""

    def __init__(self, router: Router, fs_config: dict[str, Any], redis_config: dict[str, Any]) -> None:
        from vllm.distributed.kv_events import ZmqEventPublisher

        from tiering.core import create_secondary_tier
        from tiering.core.primary import allocate_host_buffer
        from tiering.core.spec import OffloadingSpec
        from tiering.core.vllm.publish import StackEventPublisher

        self.router = router
        self.configs = {"tiering_fs": fs_config, "tiering_redis": redis_config}
        self.view = allocate_host_buffer(SLOTS, BLOCK)
        spec = OffloadingSpec({"cpu_bytes_to_use": SLOTS * BLOCK, "block_bytes": BLOCK, "model": "events/routing"})
        self.tiers = {name: create_secondary_tier(cfg, self.view, spec) for name, cfg in self.configs.items()}
        for tier in self.tiers.values():
            assert tier.wait_for_scan(60)
        self.zmq = ZmqEventPublisher(0, endpoint=f"tcp://127.0.0.1:{router.port}", topic=TOPIC)
        time.sleep(1.0)  # the PUB socket connects before the first batch (ZMQ drops what it sends earlier)
        self.sent = router.received  # the router's count when this stack starts
        self.publisher = StackEventPublisher(self.tiers, self.zmq)
        self.sent += 1  # AllBlocksCleared

    def store(self, name: str, keys: list[bytes]) -> None:
        from tiering.core.base import JobMetadata, ReqContext, block_view
        from tiering.testing import block_payload, wait_for_jobs

        tier = self.tiers[name]
        for i, key in enumerate(keys):
            block_view(self.view, i)[:] = block_payload(key, BLOCK)
        job = JobMetadata(next(_ids), keys, list(range(len(keys))), False, ReqContext("routing"))
        tier.submit_store(job)
        assert wait_for_jobs(tier, [job.job_id], 60)[job.job_id]

    def load(self, name: str, keys: list[bytes]) -> bool:
        from tiering.core.base import JobMetadata, ReqContext
        from tiering.testing import wait_for_jobs

        tier = self.tiers[name]
        job = JobMetadata(next(_ids), keys, list(range(SLOTS - len(keys), SLOTS)), True, ReqContext("routing"))
        tier.submit_load(job)
        return bool(wait_for_jobs(tier, [job.job_id], 60)[job.job_id])

    def drift(self, phase: str, timeout_s: float = 20.0) -> dict[str, int]:
        """Publish, let the router receive, and compare its index with each medium (waits out deletes in flight)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.sent += self.publisher.publish_pending()
            while self.router.received < self.sent and time.monotonic() < deadline:
                time.sleep(0.02)
            drift = {name: len(self.router.snapshot(name) ^ _truth(cfg)) for name, cfg in self.configs.items()}
            if not any(drift.values()) or time.monotonic() > deadline:
                print(f"phase {phase}: drift {drift}, router holds", {n: len(self.router.snapshot(n)) for n in drift})
                return drift
            time.sleep(0.2)

    def close(self) -> None:
        for tier in self.tiers.values():
            tier.shutdown()
        self.zmq.shutdown()


@pytest.fixture
def router() -> Iterator[Router]:
    r = Router()
    yield r
    r.close()


def _fs_block_path(root: Path, key: bytes) -> Path:
    (path,) = [Path(d, f) for d, _, fs in os.walk(root) for f in fs if f.startswith(key.hex())]
    return path


def _rescan(tier: Any) -> None:
    """Wake the fs tier's rescanner and wait for the scan to finish."""
    before = tier.stats()["scans"]
    tier._rescanner.wake()
    deadline = time.monotonic() + 10
    while tier.stats()["scans"] == before:
        assert time.monotonic() < deadline, "no rescan"
        time.sleep(0.01)


def _tiering_cli(tmp_path: Path, tier_config: dict[str, Any], *argv: str) -> int:
    """Run ``tiering <argv[0]> CONFIG <argv[1:]>`` over a stack of ``tier_config``; returns the exit status."""
    from tiering.cli.main import main

    config = {"cpu_bytes_to_use": SLOTS * BLOCK, "block_bytes": BLOCK, "model": "events/routing"}
    path = tmp_path / "gc-config.json"
    path.write_text(json.dumps({**config, "secondary_tiers": [tier_config]}))
    return main([argv[0], str(path), *argv[1:]])


def test_router_index_has_no_drift_through_stores_evictions_restart_gc_and_failover(
    tmp_path: Path, router: Router
) -> None:
    from tiering.redis.testing import LocalSentinel, have_redis_server
    from tiering.testing import make_key

    if not have_redis_server():
        pytest.skip("redis-server is not installed")
    fs_root = tmp_path / "kv"
    fs_config = {"type": "fs", "root": str(fs_root), "capacity_bytes": 6 * (BLOCK + 4096), "rescan_interval_s": 3600}
    with LocalSentinel(service_name="events", replicas=1, down_after_ms=2000) as sentinel:
        redis_config = {
            "type": "redis", "mode": "sentinel", "sentinels": sentinel.sentinels, "service_name": "events",
            "prefix": f"ev-{uuid.uuid4().hex[:8]}", "socket_timeout_s": 2, "socket_connect_timeout_s": 1,
            "retries": 2, "eviction": "process", "capacity_bytes": 8 * (BLOCK + 1024),
        }  # fmt: skip
        stack = Stack(router, fs_config, redis_config)
        try:
            # stores
            for name in stack.tiers:
                stack.store(name, [make_key(i, b"stores") for i in range(4)])
            assert stack.drift("stores") == {"tiering_fs": 0, "tiering_redis": 0}
            assert len(router.snapshot("tiering_fs")) == 4 and len(router.snapshot("tiering_redis")) == 4
            # evictions: both tiers are over their caps
            for name in stack.tiers:
                for start in range(0, 8, 4):
                    stack.store(name, [make_key(i, b"evict") for i in range(start, start + 4)])
            assert stack.tiers["tiering_fs"].stats()["evictions"] > 0
            assert stack.tiers["tiering_redis"].stats()["evictions"] > 0
            assert stack.drift("evictions") == {"tiering_fs": 0, "tiering_redis": 0}
            # a corrupt block dropped on load
            victim = make_key(7, b"evict")
            path = _fs_block_path(fs_root, victim)
            data = bytearray(path.read_bytes())
            data[10] ^= 0xFF
            path.write_bytes(bytes(data))
            assert not stack.load("tiering_fs", [victim])
            assert stack.drift("corrupt") == {"tiering_fs": 0, "tiering_redis": 0}
            assert _entries([victim]).isdisjoint(router.snapshot("tiering_fs"))
        finally:
            stack.close()

        # a restart of the stack; meanwhile a block is deleted (as `tiering gc` from another process would)
        gone = make_key(6, b"evict")
        _fs_block_path(fs_root, gone).unlink()
        stack = Stack(router, fs_config, redis_config)
        try:
            assert stack.drift("restart") == {"tiering_fs": 0, "tiering_redis": 0}
            assert _entries([gone]).isdisjoint(router.snapshot("tiering_fs"))
            # `tiering gc` down to two blocks, then a rescan of the running tier finds them gone
            assert _tiering_cli(tmp_path, fs_config, "gc", "--to-bytes", str(2 * (BLOCK + 4096))) == 0
            fs_tier = stack.tiers["tiering_fs"]
            _rescan(fs_tier)
            assert stack.drift("gc") == {"tiering_fs": 0, "tiering_redis": 0}
            assert len(router.snapshot("tiering_fs")) == 2
            # `verify --remove` of a corrupted block, then a rescan
            path = _fs_block_path(fs_root, fs_tier.index.keys()[0])
            data = bytearray(path.read_bytes())
            data[10] ^= 0xFF
            path.write_bytes(bytes(data))
            assert _tiering_cli(tmp_path, fs_config, "verify", "--remove") == 1  # 1: it found (and removed) one
            _rescan(fs_tier)
            assert stack.drift("verify --remove") == {"tiering_fs": 0, "tiering_redis": 0}
            assert len(router.snapshot("tiering_fs")) == 1

            # a Sentinel failover that lost writes: 2 blocks never reached the replica
            redis_tier = stack.tiers["tiering_redis"]
            old_primary = sentinel.primary
            held = redis_tier.index.keys()
            with old_primary.client() as client:
                assert client.wait(1, 10_000) == 1
            lost = held[-2:]
            with sentinel.replicas[0].client() as client:
                client.config_set("replica-read-only", "no")
                assert client.delete(*(redis_tier.blocks.block_key(k) for k in lost)) == len(lost)
            sentinel.kill_primary(timeout_s=90)
            deadline = time.monotonic() + 60
            while redis_tier.stats().get("failovers", 0) + redis_tier.stats()["server_restarts"] == 0:
                assert time.monotonic() < deadline, "the tier did not see the new primary"
                stack.load("tiering_redis", held[:1])
                time.sleep(0.1)
            assert redis_tier.wait_for_scan(60)
            assert stack.drift("failover") == {"tiering_fs": 0, "tiering_redis": 0}
            assert _entries(lost).isdisjoint(router.snapshot("tiering_redis"))
            assert len(router.snapshot("tiering_redis")) == len(held) - len(lost)
        finally:
            stack.close()
    assert router.gaps == []  # every batch arrived: the index is built from the events alone

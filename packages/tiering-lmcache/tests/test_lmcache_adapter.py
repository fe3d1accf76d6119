"""The LMCache L2 adapter against LMCache 0.5.6's own code (the ``lmcache`` hatch environment).

LMCache's plugin loader builds the adapter from the config users write;
the tests then drive it through ``L2AdapterInterface`` exactly as LMCache's
storage controllers do (submit, poll the event fd, collect), over fs, s3
(a moto server) and redis (a local redis-server). LMCache's own fs adapter
runs through the same driver where the two are compared.
"""

from __future__ import annotations

import importlib.util
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("lmcache", reason="the lmcache environment: hatch run lmcache:test")

from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import get_l2_adapter_config_class

from tiering.lmcache.adapter import TieringL2Adapter
from tiering.lmcache.driver import load, lookup_and_lock, memory_obj, object_key, store
from tiering.lmcache.keys import encode_key, row_bytes

OBJECT_BYTES = 16 * 1024
ROW_BYTES = row_bytes(OBJECT_BYTES)  # what the tier holds (and usage counts) per object
HAS_S3 = importlib.util.find_spec("tiering.s3") is not None and importlib.util.find_spec("moto") is not None
HAS_REDIS = importlib.util.find_spec("tiering.redis") is not None


def build(config: dict[str, Any]) -> Any:
    """An adapter built the way LMCache builds one from ``--l2-adapter <json>``."""
    return create_l2_adapter(get_l2_adapter_config_class(config["type"]).from_dict(config))


def plugin(tier: dict[str, Any], **params: Any) -> dict[str, Any]:
    return {
        "type": "plugin",
        "module_path": "tiering.lmcache.adapter",
        "class_name": "TieringL2Adapter",
        "adapter_params": {"object_bytes": OBJECT_BYTES, "tier": tier, **params},
    }


def payloads(count: int, seed: int = 0) -> list[bytes]:
    """Random objects, the last one a short (partial) chunk."""
    rng = random.Random(seed)
    sizes = [OBJECT_BYTES] * (count - 1) + [OBJECT_BYTES // 3]
    return [rng.randbytes(size) for size in sizes]


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[dict[str, Any]]:
    if not HAS_S3:
        pytest.skip("tiering-s3 or moto is not installed")
    from tiering.s3.testing import moto_server

    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    with moto_server("tiering-kv") as server:
        yield server.connection()


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    if not HAS_REDIS:
        pytest.skip("tiering-redis is not installed")
    from tiering.redis.testing import LocalRedis, have_redis_server

    if not have_redis_server():
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with LocalRedis() as server:
        yield f"redis://127.0.0.1:{server.port}/0"


def tier_entry(kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> dict[str, Any]:
    if kind == "fs":
        (tmp_path / "kv").mkdir(exist_ok=True)
        return {"type": "fs", "root": str(tmp_path / "kv")}
    if kind == "s3":
        return {
            "type": "s3",
            "prefix": f"lmc/{tmp_path.name}",
            **request.getfixturevalue("s3_endpoint"),
        }
    return {"type": "redis", "url": request.getfixturevalue("redis_url"), "prefix": f"lmc-{tmp_path.name}"}


def test_lmcache_plugin_loader_builds_our_adapter(tmp_path: Any) -> None:
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}))
    try:
        assert isinstance(adapter, TieringL2Adapter)
        fds = {adapter.get_store_event_fd(), adapter.get_lookup_and_lock_event_fd(), adapter.get_load_event_fd()}
        assert len(fds) == 3  # LMCache's controllers map fds to adapters: they must differ
        assert adapter.report_status()["is_healthy"] is True
        # Arguments later LMCache versions add (layout_desc...) are accepted and ignored.
        task = adapter.submit_lookup_and_lock_task([], {}, "a-later-positional", layout_desc=None)
        assert isinstance(task, int)
        assert isinstance(adapter.submit_store_task([], [], "later", layout_desc=None), int)
        assert isinstance(adapter.submit_load_task([], [], "later", layout_desc=None), int)
        adapter.submit_unlock([object_key(1)], "later", layout_desc=None)
    finally:
        adapter.close()
    with pytest.raises(ValueError, match="'objects_bytes' \\(did you mean 'object_bytes'"):
        build(plugin({"type": "fs", "root": str(tmp_path)}, objects_bytes=1))


@pytest.mark.parametrize("kind", ["fs", "s3", "redis"])
def test_store_lookup_load_round_trip(kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    # Fewer staging rows than objects: the batches of one task share the staging buffer.
    adapter = build(plugin(tier_entry(kind, tmp_path, request), staging_objects=3))
    try:
        data = payloads(8)
        keys = [object_key(i) for i in range(len(data))]
        result = store(adapter, keys, [memory_obj(d) for d in data])
        assert result.is_successful() and result.bytes_transferred() == sum(map(len, data))
        absent = object_key(99)
        assert lookup_and_lock(adapter, [*keys, absent]) == list(range(len(keys)))
        targets = [memory_obj(len(d)) for d in data]
        assert load(adapter, keys, targets) == list(range(len(keys)))
        assert [bytes(t.byte_array) for t in targets] == data
        adapter.submit_unlock(keys)
        assert adapter.report_status()["locked_keys"] == 0
    finally:
        adapter.close()


def test_every_object_key_field_keeps_objects_apart(tmp_path: Any) -> None:
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}))
    try:
        assert store(adapter, [object_key(1)], [memory_obj(b"x" * 100)]).is_successful()
        others = [
            object_key(1, model="other/model"),
            object_key(2),
            object_key(1, kv_rank=1),
            object_key(1, object_group_id=1),
            object_key(1, cache_salt="user-b"),
        ]
        assert lookup_and_lock(adapter, [object_key(1), *others]) == [0]
    finally:
        adapter.close()


def test_c24_a_corrupted_object_is_refused_then_replaced_by_the_next_store(tmp_path: Any) -> None:
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}))
    data = payloads(3, seed=1)
    keys = [object_key(i) for i in range(3)]
    try:
        assert store(adapter, keys, [memory_obj(d) for d in data]).is_successful()
        # The first object of the load job: the tier reports no success for any, the others are retried.
        bad = adapter.tier.block_path(encode_key(keys[0]))
    finally:
        adapter.close()
    with open(bad, "r+b") as f:
        blob = bytearray(f.read())
        blob[len(blob) // 2] ^= 0xFF
        f.seek(0)
        f.write(blob)
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}))
    try:
        targets = [memory_obj(len(d)) for d in data]
        loaded = load(adapter, keys, targets)
        assert loaded == [1, 2]  # exactly the corrupted one refused
        assert all(bytes(targets[i].byte_array) == data[i] for i in loaded)
        assert adapter.report_status()["tier_stats"].get("load_failed_checksum", 0) == 1
        # The next store of the same objects replaces the bad one (not skipped as "already present").
        assert store(adapter, keys, [memory_obj(d) for d in data]).is_successful()
        targets = [memory_obj(len(d)) for d in data]
        assert load(adapter, keys, targets) == [0, 1, 2]
        assert [bytes(t.byte_array) for t in targets] == data
    finally:
        adapter.close()


def test_c01_an_object_of_another_length_is_never_returned(tmp_path: Any) -> None:
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}))
    try:
        assert store(adapter, [object_key(1)], [memory_obj(b"a" * 100)]).is_successful()
        target = memory_obj(b"\x07" * 200)
        assert load(adapter, [object_key(1)], [target]) == []
        assert bytes(target.byte_array) == b"\x07" * 200  # untouched
        assert not store(adapter, [object_key(2)], [memory_obj(OBJECT_BYTES + 1)]).is_successful()
    finally:
        adapter.close()


def test_a_lost_unlock_expires(tmp_path: Any) -> None:
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}, lock_ttl_s=0.2))
    try:
        store(adapter, [object_key(1)], [memory_obj(b"z" * 10)])
        assert lookup_and_lock(adapter, [object_key(1)]) == [0]
        assert adapter.report_status()["locked_keys"] == 1
        assert not adapter.tier.pinning and adapter.tier.stats()["pins_refused"] == 0  # pinning off: no pin tried
        deadline = time.monotonic() + 10
        while adapter.report_status()["locked_keys"] and time.monotonic() < deadline:
            time.sleep(0.05)
        status = adapter.report_status()
        assert status["locked_keys"] == 0 and status["locks_expired"] == 1
        adapter.submit_unlock([object_key(1)])  # a late unlock is harmless
    finally:
        adapter.close()


LONG_SALT = "tenant-with-a-salt-longer-than-31-bytes"
SALTS = {"tenant-a": 3, "": 1, LONG_SALT: 2}  # salt -> objects stored under it


def _usage_after_restart(
    config: dict[str, Any], until: Callable[[Any], bool], then: Callable[[Any], None] = lambda _: None
) -> tuple[Any, Any]:
    """Store objects under :data:`SALTS`, close, build again on the same storage: (usage before, usage after).

    After the restart, waits (10 s at most) until ``until(usage)`` holds,
    takes the usage, then calls ``then(adapter)``.
    """
    keys = [
        object_key(100 * n + i, cache_salt=salt) for n, (salt, count) in enumerate(SALTS.items()) for i in range(count)
    ]
    adapter = build(config)
    try:
        assert store(adapter, keys, [memory_obj(OBJECT_BYTES) for _ in keys]).is_successful()
        before = adapter.get_usage()
    finally:
        adapter.close()
    adapter = build(config)
    try:
        deadline = time.monotonic() + 10
        while not until(adapter.get_usage()) and time.monotonic() < deadline:
            time.sleep(0.05)  # the tier rescans its root on start, the adapter lists its keys
        after = adapter.get_usage()
        then(adapter)
        return before, after
    finally:
        adapter.close()


def test_c04_a_restart_keeps_usage_accounting_per_cache_salt(tmp_path: Any) -> None:
    (tmp_path / "ours").mkdir()
    expected = {s: n * ROW_BYTES for s, n in SALTS.items()}
    short = {s: b for s, b in expected.items() if s != LONG_SALT}

    def long_salt_seen(adapter: Any) -> None:
        # The long salt is only a hash in its keys: a request carrying it names the bytes counted under it.
        assert lookup_and_lock(adapter, [object_key(999, cache_salt=LONG_SALT)]) == []
        assert adapter.get_usage().bytes_by_cache_salt == expected

    before, after = _usage_after_restart(
        plugin({"type": "fs", "root": str(tmp_path / "ours")}),
        lambda u: u.bytes_by_cache_salt == short,
        long_salt_seen,
    )
    assert before.bytes_by_cache_salt == expected
    assert before.total_bytes_used >= 6 * OBJECT_BYTES and after.total_bytes_used == before.total_bytes_used
    # Counted again from the keys the tier lists.
    assert after.bytes_by_cache_salt == short
    # LMCache's own fs adapter forgets its usage on restart (the files are still there).
    before, after = _usage_after_restart(
        {"type": "fs", "base_path": str(tmp_path / "theirs")}, lambda u: u.total_bytes_used > 0
    )
    assert before.bytes_by_cache_salt == {s: n * OBJECT_BYTES for s, n in SALTS.items()}
    assert (before.total_bytes_used, after.total_bytes_used, dict(after.bytes_by_cache_salt)) == (
        6 * OBJECT_BYTES,
        0,
        {},
    )


@pytest.mark.parametrize("kind", ["s3", "redis"])
def test_c04_usage_per_cache_salt_is_restored_from_s3_and_redis(
    kind: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    short = {s: n * ROW_BYTES for s, n in SALTS.items() if s != LONG_SALT}
    before, after = _usage_after_restart(
        plugin(tier_entry(kind, tmp_path, request)), lambda u: u.bytes_by_cache_salt == short
    )
    assert before.bytes_by_cache_salt == {s: n * ROW_BYTES for s, n in SALTS.items()}
    assert after.bytes_by_cache_salt == short  # listed from the bucket / the Redis key space


def test_jobs_carry_the_cache_salt_as_tenant(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}))
    try:
        seen: list[tuple[str, int]] = []
        for name in ("submit_store", "submit_load"):
            real = getattr(adapter.tier, name)

            def record(job: Any, real: Any = real) -> None:
                seen.append((job.req_context.tenant, len(job.keys)))
                real(job)

            monkeypatch.setattr(adapter.tier, name, record)
        keys = [object_key(1, cache_salt="a"), object_key(2, cache_salt="b"), object_key(3, cache_salt="a")]
        assert store(adapter, keys, [memory_obj(b"s" * 32) for _ in keys]).is_successful()
        assert sorted(seen) == [("a", 2), ("b", 1)]  # one job per tenant, never a job of mixed tenants
        seen.clear()
        assert load(adapter, keys, [memory_obj(32) for _ in keys]) == [0, 1, 2]
        assert sorted(seen) == [("a", 2), ("b", 1)]
    finally:
        adapter.close()


def test_close_reports_every_task(tmp_path: Any) -> None:
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}, staging_objects=1))
    keys = [object_key(i) for i in range(32)]
    task = adapter.submit_store_task(keys, [memory_obj(OBJECT_BYTES) for _ in keys])
    adapter.close()
    results = adapter.pop_completed_store_tasks()
    assert set(results) == {task}
    with pytest.raises(RuntimeError, match="closed"):
        adapter.submit_load_task(keys, [memory_obj(OBJECT_BYTES) for _ in keys])


def test_empty_tasks_complete(tmp_path: Any) -> None:
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}))
    try:
        assert store(adapter, [], []).is_successful()
        assert lookup_and_lock(adapter, []) == [] and load(adapter, [], []) == []
    finally:
        adapter.close()


def test_a_tier_call_that_raises_fails_the_tasks_and_the_worker_survives(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}))
    try:
        real = adapter.tier.get_finished
        raised = []

        def broken() -> Any:
            # Once, while a job is in flight (the worker also polls when idle, before the store comes).
            if not raised and adapter.tier.has_pending_work():
                raised.append(True)
                raise RuntimeError("tier bug")
            return real()

        monkeypatch.setattr(adapter.tier, "get_finished", broken)
        assert not store(adapter, [object_key(1)], [memory_obj(b"q" * 64)]).is_successful()
        status = adapter.report_status()
        assert status["is_healthy"] is True and status["errors"] == 1
        # The job the tier still ran is reported later and only frees its row; new tasks work.
        assert store(adapter, [object_key(2)], [memory_obj(b"r" * 64)]).is_successful()
        target = memory_obj(64)
        assert load(adapter, [object_key(2)], [target]) == [0] and bytes(target.byte_array) == b"r" * 64
    finally:
        adapter.close()


def test_loads_go_before_queued_stores(tmp_path: Any) -> None:
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}, staging_objects=1))
    try:
        assert store(adapter, [object_key(0)], [memory_obj(b"L" * 100)]).is_successful()
        keys = [object_key(i) for i in range(1, 65)]
        big = adapter.submit_store_task(keys, [memory_obj(OBJECT_BYTES) for _ in keys])
        target = memory_obj(100)
        assert load(adapter, [object_key(0)], [target]) == [0]
        assert big not in adapter.pop_completed_store_tasks()  # the load did not wait for 64 stores
    finally:
        adapter.close()


def test_c01_an_lmcache_object_is_never_served_to_another_engine(tmp_path: Any) -> None:
    from tiering.core import OffloadingSpec, ReqContext
    from tiering.fs import FsspecSecondaryTierManager

    key = object_key(7)
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}))
    try:
        assert store(adapter, [key], [memory_obj(b"k" * 100)]).is_successful()
    finally:
        adapter.close()
    # A vLLM stack over the same root, same model and row size, asked for the very same key.
    spec = OffloadingSpec({"cpu_bytes_to_use": 4 * ROW_BYTES, "block_bytes": ROW_BYTES})
    view = memoryview(bytearray(spec.cpu_bytes_to_use)).cast("B", (4, spec.block_bytes))
    vllm_tier = FsspecSecondaryTierManager(spec, view, "fs", root=str(tmp_path))
    try:
        assert vllm_tier.wait_for_scan(30)
        assert vllm_tier.lookup(encode_key(key), ReqContext("vllm")) is False
    finally:
        vllm_tier.shutdown()
    assert len([d for d in os.listdir(tmp_path) if os.path.isdir(tmp_path / d)]) == 2  # two namespaces side by side


def test_store_and_prefetch_threads_at_once(tmp_path: Any) -> None:
    # LMCache's store controller and prefetch controller call the adapter from two threads at once.
    adapter = build(plugin({"type": "fs", "root": str(tmp_path)}, staging_objects=4))
    data = payloads(24, seed=3)
    keys = [object_key(i, cache_salt=f"t{i % 3}") for i in range(24)]
    errors: list[BaseException] = []

    def storer() -> None:
        try:
            for start in range(0, 24, 6):
                chunk = slice(start, start + 6)
                assert store(adapter, keys[chunk], [memory_obj(d) for d in data[chunk]]).is_successful()
        except BaseException as exc:  # reported below
            errors.append(exc)

    def prefetcher() -> None:
        try:
            for _ in range(20):
                hits = lookup_and_lock(adapter, keys)
                targets = [memory_obj(len(data[i])) for i in hits]
                loaded = load(adapter, [keys[i] for i in hits], targets)
                adapter.submit_unlock([keys[i] for i in hits])
                assert loaded == list(range(len(hits)))
                assert all(bytes(t.byte_array) == data[i] for t, i in zip(targets, hits, strict=True))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=storer), threading.Thread(target=prefetcher)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        assert lookup_and_lock(adapter, keys) == list(range(24))
        assert adapter.get_usage().bytes_by_cache_salt == {f"t{n}": 8 * ROW_BYTES for n in range(3)}
    finally:
        adapter.close()


def test_a_lock_pins_the_object_until_its_unlock(tmp_path: Any) -> None:
    # The lock protects an object against eviction (LMCache reads it after the lookup): a tier with
    # pinning on keeps it however many stores follow; the last unlock ends the pin.
    stored = 3 * (ROW_BYTES + 4096)  # an fs block file: the row, then a 4 KiB trailer page
    tier = {"type": "fs", "root": str(tmp_path), "capacity_bytes": stored, "max_pinned_bytes": stored // 3}
    adapter = build(plugin(tier))
    try:
        assert store(adapter, [object_key(0)], [memory_obj(b"p" * OBJECT_BYTES)]).is_successful()
        assert lookup_and_lock(adapter, [object_key(0)]) == [0]
        assert adapter.tier.pinning and adapter.tier.stats()["pinned_blocks"] == 1
        for i in range(1, 8):  # 7 more objects through a tier holding 3
            assert store(adapter, [object_key(i)], [memory_obj(bytes([i]) * OBJECT_BYTES)]).is_successful()
        assert adapter.tier.stats()["evictions"] >= 5
        assert lookup_and_lock(adapter, [object_key(0)]) == [0]  # still there: pinned
        adapter.submit_unlock([object_key(0)])
        adapter.submit_unlock([object_key(0)])
        deadline = time.monotonic() + 10
        while adapter.tier.stats()["pinned_blocks"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert adapter.tier.stats()["pinned_blocks"] == 0
        for i in range(8, 12):
            assert store(adapter, [object_key(i)], [memory_obj(bytes([i]) * OBJECT_BYTES)]).is_successful()
        assert lookup_and_lock(adapter, [object_key(0)]) == []  # unpinned: evicted like any other
    finally:
        adapter.close()

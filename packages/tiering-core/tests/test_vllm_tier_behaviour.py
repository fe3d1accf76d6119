"""Our tiers held to what vLLM's own tier tests expect of vLLM's fs tier, through vLLM's own factory.

The cases of vLLM's ``tests/v1/kv_offload/tiering/test_fs_tier.py`` and
``test_tier_factory.py`` (written here anew, against ``tiering_fs`` and
``tiering_example``): an empty tier misses; a store makes a key HIT; a store
then load round-trips into other primary slots, for batches of 0, 1, 2 and 5
blocks; a load of a missing block fails the job; a partly failed load names
the blocks that loaded; jobs are reported exactly once; shutdown finishes
or fails every job; the factory forwards ``locality`` and refuses a bad one.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tiering.testing import requires_vllm

pytestmark = requires_vllm()
HAS_FS = importlib.util.find_spec("tiering.fs") is not None

MODULE = "tiering.core.vllm.tiers"
ROW = 16384
KINDS = ["example", pytest.param("fs", marks=pytest.mark.skipif(not HAS_FS, reason="tiering-fs is not installed"))]


def entry(kind: str, tmp_path: Any, **extra: Any) -> dict[str, Any]:
    e: dict[str, Any] = {"type": f"tiering_{kind}", "module_path": MODULE, **extra}
    if kind == "fs":
        e["root"] = str(tmp_path / "kv")
    return e


@pytest.fixture
def primary() -> Iterator[tuple[Any, Any, Any]]:
    """vLLM's spec, its primary view and a flat writable byte view of it (64 rows of ROW bytes)."""
    from tiering.testing import vllm_driver as testing

    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 64 * ROW, "secondary_tiers": []}
    with testing.vllm_manager(extra, worker_kv_bytes_per_block=ROW) as (spec, manager, driver):
        view = manager.primary_tier.get_kv_memoryview()
        yield spec, view, driver
        view.release()


def make_tier(kind: str, tmp_path: Any, primary: Any, **extra: Any) -> Any:
    from tiering.core.vllm import compat

    spec, view, _ = primary
    return compat.VLLMSecondaryTierFactory.create_secondary_tier(entry(kind, tmp_path, **extra), view, spec)


def job(job_id: int, keys: list[bytes], chunks: list[int], promotion: bool) -> Any:
    import numpy as np

    from tiering.core.vllm import compat

    return compat.TransferJob(
        job_id=job_id,
        keys=list(keys),
        chunk_ids=np.asarray(chunks, dtype=np.int64),
        is_promotion=promotion,
        req_context=compat.ReqContext(req_id=f"req-{job_id}"),
    )


def finish(tier: Any, job_ids: set[int], timeout_s: float = 30.0) -> dict[int, Any]:
    """Poll ``get_finished_jobs`` until every job in ``job_ids`` is reported; fail on a duplicate."""
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    while set(results) != job_ids:
        assert time.monotonic() < deadline, f"jobs {job_ids - set(results)} never reported"
        for result in tier.get_finished_jobs():
            assert result.job_id not in results, f"job {result.job_id} reported twice"
            results[result.job_id] = result
        time.sleep(0.005)
    return results


def settle_lookup(tier: Any, key: bytes) -> Any:
    from tiering.core.vllm import compat

    ctx = compat.ReqContext(req_id="lookup")
    deadline = time.monotonic() + 30
    while (verdict := tier.lookup(key, ctx)) is compat.LookupResult.RETRY:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    return verdict


@pytest.mark.parametrize("kind", KINDS)
def test_empty_tier_misses_and_a_store_makes_a_hit(kind: str, tmp_path: Any, primary: Any) -> None:
    from tiering.core.vllm import compat
    from tiering.testing import vllm_driver as testing

    tier = make_tier(kind, tmp_path, primary)
    try:
        key = testing.make_key(1)
        assert settle_lookup(tier, key) is compat.LookupResult.MISS
        primary[2].row(3)[:] = testing.payload(key, ROW)
        tier.submit_store(job(1, [key], [3], promotion=False))
        assert finish(tier, {1})[1].success
        assert settle_lookup(tier, key) is compat.LookupResult.HIT
    finally:
        tier.shutdown()


@pytest.mark.parametrize("batch", [0, 1, 2, 5])
@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_into_other_slots_is_byte_exact(kind: str, batch: int, tmp_path: Any, primary: Any) -> None:
    from tiering.testing import vllm_driver as testing

    driver = primary[2]
    tier = make_tier(kind, tmp_path, primary)
    try:
        keys = [testing.make_key(i, seed=b"rt") for i in range(batch)]
        for i, key in enumerate(keys):
            driver.row(i)[:] = testing.payload(key, ROW)
        tier.submit_store(job(1, keys, list(range(batch)), promotion=False))
        assert finish(tier, {1})[1].success
        for i in range(batch):
            driver.row(i)[:] = bytes(ROW)
        targets = [32 + i for i in range(batch)]
        tier.submit_load(job(2, keys, targets, promotion=True))
        result = finish(tier, {2})[2]
        assert result.success
        assert result.transfer_bytes == (batch * ROW or None)
        assert [driver.row(t).tobytes() for t in targets] == [testing.payload(k, ROW) for k in keys]
        assert all(driver.row(i).tobytes() == bytes(ROW) for i in range(batch))  # sources untouched by the load
    finally:
        tier.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_load_of_a_missing_block_fails_the_job(kind: str, tmp_path: Any, primary: Any) -> None:
    from tiering.testing import vllm_driver as testing

    tier = make_tier(kind, tmp_path, primary)
    try:
        tier.submit_load(job(5, [testing.make_key(77)], [4], promotion=True))
        result = finish(tier, {5})[5]
        assert not result.success and not result.successful_keys and result.transfer_bytes is None
    finally:
        tier.shutdown()


@pytest.mark.skipif(not HAS_FS, reason="tiering-fs is not installed")
def test_partly_failed_load_names_the_blocks_that_loaded(tmp_path: Any, primary: Any) -> None:
    from tiering.testing import vllm_driver as testing

    driver = primary[2]
    tier = make_tier("fs", tmp_path, primary)
    try:
        keys = [testing.make_key(i, seed=b"part") for i in range(5)]
        for i, key in enumerate(keys):
            driver.row(i)[:] = testing.payload(key, ROW)
        tier.submit_store(job(1, keys, list(range(5)), promotion=False))
        assert finish(tier, {1})[1].success
        for dirpath, _, files in os.walk(tmp_path / "kv"):
            for name in files:
                if name.startswith(keys[3].hex()):
                    os.remove(os.path.join(dirpath, name))
        tier.submit_load(job(2, keys, [40 + i for i in range(5)], promotion=True))
        result = finish(tier, {2})[2]
        assert not result.success
        # as vLLM's fs tier: the blocks before the first bad one are kept (a block read by another I/O thread
        # after it may be kept too); the bad one never
        loaded = list(result.successful_keys)
        assert keys[3] not in loaded and set(keys[:3]) <= set(loaded) <= set(keys)
        assert result.transfer_bytes == len(loaded) * ROW
        for i, key in enumerate(keys):
            if key in loaded:
                assert driver.row(40 + i).tobytes() == testing.payload(key, ROW)
    finally:
        tier.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_shutdown_reports_or_finishes_every_job(kind: str, tmp_path: Any, primary: Any) -> None:
    from tiering.testing import vllm_driver as testing

    driver = primary[2]
    tier = make_tier(kind, tmp_path, primary)
    keys = [testing.make_key(i, seed=b"sd") for i in range(8)]
    for i, key in enumerate(keys):
        driver.row(i)[:] = testing.payload(key, ROW)
    for n in range(8):
        tier.submit_store(job(n, [keys[n]], [n], promotion=False))
    tier.drain_jobs()  # vLLM's reset_cache: afterwards every job's result is there, none aborted
    results = finish(tier, set(range(8)), timeout_s=0.5)
    assert all(r.success for r in results.values())
    assert not tier.has_pending_work()
    # jobs still queued at shutdown are finished or failed, never lost
    for n in range(8):
        tier.submit_load(job(100 + n, [keys[n]], [16 + n], promotion=True))
    tier.shutdown()
    assert set(finish(tier, {100 + n for n in range(8)}, timeout_s=5)) == {100 + n for n in range(8)}


@pytest.mark.parametrize("kind", KINDS)
def test_factory_forwards_locality(kind: str, tmp_path: Any, primary: Any) -> None:
    from tiering.core.vllm import compat

    tier = make_tier(kind, tmp_path, primary, locality="REMOTE")
    try:
        assert tier.locality is compat.Locality.REMOTE
    finally:
        tier.shutdown()
    with pytest.raises(ValueError, match="'remote' is not a valid Locality"):
        make_tier(kind, tmp_path, primary, locality="remote")


@pytest.mark.skipif(not HAS_FS, reason="tiering-fs is not installed")
def test_fs_without_a_root_is_refused_naming_the_key(tmp_path: Any, primary: Any) -> None:
    from tiering.core.vllm import compat

    spec, view, _ = primary
    with pytest.raises((TypeError, ValueError), match="root"):
        compat.VLLMSecondaryTierFactory.create_secondary_tier({"type": "tiering_fs", "module_path": MODULE}, view, spec)


@pytest.mark.skipif(not HAS_FS, reason="tiering-fs is not installed")
def test_a_request_asking_for_a_pin_pins_the_blocks_it_stores(tmp_path: Any, primary: Any) -> None:
    import numpy as np

    from tiering.core.vllm import compat
    from tiering.testing import vllm_driver as testing

    tier = make_tier("fs", tmp_path, primary, capacity_bytes=16 * (ROW + 4096), max_pinned_bytes=4 * (ROW + 4096))
    try:
        keys = [testing.make_key(i, seed=b"pin") for i in range(3)]
        for i, key in enumerate(keys):
            primary[2].row(i)[:] = testing.payload(key, ROW)
        ctx = compat.ReqContext(req_id="pinned", kv_transfer_params={"tiering_pin_ttl": "1h"})
        tier.submit_store(
            compat.TransferJob(job_id=1, keys=keys, chunk_ids=np.arange(3), is_promotion=False, req_context=ctx)
        )
        assert finish(tier, {1})[1].success
        deadline = time.monotonic() + 10
        while tier.tier.stats()["pinned_blocks"] < 3:
            assert time.monotonic() < deadline, tier.tier.stats()
            time.sleep(0.01)
        assert sorted(tier.tier.pins.pinned()) == sorted(keys)
    finally:
        tier.shutdown()

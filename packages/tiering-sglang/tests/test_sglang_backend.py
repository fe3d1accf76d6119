"""The SGLang HiCache backend against SGLang's own code (hatch env ``sglang``): factory, host-pool page methods, tests.

SGLang's ``StorageBackendFactory`` loads the backend by ``module_path`` from
the extra config; pages of host pools whose page methods are SGLang's own
(compiled from its source, see ``support/sglang_pools.py``) round-trip
through fs, s3 (moto server) and redis (``tiering.redis.testing``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import threading
import types
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory", reason="needs SGLang (hatch env sglang)")

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from tiering.sglang.storage import TieringHiCacheStorage

sys.path.insert(0, str(Path(__file__).parent / "support"))
from sglang_pools import mha_host_pool, mla_host_pool, page_bytes_of, sglang_methods, sglang_storage_metrics

MODULE = {
    "backend_name": "tiering",
    "module_path": "tiering.sglang.storage",
    "class_name": "TieringHiCacheStorage",
}


def storage_config(tiers: list[dict[str, Any]], *, v1: int = 1, **fields: Any) -> HiCacheStorageConfig:
    values: dict[str, Any] = {
        "tp_rank": 0,
        "tp_size": 1,
        "pp_rank": 0,
        "pp_size": 1,
        "attn_cp_rank": 0,
        "attn_cp_size": 1,
        "is_mla_model": False,
        "enable_storage_metrics": False,
        "is_page_first_layout": False,
        "model_name": "test/model",
    }
    values.update(fields)
    extra = {**MODULE, "interface_v1": v1, "tiering": {"secondary_tiers": tiers}, "tiering_job_timeout_s": 20}
    return HiCacheStorageConfig(**values, extra_config=extra)


def backend(config: HiCacheStorageConfig, pool: Any) -> TieringHiCacheStorage:
    """As SGLang's cache controller attaches a backend: the factory, then register_mem_pool_host."""
    made = StorageBackendFactory.create_backend("dynamic", config, pool)
    made.register_mem_pool_host(pool)
    assert isinstance(made, TieringHiCacheStorage)
    return made


def indices(pool: Any, pages: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(p * pool.page_size, (p + 1) * pool.page_size) for p in pages])


def keys(n: int) -> list[str]:
    """Page keys as SGLang makes them: hex SHA-256 strings."""
    salt = uuid.uuid4().bytes
    return [hashlib.sha256(salt + bytes([i])).hexdigest() for i in range(n)]


@pytest.fixture
def fs_tier(tmp_path: Path) -> list[dict[str, Any]]:
    return [{"type": "fs", "root": str(tmp_path / "kv")}]


@pytest.fixture(scope="module")
def moto() -> Any:
    pytest.importorskip("moto.server")
    s3_testing = pytest.importorskip("tiering.s3.testing")
    with s3_testing.moto_server("sglang") as server:
        yield server.connection()


@pytest.fixture(scope="module")
def redis_url() -> Any:
    servers = pytest.importorskip("tiering.redis.testing")
    if not servers.have_redis_server():
        pytest.skip("redis-server is not installed")
    with servers.LocalRedis() as server:
        yield server.url


def tier_entries(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    if kind == "fs":
        return [{"type": "fs", "root": str(tmp_path / "kv")}]
    if kind == "s3":
        return [{"type": "s3", "prefix": uuid.uuid4().hex[:8], **request.getfixturevalue("moto")}]
    return [{"type": "redis", "url": request.getfixturevalue("redis_url"), "prefix": uuid.uuid4().hex[:8]}]


@pytest.mark.parametrize("kind", ["fs", "s3", "redis"])
@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_pages_round_trip_through_each_tier(kind: str, layout: str, tmp_path: Path, request: Any) -> None:
    tiers = tier_entries(kind, tmp_path, request)
    source = mha_host_pool(layout)
    writer = backend(storage_config(tiers), source)
    names = keys(3)
    assert writer.batch_exists(names) == 0
    assert writer.batch_set_v1(names, indices(source, [3, 5, 7])) == [True, True, True]
    assert writer.batch_exists(names) == 3
    writer.close()
    # A second engine (a restart) reads them into other pages of another pool.
    target = mha_host_pool(layout)
    reader = backend(storage_config(tiers), target)
    assert reader.batch_exists(names + keys(1)) == 3
    assert reader.batch_get_v1(names, indices(target, [0, 1, 2])) == [True, True, True]
    for src, dst in zip([3, 5, 7], [0, 1, 2]):
        assert page_bytes_of(target, dst) == page_bytes_of(source, src)
    reader.close()


def test_c27_corrupt_page_is_refused_and_ends_the_leading_run(fs_tier: list[dict[str, Any]]) -> None:
    source = mha_host_pool()
    writer = backend(storage_config(fs_tier), source)
    names = keys(4)
    assert all(writer.batch_set_v1(names, indices(source, [0, 1, 2, 3])))
    fs = writer.stack.tiers[0]  # type: ignore[union-attr]
    with open(fs.block_path(names[2].encode()), "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))  # the payload's first byte changed (fs writes the payload first)
    expected = [page_bytes_of(source, p) for p in range(4)]
    for page in range(8, 12):  # the pages loaded into, cleared (SGLang loads into the pool it registered)
        start = page * source.page_size
        source.set_from_flat_data_page(start, torch.zeros_like(source.get_data_page(start)))
    result = writer.batch_get_v1(names, indices(source, [8, 9, 10, 11]))
    assert result[:3] == [True, True, False]
    assert next(i for i, ok in enumerate(result) if not ok) == 2  # SGLang's count of the leading run
    assert [page_bytes_of(source, p) for p in (8, 9)] == expected[:2]
    assert page_bytes_of(source, 10) == bytes(len(expected[2]))  # the refused page was not written
    assert writer.batch_exists(names) == 2  # the tier dropped the bad block
    writer.close()


def test_c27_tier_errors_answer_lists_of_bools_never_none(fs_tier: list[dict[str, Any]]) -> None:
    pool = mha_host_pool()
    made = backend(storage_config(fs_tier), pool)
    tier = made.stack.tiers[0]  # type: ignore[union-attr]

    def boom(*args: Any) -> Any:
        raise RuntimeError("tier down")

    tier.submit_store = boom
    tier.submit_load = boom
    assert made.batch_set_v1(keys(2), indices(pool, [0, 1])) == [False, False]
    tier.lookup = boom
    assert made.batch_exists(keys(2)) == 0
    assert made.batch_get_v1(keys(2), indices(pool, [0, 1])) == [False, False]
    assert made.batch_get_v1(keys(2), indices(pool, [0])) == [False, False]  # wrong index count
    made.close()


def test_c27_mla_ranks_share_one_copy_whichever_rank_writes(fs_tier: list[dict[str, Any]]) -> None:
    # SGLang lets only its storage writer (rank 0 with MLA) back pages up; a rank that is asked to writes, and a
    # page held already is not written again.
    pools = [mla_host_pool() for _ in range(2)]
    ranks = [backend(storage_config(fs_tier, is_mla_model=True, tp_rank=r, tp_size=2), pools[r]) for r in (0, 1)]
    names = keys(2)
    assert ranks[1].batch_set_v1(names, indices(pools[1], [0, 1])) == [True, True]
    assert ranks[0].batch_exists(names) == 2  # one namespace for every MLA rank
    blocks = {p: p.stat().st_mtime_ns for p in Path(fs_tier[0]["root"]).rglob("*.kvb")}
    assert len(blocks) == 2
    assert ranks[0].batch_set_v1(names, indices(pools[0], [2, 3])) == [True, True]
    assert {p: p.stat().st_mtime_ns for p in Path(fs_tier[0]["root"]).rglob("*.kvb")} == blocks  # not rewritten
    assert ranks[0].batch_get_v1(names, indices(pools[0], [4, 5])) == [True, True]
    assert page_bytes_of(pools[0], 4) == page_bytes_of(pools[1], 0)
    for made in ranks:
        made.close()


def test_c27_namespace_keeps_tp_ranks_and_interfaces_apart(fs_tier: list[dict[str, Any]]) -> None:
    pool = mha_host_pool()
    names = keys(1)
    rank0 = backend(storage_config(fs_tier, tp_size=2), pool)
    assert rank0.batch_set_v1(names, indices(pool, [0])) == [True]
    rank1 = backend(storage_config(fs_tier, tp_size=2, tp_rank=1), mha_host_pool())
    flat = backend(storage_config(fs_tier, tp_size=2, v1=0), mha_host_pool())
    assert (rank0.batch_exists(names), rank1.batch_exists(names), flat.batch_exists(names)) == (1, 0, 0)
    for made in (rank0, rank1, flat):
        made.close()


def test_c27_hybrid_extra_pool_is_refused(fs_tier: list[dict[str, Any]]) -> None:
    pool = mha_host_pool()
    made = backend(storage_config(fs_tier), pool)
    made.register_mem_host_pool_v2(pool, "kv")  # SGLang re-registers the anchor KV pool: accepted
    with pytest.raises(ValueError, match=r"extra host pool 'mamba'.*hybrid model is not supported"):
        made.register_mem_host_pool_v2(mha_host_pool(), "mamba")
    assert made.batch_set_v1(keys(1), indices(pool, [0])) == [False]
    assert made.batch_exists(keys(1)) == 0
    made.close()


def test_flat_page_interface_round_trips(fs_tier: list[dict[str, Any]]) -> None:
    pool = mha_host_pool()
    made = backend(storage_config(fs_tier, v1=0), pool)
    names = keys(2)
    assert made.batch_set(names, [pool.get_data_page(i * pool.page_size) for i in (1, 2)])
    assert made.exists(names[0]) and made.batch_exists(names) == 2
    out = made.batch_get(names + keys(1), [pool.get_dummy_flat_data_page() for _ in range(3)])
    assert out[2] is None and torch.equal(out[0], pool.get_data_page(pool.page_size))
    assert made.batch_get_v1(names, indices(pool, [0, 1])) == [False, False]  # not this namespace's interface
    made.close()


def test_concurrent_calls_share_a_small_staging_buffer(fs_tier: list[dict[str, Any]]) -> None:
    pool = mha_host_pool(pages=32)
    config = storage_config(fs_tier)
    extra = dict(config.extra_config or {})
    extra["tiering"] = {**extra["tiering"], "cpu_bytes_to_use": 2 * 2 * 3 * 4 * 2 * 8 * 2}  # 2 pages
    made = backend(dataclasses.replace(config, extra_config=extra), pool)
    assert made.stack is not None and made.stack.staging.slots == 2
    groups = [keys(4) for _ in range(4)]
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            pages = [4 * n + i for i in range(4)]
            assert made.batch_set_v1(groups[n], indices(pool, pages)) == [True] * 4
            assert made.batch_get_v1(groups[n], indices(pool, [16 + p for p in pages])) == [True] * 4
            assert all(page_bytes_of(pool, 16 + p) == page_bytes_of(pool, p) for p in pages)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and made.stack.staging.free_slots() == 2
    made.close()


def test_page_methods_come_from_sglang_source() -> None:
    methods = sglang_methods("pool_host/mha.py", "MHATokenToKVPoolHost", ("get_page_buffer_meta",))
    assert methods["get_page_buffer_meta"].__code__.co_filename.endswith("sglang/srt/mem_cache/pool_host/mha.py")


def test_a_call_of_128_pages_runs_in_staging_chunks(fs_tier: list[dict[str, Any]]) -> None:
    pool = mha_host_pool(pages=260, page_size=2, layers=2, heads=1, head_dim=8)
    made = backend(storage_config(fs_tier), pool)
    assert made.stack is not None and made.stack.staging.slots == 64  # the default: 64 pages
    names = keys(128)
    assert made.batch_set_v1(names, indices(pool, list(range(128)))) == [True] * 128
    assert made.batch_exists(names) == 128
    assert made.batch_get_v1(names, indices(pool, list(range(130, 258)))) == [True] * 128
    assert all(page_bytes_of(pool, 130 + p) == page_bytes_of(pool, p) for p in range(128))
    assert made.stack.staging.free_slots() == 64
    made.close()


# -- clear and get_stats, through SGLang's own callers ------------------------------------------------
def clear_through_sglang(made: TieringHiCacheStorage) -> bool:
    """SGLang's ``HybridCacheController.clear_storage_backend`` (what its flush of L3 runs) on our backend.

    Compiled from SGLang's source: the controller's module imports SGLang's CUDA kernel packages.
    """
    import logging

    method = sglang_methods(
        "hybrid_cache/hybrid_cache_controller.py",
        "HybridCacheController",
        ("clear_storage_backend",),
        {"logger": logging.getLogger("sglang-controller")},
    )["clear_storage_backend"]
    return bool(method(types.SimpleNamespace(enable_storage=True, storage_backend=made)))


def test_clear_removes_this_namespace_only_and_the_backend_works_after(fs_tier: list[dict[str, Any]]) -> None:
    pool = mha_host_pool()
    made = backend(storage_config(fs_tier), pool)
    other = backend(storage_config(fs_tier, tp_size=2, tp_rank=1), mha_host_pool())  # another namespace, same root
    names, others = keys(3), keys(2)
    assert made.batch_set_v1(names, indices(pool, [0, 1, 2])) == [True] * 3
    assert other.batch_set_v1(others, indices(other.mem_pool_host, [0, 1])) == [True] * 2
    digest = made.spec.namespace.digest  # type: ignore[union-attr]
    root = Path(fs_tier[0]["root"])
    assert len([p for p in (root / digest).rglob("*") if p.is_file()]) > 3  # 3 blocks and the namespace file
    assert clear_through_sglang(made) is True
    assert made.batch_exists(names) == 0
    assert not [p for p in (root / digest).rglob("*") if p.is_file() and p.name != "namespace.json"]
    assert other.batch_exists(others) == 2  # another rank's pages stay
    # The tiers restarted: stores and loads work again.
    assert made.batch_set_v1(names[:1], indices(pool, [3])) == [True]
    assert made.batch_get_v1(names[:1], indices(pool, [4])) == [True]
    assert page_bytes_of(pool, 4) == page_bytes_of(pool, 3)
    for backend_ in (made, other):
        backend_.close()


def test_clear_with_mla_removes_rank_zero_pages_and_no_rank_answers_from_a_stale_index(
    fs_tier: list[dict[str, Any]],
) -> None:
    pools = [mla_host_pool() for _ in range(2)]
    ranks = [backend(storage_config(fs_tier, is_mla_model=True, tp_rank=r, tp_size=2), pools[r]) for r in (0, 1)]
    names = keys(2)
    assert ranks[0].batch_set_v1(names, indices(pools[0], [0, 1])) == [True, True]
    assert ranks[1].batch_exists(names) == 2
    assert [made.clear() for made in ranks] == [True, True]
    assert [made.batch_exists(names) for made in ranks] == [0, 0]
    for made in ranks:
        made.close()


def test_clear_waits_for_calls_in_flight_and_calls_during_it_answer_lists(fs_tier: list[dict[str, Any]]) -> None:
    pool = mha_host_pool(pages=32)
    made = backend(storage_config(fs_tier), pool)
    names = keys(8)
    assert made.batch_set_v1(names, indices(pool, list(range(8)))) == [True] * 8
    answers: list[Any] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            answers.append(made.batch_get_v1(names, indices(pool, list(range(16, 24)))))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(3):
            assert made.clear() is True
            assert made.batch_set_v1(names, indices(pool, list(range(8)))) == [True] * 8
    finally:
        stop.set()
        thread.join(60)
    assert answers and all(isinstance(a, list) and len(a) == 8 and set(a) <= {True, False} for a in answers)
    assert made.stack is not None and made.stack.staging.free_slots() == made.stack.staging.slots
    made.close()


def test_clear_before_register_or_on_a_refused_model_says_false(fs_tier: list[dict[str, Any]]) -> None:
    made = TieringHiCacheStorage(storage_config(fs_tier), {})
    assert made.clear() is False
    pool = mha_host_pool()
    made = backend(storage_config(fs_tier), pool)
    with pytest.raises(ValueError, match="hybrid"):
        made.register_mem_host_pool_v2(mha_host_pool(), "mamba")
    assert made.clear() is False
    made.close()
    made = backend(storage_config(fs_tier), pool)
    made.close()
    assert made.clear() is False and made.stack is None  # a closed backend stays closed


def test_get_stats_gives_sglang_storage_metrics_per_call(
    fs_tier: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage_metrics, log_storage_metrics = sglang_storage_metrics()
    module = types.ModuleType("sglang.srt.observability.metrics_collector")
    module.StorageMetrics = storage_metrics  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)  # the real module needs transformers
    pool = mha_host_pool()
    assert backend(storage_config(fs_tier), pool).get_stats() is None  # metrics off: SGLang never asks
    made = backend(storage_config(fs_tier, enable_storage_metrics=True), pool)
    names = keys(3)
    assert made.batch_set_v1(names, indices(pool, [0, 1, 2])) == [True] * 3
    assert made.batch_get_v1(names + keys(1), indices(pool, [4, 5, 6, 7])) == [True, True, True, False]
    stats = made.get_stats()
    assert isinstance(stats, storage_metrics)
    assert (stats.backup_pgs, stats.prefetch_pgs) == ([3], [4])
    assert len(stats.backup_bandwidth) == 1 and stats.backup_bandwidth[0] > 0
    assert len(stats.prefetch_bandwidth) == 1 and stats.prefetch_bandwidth[0] > 0
    empty = made.get_stats()
    assert (empty.backup_pgs, empty.prefetch_pgs, empty.backup_bandwidth, empty.prefetch_bandwidth) == ([], [], [], [])
    # SGLang's collector takes it (it asserts the type and logs each value into its histogram).
    logged: list[tuple[str, float]] = []
    names = ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")
    collector = types.SimpleNamespace(
        **{f"histogram_{n}": n for n in names}, _log_histogram=lambda name, value: logged.append((name, value))
    )
    log_storage_metrics(collector, stats)
    assert sorted(n for n, _ in logged) == sorted(names) and ("backup_pgs", 3) in logged
    made.close()

"""SGLang 0.5.23's own storage-backend tests (its Mooncake store tests) against this backend (hatch env ``sglang``).

``sglang/srt/mem_cache/storage/mooncake_store/test_mooncake_store.py`` ships in
SGLang's wheel. It is run here from SGLang's installed source, its test
functions and helpers unchanged, with only the backend's construction
changed. The changes, each needed because of what is not installed or not
ours, and nothing else:

1. ``from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore``
   is not run (that module imports transformers and Mooncake's client);
   ``MooncakeStore(config)`` builds :class:`TieringHiCacheStorage` instead,
   from the same ``HiCacheStorageConfig`` with an ``extra_config`` naming our
   tiers (Mooncake reads its servers from its own config file; we read our
   tiers from the extra config). The test then calls
   ``register_mem_pool_host`` itself, as with Mooncake.
2. ``logging.basicConfig(...)`` at module level is not run: it would
   reconfigure pytest's root logger.
3. The ``if __name__ == "__main__":`` block is not run: its calls (the
   single-operation test and the batch test under four configurations) are
   the parametrized cases below, with the same arguments.

Each runs over fs, s3 (a moto server) and redis (a local redis-server), and
the single-operation test under ``interface_v1`` 1 and 0 (Mooncake's address
calls are taken under either). The other storage tests of SGLang's tree are
not backend-interface tests or need their own clients; docs/content/sglang.md
lists each with the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory", reason="needs SGLang (hatch env sglang)")

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

from tiering.sglang.storage import TieringHiCacheStorage

MOONCAKE_TEST = ("srt", "mem_cache", "storage", "mooncake_store", "test_mooncake_store.py")
BACKEND_IMPORT = "MooncakeStore"
MODULE = {
    "backend_name": "tiering",
    "module_path": "tiering.sglang.storage",
    "class_name": "TieringHiCacheStorage",
}


def _is_basic_config(node: ast.stmt) -> bool:
    call = node.value if isinstance(node, ast.Expr) else None
    func = call.func if isinstance(call, ast.Call) else None
    return isinstance(func, ast.Attribute) and func.attr == "basicConfig"


def _is_main_block(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def _imports_backend(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and any(alias.name == BACKEND_IMPORT for alias in node.names)


def sglang_test_module(backend: Any) -> dict[str, Any]:
    """SGLang's Mooncake test module from its installed source, with ``MooncakeStore`` -> ``backend`` (see above)."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin is not None
    path = os.path.join(os.path.dirname(spec.origin), *MOONCAKE_TEST)
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    dropped = [n for n in tree.body if _imports_backend(n) or _is_basic_config(n) or _is_main_block(n)]
    assert len(dropped) == 3, f"SGLang's test changed shape: {len(dropped)} of the 3 statements to replace found"
    body = [n for n in tree.body if n not in dropped]
    namespace: dict[str, Any] = {"__name__": "sglang_mooncake_test", BACKEND_IMPORT: backend}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def moto() -> Any:
    pytest.importorskip("moto.server")
    s3_testing = pytest.importorskip("tiering.s3.testing")
    with s3_testing.moto_server("sglang-own") as server:
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


def module_over(tiers: list[dict[str, Any]], interface_v1: int, made: list[TieringHiCacheStorage]) -> dict[str, Any]:
    """SGLang's test module whose ``MooncakeStore(config)`` is our backend over ``tiers``."""

    def backend(config: HiCacheStorageConfig) -> TieringHiCacheStorage:
        extra = {**MODULE, "interface_v1": interface_v1, "tiering": {"secondary_tiers": tiers}}
        store = TieringHiCacheStorage(dataclasses.replace(config, extra_config=extra), {})
        made.append(store)
        return store

    return sglang_test_module(backend)


@pytest.fixture
def built() -> Any:
    made: list[TieringHiCacheStorage] = []
    yield made
    for store in made:
        store.close()


KINDS = ["fs", "s3", "redis"]
# The configurations of the test module's __main__ block: (is_mla_model, tp_rank, tp_size).
BATCH_CONFIGS = [(False, 0, 1), (True, 0, 1), (False, 1, 4), (True, 3, 8)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("mla", "rank", "size"), BATCH_CONFIGS)
def test_sglang_mooncake_test_batch_operation(
    kind: str, mla: bool, rank: int, size: int, tmp_path: Path, request: pytest.FixtureRequest, built: list[Any]
) -> None:
    module = module_over(tier_entries(kind, tmp_path, request), 1, built)
    module["test_batch_operation"](module["make_hicache_storage_config"](is_mla_model=mla, tp_rank=rank, tp_size=size))
    assert len(built) == 1 and built[0].stack is not None  # it ran against our backend, built once


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("interface_v1", [1, 0])
def test_sglang_mooncake_test_single_operation(
    kind: str, interface_v1: int, tmp_path: Path, request: pytest.FixtureRequest, built: list[Any]
) -> None:
    module = module_over(tier_entries(kind, tmp_path, request), interface_v1, built)
    module["test_single_operation"]()
    assert len(built) == 1 and built[0].stack is not None


def test_the_module_runs_our_backend_and_its_assertions_can_fail(tmp_path: Path, built: list[Any]) -> None:
    # The same module over a backend that stores nothing (its tier stack closed): SGLang's assertions fail.
    module = module_over([{"type": "fs", "root": str(tmp_path / "kv")}], 1, built)
    real = module[BACKEND_IMPORT]

    def broken(config: HiCacheStorageConfig) -> TieringHiCacheStorage:
        store = real(config)
        original = store.register_mem_pool_host

        def register(pool: Any) -> None:
            original(pool)
            store.close()  # every call now answers as a failure

        store.register_mem_pool_host = register  # type: ignore[method-assign]
        return store

    module["test_batch_operation"].__globals__[BACKEND_IMPORT] = broken
    with pytest.raises(AssertionError, match="batch set operation failed"):
        module["test_batch_operation"](module["make_hicache_storage_config"](is_mla_model=False, tp_rank=0, tp_size=1))

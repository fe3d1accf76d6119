"""Tenants: keys scoped per tenant, the vLLM tenant entry, and unambiguous namespace fields."""

from __future__ import annotations

import hashlib

import pytest

from tiering.core import CPUPrimaryTier, LRUCachePolicy, ReqContext, TieringManager
from tiering.core.base import OffloadKey, block_view
from tiering.core.fields import length_prefixed, structured
from tiering.core.keys import block_keys
from tiering.core.policies.tenancy import MARK, TAG_BYTES, tag_of, tenant_tag
from tiering.core.policies.tenants import (
    MAX_TENANT_CHARS,
    caller_allocation,
    scope_key,
    scope_keys,
    tenant_from_params,
)
from tiering.core.primary import Allocation
from tiering.core.spec import Namespace
from tiering.testing import block_payload

BLOCK = 1024
ENGINE_KEY = OffloadKey(bytes(range(32)) + (0).to_bytes(4, "big"))


# -- known answers: these bytes name stored blocks; a change is a namespace change ----------------


def test_scope_key_known_answer() -> None:
    assert scope_key("acme", OffloadKey(b"\x01" * 32)).hex() == (
        "f7746e1e" + "5fe6ca12ed9ea369a0f98649b5c69937" + "01" * 32  # mark, acme's 16-byte tag, the key
    )


def test_length_prefixed_known_answer() -> None:
    assert length_prefixed(b"ab", b"").hex() == "02000000000000006162" + "0000000000000000"


def test_namespace_digest_known_answer_is_unchanged_by_tenants() -> None:
    # Stores made before tenants existed stay readable: the default tenant's namespace digest did not move.
    assert Namespace("m", "r", "bfloat16", "opaque", 16, 65536).digest == "d2c6977f1ad99b683ad6448ab61cdd21"


def test_structured_known_answer() -> None:
    assert structured({"engine": "x", "tp": "1of2", "n": 3}) == '{"engine":"x","tp":"1of2","n":3}'


# -- field splits that plain concatenation confuses ----------------------------------------------


def test_tenant_and_key_splits_differ() -> None:
    plain = [hashlib.sha256(t.encode() + k).digest() for t, k in (("ab", b"c"), ("a", b"bc"))]
    assert plain[0] == plain[1]  # what joining the fields would have given
    one, two = scope_key("ab", OffloadKey(b"c")), scope_key("a", OffloadKey(b"bc"))
    assert one != two  # the tenant is a fixed-length tag after a fixed mark: the key starts at the same byte
    assert (tag_of(one), tag_of(two)) == (tenant_tag("ab"), tenant_tag("a"))
    assert one[len(MARK) + TAG_BYTES :] == b"c" and two[len(MARK) + TAG_BYTES :] == b"bc"
    assert length_prefixed(b"ab", b"c") != length_prefixed(b"a", b"bc")


def test_namespace_field_splits_differ() -> None:
    one = Namespace("ab", "c", "bfloat16", "opaque", 16, 65536)
    two = Namespace("a", "bc", "bfloat16", "opaque", 16, 65536)
    assert one.digest != two.digest


def test_structured_fields_holding_separators_differ() -> None:
    # joined as "k=v" with "," the two would read the same: "layout=a,engine=vllm"
    one = structured({"layout": "a,engine=vllm"})
    two = structured({"layout": "a", "engine": "vllm"})
    assert one != two
    with pytest.raises(TypeError, match="'layout'"):
        structured({"layout": None})  # type: ignore[dict-item]


def test_default_tenant_keeps_engine_keys() -> None:
    assert scope_key("", ENGINE_KEY) is ENGINE_KEY
    assert scope_keys("", [ENGINE_KEY]) == [ENGINE_KEY]
    scoped = scope_keys("t", [ENGINE_KEY, ENGINE_KEY])
    assert scoped[0] == scoped[1] == MARK + tenant_tag("t") + ENGINE_KEY
    assert scope_key("t", ENGINE_KEY) != scope_key("u", ENGINE_KEY)


# -- where a request's tenant comes from -----------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "tenant"),
    [(None, ""), ({}, ""), ({"tenant": None}, ""), ({"other": 1}, ""), ({"tenant": "acme"}, "acme")],
)
def test_tenant_from_vllm_params(params: dict[str, object] | None, tenant: str) -> None:
    assert tenant_from_params(params) == tenant


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (5, "kv_transfer_params['tenant'] must be a string, got int '5'"),
        (["a"], "must be a string, got list"),
        ("x" * (MAX_TENANT_CHARS + 1), f"is {MAX_TENANT_CHARS + 1} characters long, at most {MAX_TENANT_CHARS}"),
    ],
)
def test_bad_vllm_tenant_is_named(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        tenant_from_params({"tenant": value})


def test_req_context_refuses_a_tenant_that_is_not_a_str() -> None:
    with pytest.raises(TypeError, match="request 'r': tenant must be a str, got int"):
        ReqContext("r", tenant=3)  # type: ignore[arg-type]


def test_caller_allocation_names_the_callers_keys() -> None:
    keys = [OffloadKey(b"a"), OffloadKey(b"b"), OffloadKey(b"c")]
    scoped = scope_keys("t", keys)
    other = scope_key("u", OffloadKey(b"z"))
    alloc = Allocation([scoped[0]], [4], [scoped[1]], [scoped[2]], [other])
    out = caller_allocation("t", alloc, scoped, keys)
    assert (out.keys, out.block_ids, out.present, out.rejected, out.evicted) == (
        [keys[0]],
        [4],
        [keys[1]],
        [keys[2]],
        [other],
    )
    assert caller_allocation("", alloc, keys, keys) is alloc  # the default tenant's engine keys are their stored form


# -- the manager: the primary tier is shared, its blocks are not ----------------------------------


def _manager() -> TieringManager:
    return TieringManager(CPUPrimaryTier(16, BLOCK, LRUCachePolicy(16)))


def _store(manager: TieringManager, keys: list[OffloadKey], ctx: ReqContext) -> Allocation:
    alloc = manager.prepare_store(keys, ctx)
    for key, slot in zip(alloc.keys, alloc.block_ids, strict=True):
        block_view(manager.primary.kv_view, slot)[:] = block_payload(ctx.tenant.encode() + key, BLOCK)
    manager.complete_store(alloc.keys, ctx)
    return alloc


def test_identical_prompts_of_two_tenants_never_share_primary_blocks() -> None:
    manager = _manager()
    keys = block_keys(list(range(64)), 16)
    a, b, default = ReqContext("a", tenant="a"), ReqContext("b", tenant="b"), ReqContext("d")
    first = _store(manager, keys, a)
    assert first.keys == keys and not first.present  # the allocation names the caller's keys
    assert manager.lookup(keys, a) == 4
    assert manager.lookup(keys, b) == 0 and manager.lookup(keys, default) == 0
    second = _store(manager, keys, b)  # b stores its own copy: nothing of a's is "present" to it
    assert second.keys == keys and not second.present
    assert manager.lookup(keys, b) == 4 and manager.lookup(keys, default) == 0
    assert _store(manager, keys, a).present == keys  # a's blocks are still a's
    manager.prepare_load(keys, b)
    (result,) = manager.get_finished()
    assert result.keys == keys  # reported under the caller's keys
    rows = [block_view(manager.primary.kv_view, slot).tobytes() for slot in result.block_ids]
    assert rows == [block_payload(b"b" + key, BLOCK) for key in keys]
    manager.complete_load(b)
    manager.on_request_finished(b)


def test_harness_jobs_carry_the_tenant_and_scoped_keys() -> None:
    from tiering.testing.harness import load_job, store_job

    assert store_job([ENGINE_KEY], [0], tenant="a").req_context.tenant == "a"
    assert load_job([ENGINE_KEY], [0]).req_context.tenant == ""
    assert store_job([ENGINE_KEY], [0], tenant="a").keys == [scope_key("a", ENGINE_KEY)]  # as the manager's
    assert load_job([ENGINE_KEY], [0], tenant="a").keys == [scope_key("a", ENGINE_KEY)]
    assert load_job([ENGINE_KEY], [0]).keys == [ENGINE_KEY]

"""Per-tenant quotas and TTL in the capacity index (pure unit tests of tiering.core.policies.tenancy)."""

import pytest

from tiering.core.base import OffloadKey, ReqContext
from tiering.core.format import MAX_KEY_BYTES
from tiering.core.policies import tenancy
from tiering.core.policies.tenancy import (
    MARK,
    TAG_BYTES,
    TENANTS_KEY,
    TenantLimits,
    TenantPolicy,
    scope_key,
    tag_of,
    tenant_tag,
)
from tiering.core.schema import ConfigSchema, InvalidValueError
from tiering.core.store.index import Admit, CapacityIndex, KeyState

A, B = ReqContext("r", tenant="a"), ReqContext("r", tenant="b")


def key(i, ctx, policy):
    """The key the manager hands a tier for block ``i`` of ``ctx``'s tenant; ``policy`` notes the tenant's name."""
    policy.note(ctx.tenant)  # as a tier does for each store
    return scope_key(ctx.tenant, OffloadKey(i.to_bytes(4, "big") * 8))


def store(index, k, size=100):
    res = index.reserve(k, size)
    index.deleted_many([(v.key, True) for v in res.victims])
    if res.admit is Admit.RESERVED:
        index.commit(k, True)
    return res


def test_tags_are_per_tenant_and_read_back_from_the_key():
    policy = TenantPolicy(TenantLimits())
    raw = OffloadKey(b"k" * 32)
    ka, kb = scope_key("a", raw), scope_key("b", raw)
    assert ka != kb and ka == MARK + tenant_tag("a") + raw and len(tenant_tag("a")) == TAG_BYTES == 16
    assert tag_of(ka) == tenant_tag("a") and tag_of(kb) == tenant_tag("b") and tag_of(raw) == b""
    assert scope_key("", raw) is raw  # the default tenant keeps its plain key
    assert policy.name(tag_of(ka)) == "tag:" + tenant_tag("a").hex() and policy.name(b"") == ""
    policy.note("a")  # a tier saw a request of tenant a
    assert policy.name(tag_of(ka)) == "a" == policy.without_quotas().name(tag_of(ka))
    assert TenantPolicy(TenantLimits(), {"b": TenantLimits()}).name(tag_of(kb)) == "b"  # named by the config


def test_names_learned_from_requests_are_bounded(monkeypatch):
    monkeypatch.setattr(tenancy, "MAX_NOTED_NAMES", 2)
    policy = TenantPolicy(TenantLimits(), {"cfg": TenantLimits()})
    for tenant in ("x", "y", "cfg", "", "z"):  # config names and the default tenant take no room
        policy.note(tenant)
    names = [policy.name(tenant_tag(t)) for t in ("x", "y", "z", "cfg", "")]
    assert names == ["tag:" + tenant_tag("x").hex(), "y", "z", "cfg", ""]  # the oldest noted name forgotten


def test_a_key_too_long_for_the_tag_is_replaced_by_its_digest():
    long_key, other = OffloadKey(b"x" * MAX_KEY_BYTES), OffloadKey(b"x" * (MAX_KEY_BYTES - 1) + b"y")
    scoped = scope_key("a", long_key)
    assert len(scoped) == MAX_KEY_BYTES and tag_of(scoped) == tenant_tag("a")
    assert scoped != scope_key("a", other) and scoped == scope_key("a", long_key)
    fits = OffloadKey(b"z" * (MAX_KEY_BYTES - len(MARK) - TAG_BYTES))
    assert scope_key("a", fits) == MARK + tenant_tag("a") + fits  # the longest key kept as it is


def test_config_parses_sizes_and_inherits_default():
    policy = TenantPolicy.from_config(
        {"default": {"quota_bytes": "1KiB", "ttl_s": 60}, "overrides": {"acme": {"quota_bytes": 5000}}}
    )
    assert policy.limits(tenant_tag("acme")) == TenantLimits(5000, 60.0)
    assert policy.limits(tenant_tag("other")) == TenantLimits(1024, 60.0)
    assert TenantPolicy.from_config(None) is None


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"default": {"quota_bytes": "lots"}}, "default.quota_bytes"),
        ({"overrides": {"acme": {"ttl_s": -1}}}, "overrides.acme.ttl_s"),
        ({"overrides": {"acme": {"quota": 1}}}, "overrides.acme.quota"),
        ({"defaults": {}}, "defaults is not a key"),
    ],
)
def test_check_names_the_offending_field(value, named):
    schema = ConfigSchema("fs", [TENANTS_KEY])
    with pytest.raises(InvalidValueError) as err:
        schema.validate({"tenants": value}, entry="secondary_tiers[0]")
    assert str(err.value).startswith("secondary_tiers[0].tenants: ") and named in str(err.value)


def test_tenant_at_quota_evicts_only_its_own_lru_blocks():
    policy = TenantPolicy(TenantLimits(), {"a": TenantLimits(quota_bytes=300)})
    index = CapacityIndex(10_000, policy)
    bs = [key(i, B, policy) for i in range(5)]
    as_ = [key(i, A, policy) for i in range(6)]
    for k in bs[:2] + as_[:3] + bs[2:]:  # b's oldest blocks are the global LRU ones
        assert store(index, k).admit is Admit.RESERVED
    index.lookup(as_[0])  # a's block 0 used again: a's block 1 is now a's LRU
    res = store(index, as_[3])
    assert [v.key for v in res.victims] == [as_[1]]
    assert all(index.lookup(k) is KeyState.RESIDENT for k in bs)
    s = index.stats()
    assert (s["tenant:a:resident_bytes"], s["tenant:a:resident_blocks"], s["tenant:b:resident_blocks"]) == (300, 3, 5)
    assert s["quota_evictions"] == s["tenant:a:quota_evictions"] == 1 and s["evictions"] == 1


def test_writes_in_flight_count_against_the_quota():
    policy = TenantPolicy(TenantLimits(quota_bytes=200))
    index = CapacityIndex(None, policy)
    ks = [key(i, A, policy) for i in range(3)]
    assert [index.reserve(k, 100).admit for k in ks[:2]] == [Admit.RESERVED] * 2
    refused = index.reserve(ks[2], 100)
    assert refused.admit is Admit.NO_SPACE and refused.can_wait and refused.victims == ()
    index.commit_many([(ks[0], True), (ks[1], False)])
    assert store(index, ks[2]).admit is Admit.RESERVED
    assert index.stats()["tenant:a:reserved_bytes"] == 0


def test_expired_block_is_a_miss_handed_out_once_for_deletion():
    now = [1000.0]
    policy = TenantPolicy(TenantLimits(), {"a": TenantLimits(ttl_s=10)})
    index = CapacityIndex(None, policy)
    index.tenants.clock = lambda: now[0]
    ka, kb = key(1, A, policy), key(1, B, policy)
    store(index, ka)
    store(index, kb)
    now[0] += 9.9
    assert index.lookup(ka) is KeyState.RESIDENT
    now[0] += 0.2
    assert index.lookup(ka) is KeyState.DELETING and index.lookup(kb) is KeyState.RESIDENT
    victims = index.take_expired()
    assert [v.key for v in victims] == [ka] and index.take_expired() == []
    assert index.used_bytes == 200  # counted until the delete is reported
    index.deleted(ka, True)
    assert index.lookup(ka) is KeyState.ABSENT and index.used_bytes == 100
    assert index.stats()["tenant:a:expirations"] == 1


def test_reconcile_restores_tenant_usage_and_age():
    now = [5000.0]
    policy = TenantPolicy(TenantLimits(quota_bytes=250, ttl_s=100))
    index = CapacityIndex(None, policy)
    index.tenants.clock = lambda: now[0]
    old, fresh = key(1, A, policy), key(2, A, policy)
    found = {old: 100, fresh: 100, key(3, B, policy): 100}
    report = index.reconcile(found, index.ticket(), born={old: now[0] - 200, fresh: now[0] - 50})
    assert len(report.added) == 3
    s = index.stats()
    assert (s["tenant:a:resident_bytes"], s["tenant:b:resident_bytes"]) == (200, 100)
    victims = index.evict_to_cap()  # the scan's sweep: the expired block goes
    assert [v.key for v in victims] == [old] and index.stats()["expirations"] == 1
    index.deleted(old, True)
    assert store(index, key(4, A, policy)).victims == ()  # 200 of 250 used again
    assert [v.key for v in store(index, key(5, A, policy)).victims] == [fresh]


def test_store_of_an_expired_key_replaces_it_instead_of_counting_it_present():
    now = [0.0]
    policy = TenantPolicy(TenantLimits(ttl_s=10))
    index = CapacityIndex(None, policy)
    index.tenants.clock = lambda: now[0]
    ka = key(1, A, policy)
    store(index, ka)
    now[0] = 11.0
    res = index.reserve(ka, 100)
    assert res.admit is Admit.DELETING and res.can_wait and [v.key for v in res.victims] == [ka]
    index.deleted(ka, True)
    assert store(index, ka).admit is Admit.RESERVED and index.lookup(ka) is KeyState.RESIDENT
    assert index.stats()["expirations"] == 1

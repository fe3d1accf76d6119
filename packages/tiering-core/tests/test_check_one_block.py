"""The one refusal of byte bounds below one stored block, and the note on decimal size units."""

import pytest

from tiering.core.declared import check_one_block, tenant_quotas
from tiering.core.schema import InvalidValueError
from tiering.core.units import decimal_unit_note


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"capacity_bytes": 4095}, "capacity_bytes"),
        ({"capacity_bytes": 0}, "capacity_bytes"),
        ({"capacity_bytes": "1KiB"}, "capacity_bytes"),
        ({"max_pinned_bytes": 1}, "max_pinned_bytes"),
        ({"tenants": {"default": {"quota_bytes": "2KiB"}}}, "tenants.default.quota_bytes"),
        ({"tenants": {"overrides": {"a": {"ttl_s": 5}, "b": {"quota_bytes": 10}}}}, "tenants.overrides.b.quota_bytes"),
    ],
)
def test_a_bound_below_one_stored_block_is_refused_naming_the_key(entry, key):
    with pytest.raises(InvalidValueError) as info:
        check_one_block("fs", entry, 4096, "secondary_tiers[2]")
    assert info.value.key == key
    assert str(info.value).startswith(f"secondary_tiers[2].{key}: ")
    assert "is smaller than one stored block (4096 bytes)" in str(info.value)


@pytest.mark.parametrize(
    "entry",
    [
        {},
        {"capacity_bytes": None, "max_pinned_bytes": 0, "tenants": None},
        {"capacity_bytes": 4096, "max_pinned_bytes": "4KiB", "tenants": {"default": {"quota_bytes": 0}}},
        {"tenants": {"default": {"quota_bytes": None, "ttl_s": 60}}},
        {"capacity_bytes": "not a size"},  # the schema's to refuse, with its own message
    ],
)
def test_bounds_of_one_block_or_off_pass(entry):
    check_one_block("fs", entry, 4096)


def test_tenant_quotas_lists_every_written_quota_in_bytes():
    tenants = {"default": {"quota_bytes": "1MiB"}, "overrides": {"a": {"ttl_s": 1}, "b": {"quota_bytes": 7}}}
    assert list(tenant_quotas(tenants)) == [("default.quota_bytes", 1 << 20), ("overrides.b.quota_bytes", 7)]
    assert list(tenant_quotas(None)) == []
    assert list(tenant_quotas({"default": "bad"})) == []


def test_decimal_unit_note_gives_the_bytes_the_binary_unit_and_the_integer_to_write():
    assert decimal_unit_note("4GB") == (
        "'4GB' is 4000000000 bytes (3.7 GiB: GB is a power of 1000); for 4 GiB write \"4GiB\" or 4294967296"
    )
    assert decimal_unit_note("500k") == (
        "'500k' is 500000 bytes (488.3 KiB: KB is a power of 1000); for 500 KiB write \"500KiB\" or 512000"
    )
    assert decimal_unit_note("4GiB") is None
    assert decimal_unit_note("65536") is None
    assert decimal_unit_note("lots") is None


def test_a_tier_without_a_schema_lists_the_admission_keys_as_accepted():
    from tiering.core.factory import check_tier_keys

    class Plain:
        def __init__(self, offloading_spec, primary_kv_view, tier_type, depth=1):
            pass

    with pytest.raises(
        TypeError, match=r"unknown key 'admision' .*; accepted keys: admission, admission_sketch_bytes, depth$"
    ):
        check_tier_keys(Plain, {"admision": "always"}, "secondary_tiers[0]")


def test_every_duration_takes_plain_seconds_or_a_unit():
    from tiering.core.units import parse_duration

    assert [parse_duration(t) for t in ("90", "90s", "1.5", "30m", "1h", "7d")] == [90, 90, 1.5, 1800, 3600, 604800]
    with pytest.raises(ValueError, match=r"duration '1x' is not plain seconds \(90\) or a number with a unit"):
        parse_duration("1x")

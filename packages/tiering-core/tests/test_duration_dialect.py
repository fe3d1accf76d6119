"""A tier key declared ``duration=True`` takes plain seconds or a duration with a unit, as a tenant's ``ttl_s``."""

import pytest

from tiering.core.policies.tenancy import TenantPolicy
from tiering.core.schema import ConfigKey, ConfigSchema, InvalidTypeError, InvalidValueError

SCHEMA = ConfigSchema(
    "t",
    [
        ConfigKey("ttl_s", (int,), nullable=True, minimum=1, duration=True),
        ConfigKey("wait_s", (float,), default=1.0, minimum=0, duration=True),
    ],
)


@pytest.mark.parametrize("value, seconds", [(600, 600), ("600", 600), ("10m", 600), ("1h", 3600), ("1.5m", 90)])
def test_whole_seconds_are_an_integer_in_either_form_as_a_tenants_ttl(value, seconds):
    got = SCHEMA.validate({"ttl_s": value})["ttl_s"]
    assert got == seconds and type(got) is int
    policy = TenantPolicy.from_config({"default": {"ttl_s": value}})
    assert policy is not None and policy.default.ttl_s == seconds  # the same answer as a tenant's TTL


def test_a_float_key_takes_a_fraction_and_bounds_apply_after_the_unit():
    assert SCHEMA.validate({"wait_s": "1.5s"})["wait_s"] == 1.5
    assert SCHEMA.validate({"wait_s": "2m"})["wait_s"] == 120.0
    with pytest.raises(InvalidValueError, match=r"ttl_s: must be an integer >= 1 \(seconds\) or a duration"):
        SCHEMA.validate({"ttl_s": "0s"})


@pytest.mark.parametrize("bad", ["soon", "1.5s", "-1h"])
def test_a_bad_duration_names_the_key_and_both_forms(bad):
    with pytest.raises(InvalidValueError) as info:
        SCHEMA.validate({"ttl_s": bad})
    assert (
        f"ttl_s: must be an integer >= 1 (seconds) or a duration with a unit (e.g. '90s', '30m', '1h', '7d') "
        f"or null, got {bad!r}" in str(info.value)
    )


def test_a_key_without_the_flag_still_refuses_a_unit():
    schema = ConfigSchema("t", [ConfigKey("n", (int,), minimum=1)])
    with pytest.raises(InvalidTypeError, match="n: must be an integer >= 1, got '1h'"):
        schema.validate({"n": "1h"})


def test_every_seconds_key_of_every_installed_tier_takes_a_duration():
    """A key in seconds (named ``*_s`` or documented as seconds) reads "30s" / "2m" like any other, in every tier."""
    from tiering.core.factory import SecondaryTierFactory

    seconds_keys = {
        f"{name}.{key.name}": key.duration
        for name in SecondaryTierFactory.known_names()
        if (schema := SecondaryTierFactory.get_class(name).config_schema) is not None
        for key in schema.keys.values()
        if (key.name.endswith("_s") and not key.name.endswith("_per_s")) or (key.doc or "").startswith("seconds")
    }
    assert [k for k, duration in seconds_keys.items() if not duration] == []

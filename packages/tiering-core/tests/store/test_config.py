import pickle

import pytest

from tiering.core.schema import (
    ConfigKey,
    ConfigSchema,
    InvalidTypeError,
    InvalidValueError,
    MissingKeyError,
    TierConfigError,
    UnknownKeyError,
)

SCHEMA = ConfigSchema(
    "fs",
    [
        ConfigKey("root", (str,), required=True, non_empty=True),
        ConfigKey("capacity_bytes", (int,), nullable=True, minimum=1),
        ConfigKey("rescan_interval_s", (float,), default=30.0, minimum=0),
        ConfigKey("lookup_fallback", (str,), default="auto", choices=("auto", "stat", "off")),
        ConfigKey("o_direct", (bool, str), default="auto", choices=(True, False, "auto")),
        ConfigKey("password", (str,), nullable=True, secret=True),
        ConfigKey("even", (int,), default=2, check=lambda v: None if v % 2 == 0 else "must be even"),
    ],
)


def test_validate_fills_defaults_and_widens_ints_to_floats():
    out = SCHEMA.validate({"type": "fs", "root": "/x", "rescan_interval_s": 5})
    assert out == {
        "root": "/x",
        "capacity_bytes": None,
        "rescan_interval_s": 5.0,
        "lookup_fallback": "auto",
        "o_direct": "auto",
        "password": None,
        "even": 2,
    }
    assert isinstance(out["rescan_interval_s"], float)


def test_missing_key_names_entry_and_key():
    with pytest.raises(MissingKeyError) as err:
        SCHEMA.validate({}, entry="secondary_tiers[1]")
    assert str(err.value) == "secondary_tiers[1].root: required; expected a non-empty string (tier 'fs')"
    assert isinstance(err.value, ValueError)


def test_unknown_key_is_also_a_type_error():
    with pytest.raises(UnknownKeyError) as err:
        SCHEMA.validate({"root": "/x", "rooot": 1}, entry="secondary_tiers[0]")
    assert str(err.value).startswith("secondary_tiers[0].rooot: unknown key; accepted keys: capacity_bytes,")
    assert isinstance(err.value, TypeError) and isinstance(err.value, TierConfigError)


@pytest.mark.parametrize(
    ("config", "exc", "text"),
    [
        ({"capacity_bytes": "10"}, InvalidTypeError, "capacity_bytes: must be an integer >= 1 or null, got '10'"),
        ({"capacity_bytes": True}, InvalidTypeError, "got true"),
        ({"capacity_bytes": 0}, InvalidValueError, "capacity_bytes: must be an integer >= 1 or null, got 0"),
        ({"rescan_interval_s": -1}, InvalidValueError, "must be a number >= 0, got -1"),
        ({"lookup_fallback": "async"}, InvalidValueError, "must be one of 'auto', 'stat', 'off', got 'async'"),
        ({"o_direct": "yes"}, InvalidValueError, "must be one of true, false, 'auto'"),
        ({"root": ""}, InvalidValueError, "root: must be a non-empty string"),
        ({"root": None}, InvalidTypeError, "root: must be a non-empty string, got null"),
        ({"even": 3}, InvalidValueError, "even: must be even, got 3"),
    ],
)
def test_each_mistake_has_its_own_type(config, exc, text):
    with pytest.raises(exc) as err:
        SCHEMA.validate({"root": "/x", **config})
    assert text in str(err.value)
    assert str(err.value).startswith("tier 'fs': ")


def test_secret_values_never_appear_in_messages():
    with pytest.raises(InvalidTypeError) as err:
        SCHEMA.validate({"root": "/x", "password": 12345678})
    assert "12345678" not in str(err.value)
    assert SCHEMA.secret_keys == {"password"}
    assert SCHEMA.redact({"root": "/x", "password": "hunter2"}) == {"root": "/x", "password": "***"}


def test_with_entry_relabels_and_keeps_type_and_pickles():
    try:
        SCHEMA.validate({"root": "/x", "capacity_bytes": 0})
    except InvalidValueError as exc:
        labelled = exc.with_entry("secondary_tiers[2]")
    assert type(labelled) is InvalidValueError
    assert str(labelled).startswith("secondary_tiers[2].capacity_bytes: ")
    again = pickle.loads(pickle.dumps(labelled))
    assert str(again) == str(labelled) and type(again) is InvalidValueError


def test_schema_rejects_duplicate_and_reserved_names():
    with pytest.raises(ValueError, match="twice: a"):
        ConfigSchema("t", [ConfigKey("a", (int,)), ConfigKey("a", (int,))])
    with pytest.raises(ValueError, match="reserved names: type"):
        ConfigSchema("t", [ConfigKey("type", (str,))])


SIZES = ConfigSchema("t", [ConfigKey("capacity_bytes", (int,), nullable=True, minimum=1, size=True)])


@pytest.mark.parametrize(
    ("given", "expected"),
    [("4GiB", 4 << 30), ("500MB", 500_000_000), ("256 MiB", 256 << 20), ("65536", 65536), (1024, 1024), (None, None)],
)
def test_size_keys_accept_a_unit_and_are_normalized_to_bytes(given, expected):
    assert SIZES.validate({"capacity_bytes": given}) == {"capacity_bytes": expected}
    assert SIZES.parse_sizes({"capacity_bytes": given, "other": "4GiB"}) == {
        "capacity_bytes": expected,
        "other": "4GiB",
    }


def test_a_bad_size_names_the_key_and_shows_what_a_size_looks_like():
    with pytest.raises(InvalidValueError) as err:
        SIZES.validate({"capacity_bytes": "lots"}, entry="secondary_tiers[0]")
    assert str(err.value) == (
        "secondary_tiers[0].capacity_bytes: must be an integer >= 1 (bytes) or a size with a unit "
        "(e.g. '4GiB', '500MB') or null, got 'lots' (tier 't')"
    )
    with pytest.raises(InvalidValueError, match="must be an integer >= 1"):
        SIZES.validate({"capacity_bytes": "0MiB"})


def test_keys_not_declared_size_still_refuse_strings():
    with pytest.raises(InvalidTypeError, match="capacity_bytes: must be an integer >= 1 or null, got '4GiB'"):
        SCHEMA.validate({"root": "/x", "capacity_bytes": "4GiB"})

"""Bounds a config cannot hold: numbers that are not finite, byte bounds under one stored block."""

import json
import math

import pytest

from tiering.cli.main import main
from tiering.core.factory import create_spec
from tiering.core.policies.costmodel import COST_SCHEMA
from tiering.core.primary import allocate_host_buffer
from tiering.core.schema import ConfigKey, ConfigSchema, InvalidValueError
from tiering.testing import requires_tier


def _write(tmp_path, config):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))  # NaN and Infinity written as JSON's readers take them
    return str(path)


NOT_FINITE = [("recompute_tokens_per_s", math.nan), ("recompute_tokens_per_s", math.inf), ("max_load_s", math.nan),
              ("max_load_s", math.inf), ("load_cost_margin", math.inf)]  # fmt: skip


@pytest.mark.parametrize(("key", "value"), NOT_FINITE)
def test_c32_check_and_the_stack_refuse_a_cost_model_number_that_is_not_finite(tmp_path, capsys, key, value):
    config = {"cpu_bytes_to_use": 1 << 20, key: value}
    assert main(["check", _write(tmp_path, config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0] and repr(value) in err[0] and "finite" in err[0]
    with pytest.raises(ValueError, match=key):
        create_spec(config)
    with pytest.raises(InvalidValueError, match=f"{key}: must be a finite number"):
        COST_SCHEMA.validate({key: value})


def test_c32_every_numeric_key_refuses_nan_and_infinities():
    schema = ConfigSchema("t", [ConfigKey("x", (float,), minimum=0), ConfigKey("n", (int, float), nullable=True)])
    for value in (math.nan, math.inf, -math.inf):
        for name in ("x", "n"):
            with pytest.raises(InvalidValueError, match=f"tier 't': {name}: must be a finite number"):
                schema.validate({name: value})
    assert schema.validate({"x": 2, "n": 1.5}) == {"x": 2.0, "n": 1.5}


UNDER_ONE_BLOCK = [
    ({"max_pinned_bytes": 100}, "secondary_tiers[0].max_pinned_bytes: max_pinned_bytes 100 is smaller than one"),
    ({"tenants": {"default": {"quota_bytes": 100}}}, "tenants.default.quota_bytes: quota_bytes 100 is smaller"),
    ({"tenants": {"overrides": {"acme": {"quota_bytes": "1KiB"}}}}, "overrides.acme.quota_bytes: quota_bytes 1024"),
    ({"capacity_bytes": 100}, "capacity_bytes 100 is smaller than one stored block"),
]


@requires_tier("fs")
@pytest.mark.parametrize(("keys", "message"), UNDER_ONE_BLOCK)
def test_c32_check_and_the_stack_refuse_a_byte_bound_under_one_stored_block(tmp_path, capsys, keys, message):
    entry = {"type": "fs", "root": str(tmp_path / "blocks"), "capacity_bytes": "64MiB", **keys}
    config = {"cpu_bytes_to_use": 1 << 20, "block_bytes": 8192, "secondary_tiers": [entry]}
    assert main(["check", _write(tmp_path, config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    spec = create_spec(config)
    with pytest.raises(ValueError, match=message.split(": ", 1)[-1][:30]):
        spec.create_secondary_tiers(allocate_host_buffer(1, spec.block_bytes))
    assert not (tmp_path / "blocks").exists()  # refused before anything was created


@requires_tier("fs")
def test_c32_bounds_of_one_stored_block_and_more_are_accepted(tmp_path, capsys):
    from tiering.fs.tier import FsspecSecondaryTierManager

    stored = 8192 + FsspecSecondaryTierManager.block_overhead_bytes  # exactly one stored block
    tenants = {"default": {"quota_bytes": stored}, "overrides": {"acme": {"quota_bytes": "1MiB"}}}
    entry = {"type": "fs", "root": str(tmp_path), "capacity_bytes": "64MiB", "max_pinned_bytes": stored,
             "tenants": tenants}  # fmt: skip
    config = {"cpu_bytes_to_use": 1 << 20, "block_bytes": 8192, "secondary_tiers": [entry]}
    assert main(["check", _write(tmp_path, config)]) == 0
    assert "config ok" in capsys.readouterr().out

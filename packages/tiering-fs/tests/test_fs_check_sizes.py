"""``tiering check`` on fs entries: the sizes it resolved, bounds below one stored block refused, warnings."""

import json

import pytest

from tiering.cli.main import main
from tiering.core.factory import create_spec
from tiering.core.schema import InvalidValueError
from tiering.fs.tier import FsspecSecondaryTierManager

BLOCK = 4096
STORED = BLOCK + FsspecSecondaryTierManager.block_overhead_bytes


def _config(tmp_path, cpu_bytes_to_use=1 << 20, **entry):
    path = tmp_path / "config.json"
    tier = {"type": "fs", "root": str(tmp_path / "kv"), **entry}
    config = {"cpu_bytes_to_use": cpu_bytes_to_use, "block_bytes": BLOCK, "secondary_tiers": [tier]}
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("probe", [[], ["--probe"]])
@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"capacity_bytes": "1KiB"}, "capacity_bytes"),
        ({"max_pinned_bytes": "1KiB"}, "max_pinned_bytes"),
        ({"tenants": {"default": {"quota_bytes": "1KiB"}}}, "tenants.default.quota_bytes"),
        ({"tenants": {"overrides": {"acme": {"quota_bytes": 1024}}}}, "tenants.overrides.acme.quota_bytes"),
    ],
)
def test_check_refuses_a_bound_below_one_stored_block(tmp_path, capsys, entry, key, probe):
    assert main(["check", _config(tmp_path, **entry), *probe]) == 2
    captured = capsys.readouterr()
    assert f"secondary_tiers[0].{key}: " in captured.err
    assert f"1024 is smaller than one stored block ({STORED} bytes)" in captured.err
    assert "config ok" not in captured.out
    assert not (tmp_path / "kv").exists()


def test_opening_the_tier_refuses_a_quota_below_one_stored_block_before_creating_anything(tmp_path):
    with open(_config(tmp_path, tenants={"default": {"quota_bytes": "1KiB"}}), encoding="utf-8") as f:
        spec = create_spec(json.load(f))
    with pytest.raises(InvalidValueError, match=r"tenants\.default\.quota_bytes: quota_bytes 1024 is smaller"):
        spec.get_manager()
    assert not (tmp_path / "kv").exists()


def test_bounds_of_exactly_one_stored_block_and_zero_pins_or_quota_pass(tmp_path, capsys):
    entry = {"capacity_bytes": 2 * STORED, "max_pinned_bytes": STORED, "tenants": {"default": {"quota_bytes": STORED}}}
    assert main(["check", _config(tmp_path, **entry)]) == 0
    entry = {"max_pinned_bytes": 0, "tenants": {"overrides": {"blocked": {"quota_bytes": 0}}}}
    assert main(["check", _config(tmp_path, **entry)]) == 0
    assert "tenants.overrides.blocked.quota_bytes: 0 bytes (0 B)" in capsys.readouterr().out


def test_check_echoes_every_resolved_size_of_the_secondary_tier(tmp_path, capsys):
    tenants = {"default": {"quota_bytes": "64MiB"}, "overrides": {"acme": {"quota_bytes": 100 << 20}}}
    assert main(["check", _config(tmp_path, capacity_bytes="1GiB", tenants=tenants)]) == 0
    out = capsys.readouterr().out
    assert "primary: 256 blocks x 4096 bytes = 1048576 bytes (1.0 MiB)" in out
    assert "  capacity_bytes: 1073741824 bytes (1.0 GiB)\n" in out
    assert "  max_pinned_bytes: 0 (pinning off; the default)\n" in out
    assert "  tenants.default.quota_bytes: 67108864 bytes (64.0 MiB)\n" in out
    assert "  tenants.overrides.acme.quota_bytes: 104857600 bytes (100.0 MiB)\n" in out
    assert "warning" not in out


def test_check_shows_the_default_cap_as_the_default(tmp_path, capsys):
    assert main(["check", _config(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("  capacity_bytes: ")]
    assert len(lines) == 1
    assert lines[0].endswith("; the default)") or lines[0] == "  capacity_bytes: none (no bound; the default)"


def test_check_warns_on_a_quota_above_the_cap(tmp_path, capsys):
    tenants = {"overrides": {"acme": {"quota_bytes": "2GiB"}}}
    assert main(["check", _config(tmp_path, capacity_bytes="1GiB", tenants=tenants)]) == 0
    out = capsys.readouterr().out
    assert (
        "warning: secondary_tiers[0].tenants.overrides.acme.quota_bytes: 2147483648 bytes (2.0 GiB) is above "
        "capacity_bytes (1073741824 bytes (1.0 GiB)); the cap evicts first, so the quota is never reached"
    ) in out
    assert "config ok" in out


def test_check_warns_on_a_decimal_unit_and_gives_the_binary_value_and_the_integer(tmp_path, capsys):
    tenants = {"default": {"quota_bytes": "500MB"}}
    assert main(["check", _config(tmp_path, cpu_bytes_to_use="4MB", capacity_bytes="4GB", tenants=tenants)]) == 0
    out = capsys.readouterr().out
    assert (
        "warning: secondary_tiers[0].capacity_bytes: '4GB' is 4000000000 bytes (3.7 GiB: GB is a power of 1000); "
        'for 4 GiB write "4GiB" or 4294967296'
    ) in out
    assert "warning: secondary_tiers[0].tenants.default.quota_bytes: '500MB' is 500000000 bytes" in out
    assert (
        "warning: cpu_bytes_to_use: '4MB' is 4000000 bytes (3.8 MiB: MB is a power of 1000); for 4 MiB write \"4MiB\""
        in out
    )
    assert main(["check", _config(tmp_path, capacity_bytes="4GiB")]) == 0
    assert "warning" not in capsys.readouterr().out


def test_a_misspelled_admission_key_lists_admission_among_the_accepted_keys(tmp_path, capsys):
    assert main(["check", _config(tmp_path, admision="second_sighting")]) == 2
    err = capsys.readouterr().err
    assert (
        "secondary_tiers[0].admision: unknown key; accepted keys: admission, admission_sketch_bytes, capacity_bytes"
        in err
    )


def test_a_vllm_config_without_block_bytes_leaves_the_one_block_check_to_the_engine(tmp_path, capsys):
    entry = {"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", "root": str(tmp_path / "kv")}
    extra = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{**entry, "capacity_bytes": "16KiB"}]}
    path = tmp_path / "vllm.json"
    path.write_text(json.dumps({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "block_bytes: set by the engine (not in the config): bounds are compared with one block when it starts" in out
    )
    assert "  capacity_bytes: 16384 bytes (16.0 KiB)\n" in out
    extra["block_bytes"] = 65536  # given: the check applies
    path.write_text(json.dumps({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}))
    assert main(["check", str(path)]) == 2
    assert (
        "secondary_tiers[0].capacity_bytes: capacity_bytes 16384 is smaller than one stored block"
        in capsys.readouterr().err
    )

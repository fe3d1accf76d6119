import json

import pytest

import tiering.core
from tiering.cli.main import main
from tiering.testing import requires_tier


@requires_tier("example")
def test_bench_synthetic_with_example_tier_writes_json(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps({"cpu_bytes_to_use": 64 * 4096, "block_bytes": 4096, "secondary_tiers": [{"type": "example"}]})
    )
    out = tmp_path / "r.json"
    assert main(["bench", "--config", str(config), "--requests", "200", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    text = capsys.readouterr().out
    assert f"requests           {report['requests']}" in text
    assert report["requests"] == 200
    assert report["hits_total"] == report["verified_blocks"] > 0
    assert report["hits"]["0:example"] > 0
    assert report["misses"] == report["block_lookups"] - report["hits_total"]
    assert set(report["scheduler_call_us"]) == {"p50", "p90", "p99", "max", "mean"}


@requires_tier("example")
def test_check_prints_resolved_classes_and_versions(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps(
            {
                "kv_connector_extra_config": {
                    "cpu_bytes_to_use": 1 << 20,
                    "eviction_policy": "arc",
                    "secondary_tiers": [{"type": "example", "custom_param": 1}],
                }
            }
        )
    )
    assert main(["check", str(config), "--probe"]) == 0
    out = capsys.readouterr().out
    assert (
        f"eviction_policy 'arc': tiering.core.primary.policy.ARCCachePolicy (tiering-core {tiering.core.__version__})"
        in out
    )
    assert "type 'example': tiering.example.tier.ExampleSecondaryTierManager (tiering-example 0.1.0)" in out
    assert "probe 'example': ok" in out


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "nfs"}]}, "unknown secondary tier type 'nfs'"),
        ({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{}]}, "secondary_tiers[0] has no 'type'"),
        ({"cpu_bytes_to_use": 1 << 20, "eviction_policy": "mru"}, "'eviction_policy' is 'mru'"),
    ],
)
def test_check_bad_config_exits_2_with_message(tmp_path, capsys, config, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    assert main(["check", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_check_unreadable_config(tmp_path, capsys):
    assert main(["check", str(tmp_path / "missing.json")]) == 2
    assert "cannot read config" in capsys.readouterr().err


@requires_tier("example")
def test_check_unknown_tier_key_exits_2(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "example", "bogus": 1}]}))
    assert main(["check", str(path)]) == 2
    assert "secondary_tiers[0].bogus: unknown key" in capsys.readouterr().err


def test_sizes_and_durations_parse_with_units():
    from tiering.core.inspection import parse_duration, parse_size

    assert parse_size("500000000") == 500_000_000
    assert parse_size("500M") == 500_000_000 and parse_size("100GB") == 100 * 10**9
    assert parse_size("64GiB") == 64 * 2**30 and parse_size("1.5k") == 1500
    assert parse_duration("30m") == 1800 and parse_duration("2w") == 14 * 86400
    with pytest.raises(ValueError, match="size '10 apples'"):
        parse_size("10 apples")


SCHEMED_TIER = """
from typing import ClassVar

from tiering.core.schema import ConfigKey, ConfigSchema
from tiering.example.tier import ExampleSecondaryTierManager

SCHEMA = ConfigSchema("schemed", [ConfigKey("shared_key_material", (str,), default="", secret=True)])


class SchemedExample(ExampleSecondaryTierManager):
    config_schema: ClassVar[ConfigSchema | None] = SCHEMA

    def __init__(self, offloading_spec, primary_kv_view, tier_type, shared_key_material=""):
        super().__init__(offloading_spec, primary_kv_view, tier_type)
"""


@requires_tier("example")
def test_bench_json_hides_the_keys_a_tier_schema_marks_secret(tmp_path, monkeypatch):
    from tiering.core.factory import SecondaryTierFactory

    (tmp_path / "schemed_tier_for_cli.py").write_text(SCHEMED_TIER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        SecondaryTierFactory,
        "_lazy",
        {**SecondaryTierFactory._lazy, "schemed": ("schemed_tier_for_cli", "SchemedExample")},
    )
    monkeypatch.setattr(SecondaryTierFactory, "_loaded", dict(SecondaryTierFactory._loaded))
    material = "k3y-m4t3r14l-value"  # not a name the generic rules treat as secret
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps(
            {
                "cpu_bytes_to_use": 64 * 4096,
                "block_bytes": 4096,
                "secondary_tiers": [{"type": "schemed", "shared_key_material": material}],
            }
        )
    )
    out = tmp_path / "r.json"
    assert main(["bench", "--config", str(config), "--requests", "20", "--json", str(out)]) == 0
    assert material not in out.read_text()
    report = json.loads(out.read_text())
    assert report["config"]["secondary_tiers"] == [{"type": "schemed", "shared_key_material": "***"}]

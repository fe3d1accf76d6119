"""Byte counts of the offloading config written with a unit ("4GiB"), as ``gc --to-bytes`` reads them."""

import json

import pytest

from tiering.cli.main import main
from tiering.core import TieringOffloadingSpec
from tiering.core.units import format_bytes, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100MB", 100_000_000),
        ("64GiB", 64 << 30),
        ("16 KiB", 16384),
        ("1.5k", 1500),
        ("4096", 4096),
        ("2gb", 2 * 10**9),
    ],
)
def test_parse_size_reads_decimal_and_binary_units(text, expected):
    assert parse_size(text) == expected


def test_format_bytes_uses_binary_units():
    assert [format_bytes(n) for n in (512, 20480, 256 << 20, 64 << 30)] == [
        "512 B",
        "20.0 KiB",
        "256.0 MiB",
        "64.0 GiB",
    ]


def test_spec_byte_counts_accept_a_unit():
    spec = TieringOffloadingSpec({"cpu_bytes_to_use": "1MiB", "block_bytes": "16KiB"})
    assert (spec.cpu_bytes_to_use, spec.block_bytes, spec.num_primary_blocks) == (1 << 20, 16384, 64)
    assert spec.namespace.block_bytes == 16384


@pytest.mark.parametrize("key", ["cpu_bytes_to_use", "block_bytes"])
def test_a_bad_size_names_the_key_and_shows_what_a_size_looks_like(key):
    config = {"cpu_bytes_to_use": 1 << 20, key: "4 gigs"}
    with pytest.raises(ValueError) as err:
        TieringOffloadingSpec(config)
    assert f"config key {key!r} must be an integer of bytes >= " in str(err.value)
    assert "or a size with a unit (e.g. 4GiB, 256MiB, 500MB or 65536), got '4 gigs'" in str(err.value)


def test_check_accepts_units_and_prints_bytes(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": "4MiB", "block_bytes": "64KiB"}))
    assert main(["check", str(path)]) == 0
    assert "primary: 64 blocks x 65536 bytes" in capsys.readouterr().out


def test_vllm_config_refuses_a_unit_where_vllm_reads_the_key(tmp_path, capsys):
    path = tmp_path / "kv-transfer-config.json"
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": "4GiB"}
    path.write_text(json.dumps({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cpu_bytes_to_use: '4GiB': vLLM reads this key of kv_connector_extra_config itself" in err
    assert "write 4294967296" in err


@pytest.mark.parametrize("wrapped", [False, True])
def test_the_binding_spec_refuses_a_unit_in_both_config_forms(tmp_path, capsys, wrapped):
    extra = {
        "spec_name": "TieringSpec",
        "spec_module_path": "tiering.core.vllm.spec",
        "cpu_bytes_to_use": "1GiB",
        "block_bytes": 65536,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"kv_connector_extra_config": extra} if wrapped else extra))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cpu_bytes_to_use: '1GiB': vLLM reads this key of kv_connector_extra_config itself" in err
    assert "write 1073741824" in err

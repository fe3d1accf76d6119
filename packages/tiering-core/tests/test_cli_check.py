"""``tiering check`` on the configs users write: vLLM's form, sizes against the machine, mistakes named."""

import json

import pytest

from tiering.core.cli import main
from tiering.core.testing import requires_tier


def _write(tmp_path, config):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    return str(path)


def _vllm_config(entry, **extra):
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [entry], **extra},
    }


@requires_tier("example")
def test_check_accepts_the_binding_keys_of_a_vllm_form_entry(tmp_path, capsys):
    entry = {
        "type": "tiering_example",
        "module_path": "tiering.core.vllm.tiers",
        "model_revision": "0e9e39f",
        "kv_layout": "hnd",
        "locality": "LOCAL",
        "enable_kv_events": True,
        "backpressure": {"backpressure_cls": "EMABackpressureDetector"},
    }
    assert main(["check", _write(tmp_path, _vllm_config(entry))]) == 0
    out = capsys.readouterr().out
    assert "binding keys backpressure, enable_kv_events, kv_layout, locality, model_revision checked" in out
    assert "config ok" in out


@requires_tier("example")
@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("enable_kv_events", "yes", "secondary_tiers[0].enable_kv_events: must be true or false, got 'yes'"),
        ("locality", "local", "secondary_tiers[0].locality: must be one of 'LOCAL', 'REMOTE', got 'local'"),
        ("model_revision", 7, "secondary_tiers[0].model_revision: must be a non-empty string, got 7"),
        ("backpressure", "ema", "secondary_tiers[0].backpressure: must be an object, got 'ema'"),
    ],
)
def test_check_names_a_wrong_binding_key(tmp_path, capsys, key, value, message):
    entry = {"type": "tiering_example", "module_path": "tiering.core.vllm.tiers", key: value}
    assert main(["check", _write(tmp_path, _vllm_config(entry))]) == 2
    assert message in capsys.readouterr().err


@requires_tier("example")
def test_binding_keys_stay_unknown_in_a_plain_entry(tmp_path, capsys):
    config = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "example", "model_revision": "main"}]}
    assert main(["check", _write(tmp_path, config)]) == 2
    assert "secondary_tiers[0].model_revision: unknown key" in capsys.readouterr().err


@requires_tier("example")
def test_check_reads_the_binding_spec_for_vllm_without_vllm(tmp_path, capsys):
    entry = {"type": "tiering_example", "module_path": "tiering.core.vllm.tiers"}
    config = _vllm_config(entry, spec_name="TieringSpec", spec_module_path="tiering.core.vllm.spec")
    assert main(["check", _write(tmp_path, config)]) == 0
    out = capsys.readouterr().out
    assert "spec_name 'TieringSpec' with spec_module_path 'tiering.core.vllm.spec' is the vLLM binding's spec" in out
    assert "spec: tiering.core.spec.TieringOffloadingSpec" in out

"""``tiering ls / stat / verify`` on what an engine stored: the vLLM binding's namespace, LMCache's adapter's.

The vLLM binding completes the config's namespace when the engine starts (model, dtype, row layout and size
from vLLM's config: :func:`tiering.core.vllm.translate.tiering_spec_from_vllm`, which builds an
``OffloadingSpec(extra, strict=False)`` as below); the commands open it with ``--namespace DIGEST``, read
from the root's ``namespace.json``. LMCache's ``--l2-adapter`` object is read as the stack the adapter opens
(:func:`tiering.lmcache.params.stack_config`, which the adapter builds its spec from).
"""

import json

import pytest

from tiering.cli.main import main
from tiering.core.factory import create_secondary_tier
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.testing import make_key, requires_tier, store_blocks

pytestmark = requires_tier("fs")

REVISION = "0e9e39f249a16976918f6564b8830bc894c89659"


def store(spec, tier_entry, n):
    view = allocate_host_buffer(8, spec.block_bytes)
    tier = create_secondary_tier(tier_entry, view, spec)
    try:
        assert store_blocks(tier, view, [make_key(i) for i in range(n)])
    finally:
        tier.shutdown()


def run(capsys, *argv):
    status = main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_the_commands_open_what_the_vllm_binding_stored(tmp_path, capsys):
    root = str(tmp_path / "kv")
    entry = {"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", "root": root, "model_revision": REVISION}
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 4294967296, "secondary_tiers": [entry]}
    config = tmp_path / "kv-transfer-config.json"  # the quick start's --kv-transfer-config, as a file
    config.write_text(json.dumps({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}))
    # what the binding hands its tier when vLLM starts: the extra config plus the engine's namespace keys
    engine = {**extra, "model_revision": REVISION, "model": "meta-llama/Llama-3.1-8B-Instruct", "block_size": 16}
    engine.update(kv_dtype="bfloat16", kv_layout='{"engine":"vllm","layout":"opaque"}', block_bytes=8192)
    spec = OffloadingSpec({**engine, "cpu_bytes_to_use": 8 * 8192}, strict=False)
    store(spec, {"type": "fs", "root": root}, 5)
    digest = spec.namespace.digest

    status, out, _ = run(capsys, "check", str(config))
    assert status == 0 and '"model": "unknown"' not in out
    assert "`tiering stat CONFIG --namespace DIGEST` opens one" in out
    assert "primary: 4294967296 bytes (4.0 GiB); its blocks are the engine's rows, sized when it starts" in out
    status, out, _ = run(capsys, "ls", str(config), "--json")
    (namespace,) = json.loads(out)[0]["namespaces"]
    assert namespace["digest"] == digest and namespace["blocks"] == 5
    assert namespace["fields"]["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    status, _, err = run(capsys, "stat", str(config))
    assert status == 1 and f"namespaces there: {digest}" in err and "--namespace DIGEST opens one" in err
    status, out, _ = run(capsys, "stat", str(config), "--namespace", digest[:8], "--json")
    report = json.loads(out)
    assert status == 0 and report["namespace"] == digest and report["tiers"][0]["stats"]["resident_blocks"] == 5
    status, out, _ = run(capsys, "verify", str(config), "--json")
    assert status == 0 and [(r["namespace"], r["sound"]) for r in json.loads(out)] == [(digest, 5)]
    status, _, err = run(capsys, "stat", str(config), "--namespace", "ffff")
    assert status == 2 and "--namespace ffff: no persistent tier of the stack holds it" in err


def test_the_commands_open_what_the_lmcache_adapter_stored(tmp_path, capsys):
    params = pytest.importorskip("tiering.lmcache.params")
    from tiering.core import TieringOffloadingSpec

    root = str(tmp_path / "kv")
    adapter = {  # lmcache.md's --l2-adapter object
        "type": "plugin",
        "module_path": "tiering.lmcache.adapter",
        "class_name": "TieringL2Adapter",
        "adapter_params": {"object_bytes": "32KiB", "tier": {"type": "fs", "root": root, "capacity_bytes": "1GiB"}},
    }
    path = tmp_path / "l2-adapter.json"
    path.write_text(json.dumps(adapter))
    stack = params.stack_config(params.parse_params(adapter["adapter_params"]))  # what the adapter opens
    store(TieringOffloadingSpec(stack), stack["secondary_tiers"][0], 4)

    status, out, err = run(capsys, "check", str(path))
    assert status == 0 and "LMCache's --l2-adapter object: read as the stack tiering's adapter opens" in err + out
    assert '"model": "lmcache"' in out and "config ok" in out
    status, out, _ = run(capsys, "ls", str(path), "--json")
    (namespace,) = json.loads(out)[0]["namespaces"]
    assert namespace["blocks"] == 4 and namespace["fields"]["model"] == "lmcache"
    status, out, _ = run(capsys, "stat", str(path), "--json")
    assert status == 0 and json.loads(out)["tiers"][0]["stats"]["resident_blocks"] == 4
    status, out, _ = run(capsys, "verify", str(path), "--json")
    assert status == 0 and [r["sound"] for r in json.loads(out)] == [4]


def test_an_adapter_object_no_installed_distribution_reads_is_named_in_one_line(tmp_path, capsys):
    path = tmp_path / "adapter.json"
    path.write_text(json.dumps({"type": "plugin", "module_path": "acme.adapter", "adapter_params": {"tier": {}}}))
    status, _, err = run(capsys, "ls", str(path))
    assert status == 2
    assert "is an engine's adapter object (it has adapter_params) for module_path 'acme.adapter'" in err

"""``tiering ls / stat / verify`` on what vLLM's own spec stored through a ``tiering_fs`` tier (docs: vllm.md).

The binding completes the namespace when the engine starts (model, dtype, row layout and size from vLLM's
config), so the quick start's ``--kv-transfer-config`` file alone does not name it: the commands of vllm.md's
"Inspecting what the engine stored" find it in the root and open it with ``--namespace``. Here blocks are
stored through vLLM 0.33's ``TieringOffloadingSpec`` and its manager (the scheduler side on CPU, the GPU copies
played by :mod:`tiering.testing.vllm_driver`), then the commands run on the config file as a user runs them.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None
    or importlib.util.find_spec("tiering.fs") is None
    or importlib.util.find_spec("tiering.cli") is None,
    reason="needs vLLM, tiering-fs and tiering-cli: the vllm hatch environment",
)

ROW = 16384
BLOCKS = 6


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from tiering.cli.main import main

    status = main(list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def test_the_commands_of_vllm_md_see_what_vllms_spec_stored(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from tiering.fs.layout import TRAILER_BYTES
    from tiering.testing import vllm_driver as testing

    entry = {"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", "root": str(tmp_path / "kv")}
    extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 64 * ROW, "secondary_tiers": [entry]}
    keys = [testing.make_key(i, seed=b"inspect") for i in range(BLOCKS)]
    with testing.vllm_manager(extra, worker_kv_bytes_per_block=ROW) as (spec, manager, driver):
        assert type(spec).__module__.startswith("vllm.")  # vLLM's own spec, no spec of ours
        driver.finish(driver.store([keys], lambda k: testing.payload(k, driver.row_bytes)))
        driver.wait_idle()
        stats = manager.get_stats().reduce()
        assert stats["vllm:kv_offload_tiering_write_bytes:('1:tiering_fs',)"] == BLOCKS * ROW
    config = tmp_path / "kv-transfer-config.json"  # the quick start's --kv-transfer-config, saved in a file
    config.write_text(json.dumps({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": extra}))
    stored_bytes = BLOCKS * (ROW + TRAILER_BYTES)  # each block as stored: its row plus the header trailer

    status, out, _ = _run(capsys, "ls", str(config), "--json")
    assert status == 0
    (namespace,) = json.loads(out)[0]["namespaces"]  # the namespace the engine wrote, read from the root
    assert (namespace["blocks"], namespace["bytes"]) == (BLOCKS, stored_bytes)
    assert namespace["fields"]["block_bytes"] == ROW and namespace["fields"]["model"] != "unknown"
    digest = namespace["digest"]

    status, _, err = _run(capsys, "stat", str(config))  # without --namespace: names the one the root holds
    assert status == 1 and f"namespaces there: {digest}" in err
    status, out, _ = _run(capsys, "stat", str(config), "--namespace", digest[:8], "--json")
    report = json.loads(out)
    assert status == 0 and report["namespace"] == digest
    tier_stats = report["tiers"][0]["stats"]
    assert (tier_stats["resident_blocks"], tier_stats["resident_bytes"]) == (BLOCKS, stored_bytes)
    status, out, _ = _run(capsys, "stat", str(config), "--namespace", digest[:8])
    assert status == 0 and f"  stored         {BLOCKS:,} blocks, " in out

    status, out, _ = _run(capsys, "verify", str(config), "--json")
    assert status == 0
    assert [(r["namespace"], r["sound"]) for r in json.loads(out)] == [(digest, BLOCKS)]

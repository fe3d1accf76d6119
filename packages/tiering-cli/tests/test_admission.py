"""Admission on second sighting through the real manager and fs tier; its config keys; the bench rows."""

import json

import pytest

from tiering.cli.bench.admission import admission_sweep, format_rows
from tiering.cli.bench.workload import Request
from tiering.cli.main import main
from tiering.core import ReqContext, TieringOffloadingSpec
from tiering.core.base import block_view
from tiering.core.keys import trace_block_key
from tiering.core.schema import InvalidTypeError, InvalidValueError
from tiering.testing import block_payload, make_key, requires_tier, wait_until

pytestmark = requires_tier("fs")

BLOCK = 4096


def build(tmp_path, **admission):
    spec = TieringOffloadingSpec(
        {
            "cpu_bytes_to_use": 4 * BLOCK,
            "block_bytes": BLOCK,
            "secondary_tiers": [{"type": "fs", "root": str(tmp_path / "fs"), **admission}],
        }
    )
    return spec.get_manager()


def store(manager, keys, req_id):
    ctx = ReqContext(req_id)
    alloc = manager.prepare_store(keys, ctx)
    for key, slot in zip(alloc.keys, alloc.block_ids, strict=True):
        block_view(manager.primary.kv_view, slot)[:] = block_payload(key, BLOCK)
    manager.complete_store(alloc.keys, ctx)
    manager.on_request_finished(ctx)
    wait_until(lambda: not manager.has_pending_work())


def load(manager, keys, req_id):
    """Look up and load ``keys`` as an engine does; the source of each block (-1: the primary tier)."""
    ctx = ReqContext(req_id)
    wait_until(lambda: manager.lookup(keys, ctx) is not None)
    assert manager.lookup(keys, ctx) == len(keys)
    manager.prepare_load(keys, ctx)
    results = []
    wait_until(lambda: results.extend(manager.get_finished()) or results)
    (result,) = results
    for key, slot in zip(result.keys, result.block_ids, strict=True):
        assert block_view(manager.primary.kv_view, slot) == block_payload(key, BLOCK)
    manager.complete_load(ctx)
    manager.on_request_finished(ctx)
    wait_until(lambda: not manager.has_pending_work())
    return result.sources


def tier_holds(manager, keys):
    tier = manager.secondary_tiers[0]
    return [tier.lookup(k, ReqContext("probe")) for k in keys]


def written(manager):
    return manager.metrics.value("stored_bytes_total", index="0")


def admission(manager, outcome):
    return manager.metrics.value("store_admission_total", index="0", outcome=outcome)


def test_first_store_declined_second_sighting_written_blocks_seen_once_never(tmp_path):
    manager = build(tmp_path, admission="second_sighting")
    try:
        a = [make_key(i, b"a") for i in range(4)]
        store(manager, a, "r1")  # first sighting of a0..a3: nothing written
        assert tier_holds(manager, a) == [False] * 4
        assert (admission(manager, "declined"), admission(manager, "admitted"), written(manager)) == (4, 0, 0)

        assert load(manager, a[:2], "r2") == [-1, -1]  # second sighting of a0, a1: written from the primary tier
        assert tier_holds(manager, a) == [True, True, False, False]
        assert (admission(manager, "admitted"), written(manager)) == (2, 2 * BLOCK)

        others = [make_key(i, b"x") for i in range(4)]
        store(manager, others, "r3")  # evicts a2, a3 from the primary tier; x0..x3 seen once
        assert not any(manager.primary.lookup(k) for k in a[2:])
        store(manager, a[2:3], "r4")  # a2 recomputed: its second sighting, written
        assert tier_holds(manager, a + others) == [True, True, True, False] + [False] * 4
        assert written(manager) == 3 * BLOCK
        assert manager.secondary_tiers[0].stats()["resident_blocks"] == 3
        assert (admission(manager, "admitted"), admission(manager, "declined")) == (3, 8)
        assert load(manager, a[:2], "r5") == [0, 0]  # served by the tier, its bytes verified
        assert load(manager, a[:2], "r6") == [-1, -1]  # held by the tier: not written again
        assert written(manager) == 3 * BLOCK
    finally:
        manager.shutdown()


def test_always_writes_every_block_at_its_first_store(tmp_path):
    manager = build(tmp_path)
    try:
        a = [make_key(i, b"a") for i in range(4)]
        store(manager, a, "r1")
        assert tier_holds(manager, a) == [True] * 4
        assert written(manager) == 4 * BLOCK
        assert admission(manager, "declined") == admission(manager, "admitted") == 0
    finally:
        manager.shutdown()


@pytest.mark.parametrize(
    ("keys", "error", "message"),
    [
        (
            {"admission": "sometimes"},
            InvalidValueError,
            "secondary_tiers[0].admission: must be one of 'always', 'second_sighting', got 'sometimes' (tier 'fs')",
        ),
        ({"admission": 2}, InvalidTypeError, "secondary_tiers[0].admission: must be one of"),
        (
            {"admission": "second_sighting", "admission_sketch_bytes": 32},
            InvalidValueError,
            "secondary_tiers[0].admission_sketch_bytes: must be an integer >= 64 and <= 1073741824 (bytes) or a size",
        ),
        (
            {"admission_sketch_bytes": "1MiB"},
            InvalidValueError,
            "secondary_tiers[0].admission_sketch_bytes: is used only with admission 'second_sighting', not 'always'",
        ),
    ],
)
def test_bad_admission_keys_are_named(tmp_path, keys, error, message):
    with pytest.raises(error) as info:
        build(tmp_path, **keys)
    assert message in str(info.value)
    config = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "fs", "root": str(tmp_path), **keys}]}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    assert main(["check", str(path)]) == 2


def test_check_accepts_admission_keys_and_sizes(tmp_path, capsys):
    entry = {"type": "fs", "root": str(tmp_path), "admission": "second_sighting", "admission_sketch_bytes": "64KiB"}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [entry]}))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "secondary_tiers[0] type 'fs'" in out and "admission 'second_sighting' (sketch of 64.0 KiB)" in out
    assert "config ok" in out
    spec = TieringOffloadingSpec({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [entry]})
    assert [(c.policy, c.sketch_bytes) for c in spec.admission()] == [("second_sighting", 64 * 1024)]


def test_bench_prints_a_row_per_policy_and_cap():
    # Three conversations of three turns each, the turns sharing their prefix: blocks seen 1 to 3 times.
    requests = [
        Request(f"r{t}-{c}", tuple(trace_block_key(1000 * c + i) for i in range(4 * (t + 1))))
        for t in range(3)
        for c in range(3)
    ]
    rows = admission_sweep(requests, [1 << 20, 4 << 20], ["always", "second_sighting"], BLOCK, cpu_bytes=16 * BLOCK)
    assert [(r["cap_bytes"], r["policy"]) for r in rows] == [
        (1 << 20, "always"),
        (1 << 20, "second_sighting"),
        (4 << 20, "always"),
        (4 << 20, "second_sighting"),
    ]
    always, second = rows[2], rows[3]
    assert always["block_lookups"] == second["block_lookups"] == 3 * (4 + 8 + 12)
    assert always["declined"] == 0 and always["bytes_written"] == 36 * BLOCK  # every distinct block
    assert second["declined"] > 0 and second["bytes_written"] < always["bytes_written"]
    table = format_rows(rows)
    assert table.count("second_sighting") == 2 and table.count("always") == 2
    assert "hit ratio x" in table


def test_vllm_form_entries_refuse_an_admission_policy(tmp_path, capsys):
    """vLLM's own manager decides what is written: ``tiering check`` refuses admission in its tier entries.

    (SGLang's and LMCache's refusals are tested in their distributions.)
    """
    entry = {"type": "fs", "root": str(tmp_path), "admission": "second_sighting"}
    vllm_entry = {**entry, "type": "tiering_fs", "module_path": "tiering.core.vllm.tiers"}
    vllm_form = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}
    vllm_form["kv_connector_extra_config"] = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [vllm_entry]}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(vllm_form))
    assert main(["check", str(path)]) == 2
    assert "secondary_tiers[0].admission: applied only by tiering's own manager" in capsys.readouterr().err


def test_tiering_bench_applies_the_config_admission_policy(tmp_path):
    entry = {"type": "fs", "root": str(tmp_path / "fs"), "admission": "second_sighting"}
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 64 * BLOCK, "block_bytes": BLOCK, "secondary_tiers": [entry]}))
    out = tmp_path / "r.json"
    assert main(["bench", "--config", str(config), "--requests", "40", "--json", str(out)]) == 0
    samples = json.loads(out.read_text())["metrics"]["tiering_store_admission_total"]
    by_outcome = {s["labels"]["outcome"]: s["value"] for s in samples}
    assert by_outcome["declined"] > 0

"""The SGLang binding's config, namespace, staging buffer and tier stack, without SGLang (core and the example tier)."""

from __future__ import annotations

import ctypes
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tiering.core.base import block_view
from tiering.core.runtime.tiering_spec import TieringOffloadingSpec
from tiering.sglang.config import Ranks, kv_layout, parse_extra_config, spec_config
from tiering.sglang.pages import PageGeometry, Staging
from tiering.testing import requires_tier
from tiering.testing.harness import make_key

BASE = {"backend_name": "tiering", "module_path": "tiering.sglang.storage", "class_name": "TieringHiCacheStorage"}
EXAMPLE = {"secondary_tiers": [{"type": "example"}]}


def test_importing_the_package_imports_no_sglang() -> None:
    import subprocess
    import sys

    code = "import sys, tiering.sglang.config, tiering.sglang.stack; print('sglang' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


@requires_tier("example")
def test_extra_config_reads_inline_and_file_configs(tmp_path: Path) -> None:
    config = parse_extra_config({**BASE, "interface_v1": 1, "tiering": EXAMPLE, "tiering_job_timeout_s": 5})
    assert (config.interface_v1, config.timeout_s, config.tiering) == (True, 5.0, EXAMPLE)
    path = tmp_path / "tiering.json"
    # a vLLM config file works as it is: vLLM's keys ignored, its tier entries read as plain ones
    path.write_text(json.dumps({"kv_connector_extra_config": {**EXAMPLE, "blocks_per_chunk": 4, "spec_name": "X"}}))
    assert parse_extra_config({**BASE, "tiering": str(path)}).tiering == EXAMPLE


@requires_tier("example")
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"teiring": EXAMPLE}, "unknown key 'teiring' (did you mean 'tiering'?)"),
        ({}, "key 'tiering' is required"),
        ({"tiering": {"secondary_tiers": []}}, "'secondary_tiers' must be a non-empty list"),
        ({"tiering": {**EXAMPLE, "block_bytes": 4096}}, "key 'block_bytes' is decided by SGLang"),
        ({"tiering": EXAMPLE, "interface_v1": 2}, "'interface_v1' must be 0 or 1, got 2"),
        ({"tiering": EXAMPLE, "tiering_job_timeout_s": 0}, "'tiering_job_timeout_s' must be seconds > 0"),
        ({"tiering": {"secondary_tiers": [{"type": "fss"}]}}, "secondary_tiers[0]"),
    ],
)
def test_c27_bad_extra_config_names_the_key(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        parse_extra_config({**BASE, **extra})


@requires_tier("example")
def test_c27_namespace_carries_engine_ranks_layout_and_interface() -> None:
    config = parse_extra_config({**BASE, "interface_v1": 1, "tiering": EXAMPLE})
    fields = {"model": "m", "dtype": "bfloat16", "layout": "layer_first", "page_size": 64, "page_bytes": 4096}
    spec = TieringOffloadingSpec(spec_config(config, Ranks(tp_rank=1, tp_size=2, pp_rank=1, pp_size=2), **fields))
    assert spec.namespace.kv_layout == (
        '{"engine":"sglang","layout":"layer_first","pages":"page-buffers","tp":"1of2","pp":"1of2","cp":"0of1"}'
    )
    assert (spec.namespace.block_size, spec.namespace.block_bytes, spec.num_primary_blocks) == (64, 4096, 64)
    digests = {
        TieringOffloadingSpec(spec_config(config, ranks, **fields)).namespace.digest
        for ranks in (Ranks(), Ranks(tp_rank=1, tp_size=2), Ranks(cp_rank=1, cp_size=2), Ranks(pp_rank=1, pp_size=2))
    }
    assert len(digests) == 4
    # MLA: one copy for every TP rank
    assert kv_layout(Ranks(tp_rank=3, tp_size=8, is_mla=True), "page_first", False) == kv_layout(
        Ranks(is_mla=True), "page_first", False
    )
    assert not Ranks(tp_rank=3, tp_size=8, is_mla=True).writer and Ranks(tp_rank=3, tp_size=8).writer
    with pytest.raises(ValueError, match="'model' is 'other' but SGLang serves 'm'"):
        spec_config(parse_extra_config({**BASE, "tiering": {**EXAMPLE, "model": "other"}}), Ranks(), **fields)


def test_page_geometry_checks_the_meta() -> None:
    geometry = PageGeometry.from_meta([8, 4, 8, 4], 2)
    assert geometry.segment_bytes == (8, 4) and geometry.page_bytes == 12
    assert geometry.segments([100, 200, 300, 400], [8, 4, 8, 4], 2) == [[(100, 8), (200, 4)], [(300, 8), (400, 4)]]
    with pytest.raises(ValueError, match="pages differ"):
        PageGeometry.from_meta([8, 4, 8, 8], 2)
    with pytest.raises(ValueError, match="2 pointers and 2 sizes for 2 page"):
        geometry.segments([1, 2], [8, 4], 2)


def test_staging_gathers_and_scatters_segments() -> None:
    staging = Staging(2, 6)
    src = ctypes.create_string_buffer(b"abcdefgh")
    dst = ctypes.create_string_buffer(8)
    segments = [(ctypes.addressof(src) + 4, 2), (ctypes.addressof(src), 4)]
    staging.gather(1, segments)
    assert bytes(block_view(staging.view, 1)) == b"efabcd"
    staging.scatter(1, [(ctypes.addressof(dst), 6)])
    assert dst.raw[:6] == b"efabcd"
    first = staging.acquire(2)
    taken: list[list[int]] = []
    waiter = threading.Thread(target=lambda: taken.append(staging.acquire(1)))
    waiter.start()
    waiter.join(0.1)
    assert waiter.is_alive()  # waits for a free slot
    staging.release(first)
    waiter.join(5)
    assert len(taken[0]) == 1 and staging.free_slots() == 1
    with pytest.raises(TimeoutError, match=r"2 staging slots not free within 0\.01 s"):
        staging.acquire(2, timeout_s=0.01)


@requires_tier("example")
def test_stack_stores_loads_and_times_out_holding_slots(tmp_path: Path) -> None:
    from tiering.sglang.stack import TierStack

    config = {"cpu_bytes_to_use": 4 * 64, "block_bytes": 64, "secondary_tiers": [{"type": "example"}]}
    spec = TieringOffloadingSpec(config)
    staging = Staging(4, 64)
    stack = TierStack(spec.create_secondary_tiers(staging.view), staging, timeout_s=5)
    keys = [make_key(i, b"sgl") for i in range(3)]
    slots = staging.acquire(3)
    for slot in slots:
        block_view(staging.view, slot)[:] = bytes([slot + 1]) * 64
    assert stack.store(keys, slots) == ([True, True, True], True)
    assert stack.leading_run([*keys, make_key(9, b"sgl")]) == 3
    for slot in slots:
        block_view(staging.view, slot)[:] = bytes(64)
    assert stack.load(keys[::-1], slots) == ([True, True, True], True)
    assert bytes(block_view(staging.view, slots[0])) == bytes([slots[2] + 1]) * 64
    staging.release(slots)
    # a tier that never reports: the call fails, its slots stay lent until the report arrives
    tier = stack.tiers[0]
    held: list[Any] = []
    real_finished = tier.get_finished
    tier.get_finished = lambda: []  # type: ignore[method-assign]
    tier.submit_load = held.append  # type: ignore[method-assign]
    stack.timeout_s = 0.05
    slots = staging.acquire(2)
    assert stack.load(keys[:2], slots) == ([False, False], False)
    assert staging.free_slots() == 2
    tier.get_finished = real_finished  # type: ignore[method-assign]
    from tiering.core.base import JobResult

    tier.get_finished = lambda: [JobResult(held[0].job_id, False)]  # type: ignore[method-assign]
    assert stack.leading_run([]) == 0 and stack.load([], []) == ([], True)  # polls once
    assert staging.free_slots() == 4
    stack.shutdown()

"""The SGLang backend under misuse and a root removed from outside (hatch env ``sglang``).

No method raises for any input SGLang's interfaces allow: a call it cannot
serve answers False, None or a list of False, with one logged error. A
local root removed from outside is noticed by the next call: no page that
is not on disk is reported held, and stores write it again. Short values
(Mooncake's address calls of less than a page) come back only at their own
length.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sglang.srt.mem_cache.storage.backend_factory", reason="needs SGLang (hatch env sglang)")

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

from tiering.sglang.storage import TieringHiCacheStorage

sys.path.insert(0, str(Path(__file__).parent / "support"))
from sglang_pools import mha_host_pool, page_bytes_of

MODULE = {
    "backend_name": "tiering",
    "module_path": "tiering.sglang.storage",
    "class_name": "TieringHiCacheStorage",
}


def make(root: Path, v1: int, pool: Any | None = None) -> TieringHiCacheStorage:
    extra = {**MODULE, "interface_v1": v1, "tiering": {"secondary_tiers": [{"type": "fs", "root": str(root)}]}}
    config = HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=False,
        model_name="m",
        extra_config=extra,
    )
    made = TieringHiCacheStorage(config, {})
    if pool is not None:
        made.register_mem_pool_host(pool)
    return made


def keys(n: int) -> list[str]:
    salt = uuid.uuid4().bytes
    return [hashlib.sha256(salt + bytes([i])).hexdigest() for i in range(n)]


def indices(pool: Any, pages: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(p * pool.page_size, (p + 1) * pool.page_size) for p in pages])


def errors_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("tiering") and r.levelno >= logging.ERROR]


# Each misuse: (interface_v1, call, expected answer). ``pool`` gives page tensors of the right size.
MISUSES: dict[str, tuple[int, Callable[[TieringHiCacheStorage, Any], Any], Any]] = {
    "batch_set of a stacked tensor": (
        0,
        lambda b, p: b.batch_set(keys(2), torch.stack([p.get_data_page(0), p.get_data_page(p.page_size)])),
        False,
    ),
    "batch_set of a list of lists": (0, lambda b, p: b.batch_set(keys(2), [[1, 2], [3, 4]]), False),
    "batch_get into a stacked tensor": (
        0,
        lambda b, p: b.batch_get(keys(2), torch.stack([p.get_dummy_flat_data_page() for _ in range(2)])),
        None,
    ),
    "batch_get into a list of lists": (0, lambda b, p: b.batch_get(keys(2), [[0.0], [0.0]]), None),
    "batch_get with fewer targets than keys": (
        0,
        lambda b, p: b.batch_get(keys(2), [p.get_dummy_flat_data_page()]),
        None,
    ),
    "get without a target": (0, lambda b, p: b.get(keys(1)[0]), None),
    "set without a value": (0, lambda b, p: b.set(keys(1)[0]), False),
    "set of a page of another size": (0, lambda b, p: b.set(keys(1)[0], torch.zeros(3)), False),
    "set at an address of more than a page": (1, lambda b, p: b.set(keys(1)[0], None, 4096, 1 << 40), False),
    "batch_set with a size list too short": (1, lambda b, p: b.batch_set(keys(2), None, [4096, 8192], [16]), False),
    "batch_get at address 0": (1, lambda b, p: b.batch_get(keys(1), [0], [16]), None),
    "batch_set of flat tensors under interface_v1 1": (
        1,
        lambda b, p: b.batch_set(keys(1), [p.get_data_page(0)]),
        False,
    ),
    "batch_set_v1 with host indices of another count": (
        1,
        lambda b, p: b.batch_set_v1(keys(2), indices(p, [0])),
        [False, False],
    ),
    "batch_get_v1 with a str for host indices": (1, lambda b, p: b.batch_get_v1(keys(2), "0"), [False, False]),
    "batch_exists of ints": (1, lambda b, p: b.batch_exists([1, 2]), 0),
    "batch_exists of None": (1, lambda b, p: b.batch_exists(None), 0),
    "batch_set_v1 of None keys": (1, lambda b, p: b.batch_set_v1(None, indices(p, [0])), []),
}


@pytest.mark.parametrize("name", list(MISUSES))
def test_a_misuse_answers_a_failure_with_one_logged_error(
    name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    v1, call, expected = MISUSES[name]
    pool = mha_host_pool()
    made = make(tmp_path / "kv", v1, pool)
    try:
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            answer = call(made, pool)
        assert answer == expected and type(answer) is type(expected)
        if name != "batch_exists of None":  # nothing asked, nothing to log: 0 pages held
            assert len(errors_of(caplog)) == 1, [r.getMessage() for r in errors_of(caplog)]
        # The backend still serves well-formed calls.
        names = keys(2)
        assert (
            made.batch_set_v1(names, indices(pool, [0, 1])) == [True, True]
            if v1
            else made.batch_set(names, [pool.get_data_page(0), pool.get_data_page(pool.page_size)])
        )
        assert made.batch_exists(names) == 2
    finally:
        made.close()


def test_every_call_before_register_answers_a_failure(tmp_path: Path) -> None:
    made = make(tmp_path / "kv", 1)
    page = torch.zeros(8)
    assert made.batch_exists(keys(1)) == 0 and made.exists("k") is False
    assert made.batch_set_v1(keys(2), torch.arange(2)) == [False, False]
    assert made.batch_get_v1(keys(2), torch.arange(2)) == [False, False]
    assert made.set("k", page) is False and made.get("k", page) is None
    assert made.batch_set(["k"], [page]) is False and made.batch_get(["k"], [page]) == [None]
    assert made.get("k", page.data_ptr(), 32) is False and made.clear() is False and made.get_stats() is None
    made.close()


# -- a root removed from outside --------------------------------------------------------------------
def test_a_removed_root_is_noticed_at_once_and_stores_write_again(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    pool = mha_host_pool()
    made = make(root, 1, pool)
    names = keys(3)
    assert made.batch_set_v1(names, indices(pool, [0, 1, 2])) == [True] * 3
    assert made.batch_exists(names) == 3
    shutil.rmtree(root)
    assert made.batch_exists(names) == 0  # no page reported held that is not on disk
    assert made.batch_set_v1(names, indices(pool, [0, 1, 2])) == [True] * 3
    assert len(list(root.rglob("*.kvb"))) == 3  # written again, not skipped
    assert made.batch_exists(names) == 3
    assert made.batch_get_v1(names, indices(pool, [4, 5, 6])) == [True] * 3
    assert [page_bytes_of(pool, p) for p in (4, 5, 6)] == [page_bytes_of(pool, p) for p in (0, 1, 2)]
    made.close()


def test_a_root_replaced_by_a_file_stores_nothing_and_reports_nothing_held(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    pool = mha_host_pool()
    made = make(root, 1, pool)
    names = keys(2)
    assert made.batch_set_v1(names, indices(pool, [0, 1])) == [True, True]
    shutil.rmtree(root)
    root.write_bytes(b"not a directory")
    assert made.batch_exists(names) == 0
    assert made.batch_set_v1(names, indices(pool, [0, 1])) == [False, False]  # cannot be written: not True
    assert made.batch_get_v1(names, indices(pool, [2, 3])) == [False, False]
    made.close()


# -- short values (Mooncake's address calls of less than a page) ------------------------------------
@pytest.mark.parametrize("v1", [1, 0])
def test_a_short_value_comes_back_only_at_its_own_length(v1: int, tmp_path: Path) -> None:
    pool = mha_host_pool()
    made = make(tmp_path / "kv", v1, pool)
    page = made.geometry.page_bytes  # type: ignore[union-attr]
    source = torch.randint(0, 255, (page,), dtype=torch.uint8)
    target = torch.zeros(page, dtype=torch.uint8)
    half, full = keys(2)
    assert made.set(half, None, source.data_ptr(), page // 2) is True
    assert made.set(full, None, source.data_ptr(), page) is True
    assert made.exists(half) and made.exists(full)
    assert made.get(half, target.data_ptr(), page) is False  # a short value is not a page
    assert made.get(half, target.data_ptr(), page // 4) is False  # nor a shorter value
    assert made.get(full, target.data_ptr(), page // 2) is False  # nor a page a short value
    assert not target.any()  # nothing copied by the refused gets
    assert made.get(half, target.data_ptr(), page // 2) is True
    assert torch.equal(target[: page // 2], source[: page // 2]) and not target[page // 2 :].any()
    assert made.get(full, target.data_ptr(), page) is True and torch.equal(target, source)
    if v1:  # one namespace with the page-buffer calls: a short value is never scattered into host pages
        before = page_bytes_of(pool, 3)
        assert made.batch_get_v1([half], indices(pool, [3])) == [False]
        assert page_bytes_of(pool, 3) == before
    assert made.set(keys(1)[0], None, source.data_ptr(), page - 8) is False  # no room for the trailer
    made.close()


def test_short_value_trailer_bytes_are_fixed() -> None:
    # Stored values carry this trailer: a change would make every stored short value unreadable.
    from tiering.sglang.pages import VALUE_MAGIC, VALUE_TRAILER_BYTES, Staging

    staging = Staging(1, 64)
    value = bytes(range(10))
    buf = ctypes.create_string_buffer(value, len(value))
    staging.gather(0, [(ctypes.addressof(buf), len(value))])
    row = bytes(staging.view[0:1].cast("B"))
    assert row == value + bytes(64 - 10 - VALUE_TRAILER_BYTES) + VALUE_MAGIC + (10).to_bytes(8, "little")
    assert VALUE_MAGIC.hex() == "9e3779b97f4a7c15" and staging.stored_length(0) == 10
    staging.close()

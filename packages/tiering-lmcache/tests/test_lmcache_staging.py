"""The LMCache adapter's staging buffer: faulted in at start, rows aligned for ``O_DIRECT``.

The first tests need no LMCache (the buffer and the row layout import none);
the last builds the adapter with LMCache's own factory (the ``lmcache``
hatch environment) and checks that the fs tier behind it moves rows with
``O_DIRECT``. Residency is read with ``mincore(2)`` and page faults with
``getrusage(RUSAGE_THREAD)``: Linux only.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import resource
import sys
from typing import Any

import pytest

from tiering.lmcache.keys import ROW_ALIGN, ROW_HEADER_BYTES, namespace_config, pack_row, row_bytes, row_payload
from tiering.lmcache.staging import StagingBuffer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and RUSAGE_THREAD: Linux")

PAGE = mmap.PAGESIZE


def resident_pages(address: int, length: int) -> int:
    """How many of the pages of ``[address, address + length)`` are resident (``mincore``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = -(-length // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(length), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(b & 1 for b in vec)


def thread_faults() -> int:
    """Minor page faults of the calling thread so far."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def row(view: memoryview, index: int) -> memoryview:
    """Row ``index`` of a ``(rows, row_bytes)`` view, flat (as the adapter's worker takes it)."""
    return view[index : index + 1].cast("B")


def test_rows_are_whole_aligned_pages_holding_the_length_and_the_object() -> None:
    assert ROW_ALIGN % PAGE == 0 or PAGE % ROW_ALIGN == 0
    for object_bytes in (1, 100, 4088, 4089, 4096, 1 << 20, (2 << 20) + 1, 32 << 20):
        rb = row_bytes(object_bytes)
        assert rb % ROW_ALIGN == 0, object_bytes
        assert object_bytes + ROW_HEADER_BYTES <= rb < object_bytes + ROW_HEADER_BYTES + ROW_ALIGN, object_bytes
    assert row_bytes(4088) == 4096 and row_bytes(4089) == 8192
    assert row_bytes(1 << 20) == (1 << 20) + 4096  # the 8-byte length costs a page on a page-multiple object
    assert namespace_config(1 << 20)["block_bytes"] == row_bytes(1 << 20)


def test_a_row_refuses_more_than_object_bytes_though_its_padding_has_room() -> None:
    row = memoryview(bytearray(row_bytes(100)))
    pack_row(row, memoryview(b"x" * 100), 100)
    assert bytes(row_payload(row)) == b"x" * 100 and bytes(row[ROW_HEADER_BYTES + 100 :]) == bytes(len(row) - 108)
    with pytest.raises(ValueError, match="object_bytes 100"):
        pack_row(row, memoryview(b"x" * 101), 100)


def test_the_staging_buffer_is_resident_and_page_aligned_from_the_start() -> None:
    rows, rb = 16, row_bytes(64 * 1024)
    staging = StagingBuffer(rows, rb)
    try:
        assert staging.address() % ROW_ALIGN == 0 and staging.view.shape == (rows, rb) and staging.nbytes == rows * rb
        assert resident_pages(staging.address(), staging.nbytes) == staging.nbytes // PAGE
        assert staging.populate_s > 0
        assert bytes(row(staging.view, 3)) == bytes(rb)  # zero-filled
    finally:
        staging.close()
    # The control: a mapping made without populating it has no page resident until written, so the
    # residency check above can fail.
    plain = mmap.mmap(-1, rows * rb, flags=mmap.MAP_PRIVATE)
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(plain))
        assert resident_pages(address, rows * rb) == 0
    finally:
        plain.close()


def test_copies_into_the_staging_rows_take_no_first_touch_faults() -> None:
    rows, rb = 8, row_bytes(256 * 1024)
    source = os.urandom(rb)
    pages = rows * rb // PAGE
    staging = StagingBuffer(rows, rb)
    try:
        before = thread_faults()
        for index in range(rows):
            row(staging.view, index)[:] = source
        faults = thread_faults() - before
        assert faults < pages // 8, f"{faults} faults copying into {pages} pre-faulted pages"
        assert bytes(row(staging.view, rows - 1)) == source
    finally:
        staging.close()
    # The control: the same copies into a fresh mapping fault once per page at least.
    plain = mmap.mmap(-1, rows * rb, flags=mmap.MAP_PRIVATE)
    view = memoryview(plain).cast("B", (rows, rb))
    try:
        before = thread_faults()
        for index in range(rows):
            row(view, index)[:] = source
        assert thread_faults() - before >= pages // 2
    finally:
        view.release()
        plain.close()


def test_staging_buffer_refuses_an_empty_shape() -> None:
    with pytest.raises(ValueError, match="0 x 4096"):
        StagingBuffer(0, 4096)


def test_the_adapter_starts_with_a_resident_buffer_and_its_fs_tier_uses_o_direct(tmp_path: Any) -> None:
    pytest.importorskip("lmcache", reason="the lmcache environment: hatch run lmcache:test")
    pytest.importorskip("tiering.fs", reason="tiering-fs is not installed")
    from lmcache.v1.distributed.l2_adapters import create_l2_adapter
    from lmcache.v1.distributed.l2_adapters.config import get_l2_adapter_config_class

    from tiering.fs.io.local import LocalBackend
    from tiering.lmcache.driver import load, memory_obj, object_key, store

    if (reason := LocalBackend.probe_direct(str(tmp_path))) is not None:
        pytest.skip(f"the test directory's filesystem has no O_DIRECT: {reason}")
    object_bytes = 64 * 1024 + 100  # not a page multiple: the row is padded to one
    config = {
        "type": "plugin",
        "module_path": "tiering.lmcache.adapter",
        "class_name": "TieringL2Adapter",
        "adapter_params": {
            "object_bytes": object_bytes,
            "staging_objects": 8,
            "tier": {"type": "fs", "root": str(tmp_path), "o_direct": True},  # refused at start if not usable
        },
    }
    adapter = create_l2_adapter(get_l2_adapter_config_class("plugin").from_dict(config))
    try:
        assert adapter.block_bytes == row_bytes(object_bytes) and adapter.block_bytes % ROW_ALIGN == 0
        staging = adapter.staging
        assert staging.address() % ROW_ALIGN == 0
        assert resident_pages(staging.address(), staging.nbytes) == staging.nbytes // PAGE
        status = adapter.report_status()
        assert status["staging_bytes"] == 8 * adapter.block_bytes and status["staging_populate_s"] > 0
        assert adapter.tier.stats()["o_direct"] == 1
        data = [os.urandom(object_bytes), os.urandom(object_bytes // 2)]
        keys = [object_key(1), object_key(2)]
        assert store(adapter, keys, [memory_obj(d) for d in data]).is_successful()
        targets = [memory_obj(len(d)) for d in data]
        assert load(adapter, keys, targets) == [0, 1]
        assert [bytes(t.byte_array) for t in targets] == data
    finally:
        adapter.close()

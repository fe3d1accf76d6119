"""Drive an LMCache L2 adapter as LMCache's storage controllers do: submit, poll the event fd, collect.

For the in-process connector (:mod:`~tiering.lmcache.connector`), tests and
``scripts/bench_lmcache.py``; works with any
``L2AdapterInterface`` (ours and LMCache's own). Imports LMCache and torch.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj
from lmcache.v1.platform.event_notifier import consume_fd

T = TypeVar("T")


def memory_obj(data: bytes | int) -> Any:
    """An LMCache CPU ``TensorMemoryObj`` (uint8) holding ``data``, or ``data`` zero bytes when an int."""
    raw = bytearray(data)
    tensor = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    meta = MemoryObjMetadata(shape=torch.Size([len(raw)]), dtype=torch.uint8, address=0, phy_size=len(raw), ref_count=1)
    return TensorMemoryObj(tensor, meta, None)


def object_key(index: int, model: str = "meta-llama/Llama-3.1-8B", **fields: Any) -> Any:
    """An LMCache ``ObjectKey`` with a 32-byte chunk hash made from ``index``."""
    fields.setdefault("kv_rank", 0)
    return ObjectKey(chunk_hash=index.to_bytes(8, "little") * 4, model_name=model, **fields)


def wait_for(fd: int, poll: Callable[[], T | None], timeout_s: float) -> T:
    """Wait on ``fd`` (as LMCache's controllers poll it) until ``poll()`` returns a result."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout_s
    while True:
        result = poll()
        if result is not None:
            return result
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no result within {timeout_s} s")
        if poller.poll(min(left, 0.1) * 1000):
            consume_fd(fd)


def store(adapter: Any, keys: Sequence[Any], objects: Sequence[Any], timeout_s: float = 60.0) -> Any:
    """Store and wait: the task's ``L2StoreResult``.

    Raises:
        TimeoutError: no result within ``timeout_s``.
    """
    task_id = adapter.submit_store_task(list(keys), list(objects))
    done: dict[int, Any] = {}

    def poll() -> Any:
        done.update(adapter.pop_completed_store_tasks())
        return done.pop(task_id, None)

    return wait_for(adapter.get_store_event_fd(), poll, timeout_s)


def lookup_and_lock(adapter: Any, keys: Sequence[Any], timeout_s: float = 60.0) -> list[int]:
    """Look up (and lock) and wait: the indices of the hits."""
    task_id = adapter.submit_lookup_and_lock_task(list(keys), {})
    bitmap = wait_for(
        adapter.get_lookup_and_lock_event_fd(), lambda: adapter.query_lookup_and_lock_result(task_id), timeout_s
    )
    return list(bitmap.get_indices_list())


def load(adapter: Any, keys: Sequence[Any], objects: Sequence[Any], timeout_s: float = 60.0) -> list[int]:
    """Load into ``objects`` and wait: the indices loaded."""
    task_id = adapter.submit_load_task(list(keys), list(objects))
    bitmap = wait_for(adapter.get_load_event_fd(), lambda: adapter.query_load_result(task_id), timeout_s)
    return list(bitmap.get_indices_list())

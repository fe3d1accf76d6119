"""Helpers shared by the fs tier tests (imported by name: conftest.py puts this folder on sys.path)."""

import itertools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from tiering.core import (
    JobMetadata,
    OffloadingSpec,
    ReqContext,
)
from tiering.core.base import block_view
from tiering.core.testing import block_payload, wait_for_jobs

WORKER = Path(__file__).with_name("fs_worker.py")
BB = 16 * 1024
CTX = ReqContext("test")
_ids = itertools.count(1)


def make_spec(block_bytes=BB, num_blocks=16, **extra):
    return OffloadingSpec(
        {"cpu_bytes_to_use": num_blocks * block_bytes, "block_bytes": block_bytes, "model": "fs-test", **extra}
    )


def store(tier, view, keys, slots=None, timeout=30):
    slots = list(range(len(keys))) if slots is None else slots
    for key, slot in zip(keys, slots):
        block_view(view, slot)[:] = block_payload(key, tier.block_bytes)
    job = JobMetadata(next(_ids), list(keys), slots, False, CTX)
    tier.submit_store(job)
    return wait_for_jobs(tier, [job.job_id], timeout)[job.job_id]


def store_many(tier, view, keys):
    n = view.shape[0]
    return all(store(tier, view, keys[i : i + n]) for i in range(0, len(keys), n))


def load(tier, view, keys, slots=None):
    slots = list(range(len(keys))) if slots is None else slots
    job = JobMetadata(next(_ids), list(keys), slots, True, CTX)
    tier.submit_load(job)
    return wait_for_jobs(tier, [job.job_id])[job.job_id]


def loads_exact(tier, view, keys):
    """Load keys in batches of the primary size; True when every batch succeeds byte-exact."""
    n = view.shape[0]
    for i in range(0, len(keys), n):
        batch = keys[i : i + n]
        for slot in range(len(batch)):
            block_view(view, slot)[:] = bytes(tier.block_bytes)
        if not load(tier, view, batch):
            return False
        for slot, key in enumerate(batch):
            if block_view(view, slot).tobytes() != block_payload(key, tier.block_bytes):
                return False
    return True


def block_files(root):
    return sorted(p for p in Path(root).rglob("*.kvb"))


def temp_files(root):
    return sorted(p for p in Path(root).rglob("*.tmp.*"))


def run_worker(cfg, **popen):
    return subprocess.Popen([sys.executable, str(WORKER), json.dumps(cfg)], stdout=subprocess.PIPE, text=True, **popen)


def hold_every_thread(tier):
    """Occupy each I/O thread of ``tier`` with a call that waits on a gate; returns (readers' gates, writers' gates)."""
    gates = {True: [], False: []}
    threads = tier.pool.n_read_threads + tier.pool.n_write_threads
    lock = threading.Lock()

    def hold():
        gate = threading.Event()
        with lock:
            gates["-read-" in threading.current_thread().name].append(gate)
        gate.wait(10)

    for _ in range(threads):
        tier.pool.submit_call("read", hold)
    deadline = time.monotonic() + 10
    while len(gates[True]) + len(gates[False]) < threads:
        assert time.monotonic() < deadline, "the I/O threads did not all start"
        time.sleep(0.001)
    return gates[True], gates[False]


def count_calls(monkeypatch, obj, name):
    """Wrap ``obj.name(keys, ...)``; returns the list that gets ``len(keys)`` of every call."""
    calls, real = [], getattr(obj, name)

    def counted(keys, *args, **kwargs):
        calls.append(len(keys))
        return real(keys, *args, **kwargs)

    monkeypatch.setattr(obj, name, counted)
    return calls

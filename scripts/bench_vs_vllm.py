"""Side by side: vLLM 0.33's built-in ``fs`` tier vs tiering's fs tier, both inside vLLM's own manager.

Run it in the vLLM test environment (packages/tiering-core/tests/vllm-requirements.txt):

    .venv-vllm/bin/python scripts/bench_vs_vllm.py --block-bytes 2MiB --blocks 512
    .venv-vllm/bin/python scripts/bench_vs_vllm.py --block-bytes 256KiB --blocks 4096

For each backend, in a fresh ``TieringOffloadingSpec(config).get_manager()``
(the real vLLM scheduler side on CPU, /dev/shm primary tier) with the same
block size, thread counts and key sequence:

1. store: N blocks written into the primary view (in place of the GPU DMA),
   ``complete_store`` in jobs of ``--batch`` blocks (one request each), timed
   until every cascade job has reported;
2. cold load: the primary tier is emptied (``reset_cache``), the page cache of
   the tier's files dropped (``POSIX_FADV_DONTNEED`` after ``sync``), then the
   same requests are looked up as the scheduler does (one pass per step) until
   every block is HIT in the primary tier, timed; the bytes are then compared
   with what was stored (outside the timing);
3. lookup: a fresh manager over the same directory (a restart), primary tier
   empty, one request of ``--lookup-blocks`` keys, looked up once per
   scheduler step as vLLM's scheduler does: the steps (rounds) and the
   scheduler time (the manager's ``lookup`` and ``on_schedule_end`` calls)
   until no key answers RETRY any more ("probe": every key's presence is
   known and its promotion started) and until every key is a HIT in the
   primary tier ("lookup": promotions done), and the part of that time spent
   inside the secondary tier's own methods ("tier s"; the rest is vLLM's
   manager, the same code for both tiers).

A third row, ``raw``, is the hardware path in the same run: the same number
of blocks written (one file each, ``O_DIRECT`` where the disk allows it, no
temporary, rename, header or check) and cold-read by a plain loop on
2 x ``--threads`` threads (both tiers let their read and write threads all
store when no load is queued, and all load). A tier near it is disk-bound;
when vLLM's tier is, no tier can be much faster than vLLM's.

vLLM's tier is ``{"type": "fs", "root_dir": ...}``; ours is
``{"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", "root": ...}``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from tiering.testing import vllm_driver as testing

BACKENDS = ("vllm-fs", "tiering-fs", "raw")


def parse_size(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    lower = text.strip().lower()
    for suffix, mult in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if lower.endswith(suffix):
            return int(float(lower[: -len(suffix)]) * mult)
    return int(lower)


def tier_entry(backend: str, root: str, threads: int) -> dict[str, Any]:
    if backend == "vllm-fs":
        return {"type": "fs", "root_dir": root, "n_read_threads": threads, "n_write_threads": threads}
    return {
        "type": "tiering_fs",
        "module_path": "tiering.core.vllm.tiers",
        "root": root,
        "n_read_threads": threads,
        "n_write_threads": threads,
        "model_revision": "bench",
    }


TIER_METHODS = (
    "lookup",
    "submit_load",
    "submit_store",
    "get_finished_jobs",
    "on_schedule_end",
    "on_new_request",
    "on_request_finished",
    "touch",
    "has_pending_work",
)


def time_tier_calls(tier: Any) -> list[float]:
    """Wrap ``tier``'s scheduler-side methods (instance attributes) to add their wall time into the returned cell."""
    spent = [0.0]

    def timed(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t0

        return call

    for name in TIER_METHODS:
        setattr(tier, name, timed(getattr(tier, name)))
    return spent


def drop_page_cache(root: str) -> None:
    os.sync()
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run_raw(args: argparse.Namespace, root: str) -> dict[str, float]:
    """The hardware path: one file per block written, then cold-read, by a plain pool of 2 x ``--threads``."""
    size, count = args.block_bytes, args.blocks
    buffer = mmap.mmap(-1, size * count)  # page aligned, as vLLM's primary region
    flat = memoryview(buffer)
    direct = getattr(os, "O_DIRECT", 0)
    probe = os.path.join(root, "probe")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | direct, 0o644)
        try:
            os.pwritev(fd, [flat[:4096]], 0)
        finally:
            os.close(fd)
    except OSError:
        direct = 0  # tmpfs or overlay: buffered, as both tiers would fall back to
    paths = [os.path.join(root, f"{i}.bin") for i in range(count)]
    for i in range(count):
        flat[i * size : i * size + 8] = i.to_bytes(8, "little")

    def write(i: int) -> None:
        fd = os.open(paths[i], os.O_CREAT | os.O_WRONLY | direct, 0o644)
        try:
            os.pwritev(fd, [flat[i * size : (i + 1) * size]], 0)
        finally:
            os.close(fd)

    def read(i: int) -> None:
        fd = os.open(paths[i], os.O_RDONLY | direct)
        try:
            os.preadv(fd, [flat[i * size : (i + 1) * size]], 0)
        finally:
            os.close(fd)

    out: dict[str, float] = {}
    with concurrent.futures.ThreadPoolExecutor(2 * args.threads) as pool:
        t0 = time.perf_counter()
        list(pool.map(write, range(count)))
        out["store_gbs"] = size * count / (time.perf_counter() - t0) / 1e9
        drop_page_cache(root)
        t0 = time.perf_counter()
        list(pool.map(read, range(count)))
        out["load_gbs"] = size * count / (time.perf_counter() - t0) / 1e9
    flat.release()
    buffer.close()
    return out


def run_backend(backend: str, args: argparse.Namespace, root: str) -> dict[str, float]:
    keys = [testing.make_key(i, seed=b"bench") for i in range(args.blocks)]
    requests = [keys[i : i + args.batch] for i in range(0, len(keys), args.batch)]
    entry = tier_entry(backend, root, args.threads)
    extra = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": (args.blocks + 8) * args.block_bytes,
        "secondary_tiers": [entry],
    }
    out: dict[str, float] = {}
    total = args.blocks * args.block_bytes
    with testing.vllm_manager(extra, worker_kv_bytes_per_block=args.block_bytes) as (_, _manager, driver):
        row = driver.row_bytes
        assert row == args.block_bytes, (row, args.block_bytes)
        data = {k: testing.payload(k, row) for k in keys}
        t0 = time.perf_counter()
        contexts = driver.store(requests, data.__getitem__)
        driver.wait_idle(timeout_s=600)
        out["store_s"] = time.perf_counter() - t0
        driver.finish(contexts)
        driver.evict_all()
        drop_page_cache(root)

        contexts = [driver.new_context("load") for _ in requests]
        t0 = time.perf_counter()
        outcome = driver.lookup(requests, contexts, timeout_s=600)
        out["load_s"] = time.perf_counter() - t0
        if outcome.hits != [len(r) for r in requests]:
            raise SystemExit(f"{backend}: cold load found {sum(outcome.hits)} of {args.blocks} blocks")
        for req, ctx in zip(requests, contexts):
            if driver.read(req, ctx) != [data[k] for k in req]:
                raise SystemExit(f"{backend}: loaded bytes differ from stored bytes")
        driver.finish(contexts)
    out["store_gbs"] = total / out["store_s"] / 1e9
    out["load_gbs"] = total / out["load_s"] / 1e9

    drop_page_cache(root)
    lookup_keys = keys[: args.lookup_blocks]
    extra["cpu_bytes_to_use"] = (len(lookup_keys) + 8) * args.block_bytes
    t0 = time.perf_counter()
    with testing.vllm_manager(extra, worker_kv_bytes_per_block=args.block_bytes) as (_, manager, driver):
        out["open_s"] = time.perf_counter() - t0
        tier_spent = time_tier_calls(manager.secondary_tiers[0])
        ctx = driver.new_context("lookup")
        outcome = driver.lookup([lookup_keys], [ctx], timeout_s=600)
        if outcome.hits != [len(lookup_keys)]:
            raise SystemExit(f"{backend}: lookup found {outcome.hits[0]} of {len(lookup_keys)} blocks")
        out["lookup_rounds"] = outcome.rounds
        out["lookup_s"] = outcome.seconds
        out["probe_rounds"] = outcome.probe_rounds
        out["probe_s"] = outcome.probe_seconds
        out["tier_s"] = tier_spent[0]
        driver.finish([ctx])
        driver.wait_idle(timeout_s=600)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=512, help="N blocks stored then cold-loaded")
    parser.add_argument("--block-bytes", type=parse_size, default=2 << 20, help="bytes per block (2MiB, 256KiB)")
    parser.add_argument("--threads", type=int, default=16, help="read threads = write threads, both tiers")
    parser.add_argument("--batch", type=int, default=16, help="blocks per request (= per store/load job)")
    parser.add_argument("--lookup-blocks", type=int, default=4096, help="keys of the single-request lookup phase")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per backend, in rotating order; the median is printed"
    )
    parser.add_argument("--dir", default=None, help="directory on the disk to test (default: a temp dir)")
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help="comma-separated subset of " + ",".join(BACKENDS)
    )
    args = parser.parse_args(argv)
    args.lookup_blocks = min(args.lookup_blocks, args.blocks)
    base = tempfile.mkdtemp(prefix="bench-vs-vllm-", dir=args.dir)
    results: dict[str, list[dict[str, float]]] = {}
    try:
        order = args.backends.split(",")
        for rep in range(args.repeat):
            # Rotate the order: a shared disk's throughput drifts within a pass, so a fixed order would
            # favour one position every time; with --repeat a multiple of the backends' count, each
            # backend runs in each position equally often.
            shift = rep % len(order)
            for backend in order[shift:] + order[:shift]:
                root = os.path.join(base, f"{backend}-{rep}")
                os.makedirs(root)
                try:
                    run = run_raw if backend == "raw" else functools.partial(run_backend, backend)
                    results.setdefault(backend, []).append(run(args, root))
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                print(f"  run {rep + 1}/{args.repeat} {backend}: {results[backend][-1]}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    def med(backend: str, field: str) -> float:
        return statistics.median(r[field] for r in results[backend])

    print(
        f"# {args.blocks} x {args.block_bytes} B blocks, {args.threads}+{args.threads} threads, "
        f"{args.batch} blocks/job, median of {args.repeat}, lookup request of {args.lookup_blocks} blocks"
    )
    print("(lookup: until every key is HIT in the primary tier; probe: until no key answers RETRY)")
    columns = [
        ("store GB/s", "store_gbs", 10, 3),
        ("load GB/s", "load_gbs", 10, 3),
        ("lookup rounds", "lookup_rounds", 14, 0),
        ("lookup s", "lookup_s", 9, 4),
        ("probe rounds", "probe_rounds", 13, 0),
        ("probe s", "probe_s", 8, 4),
        ("tier s", "tier_s", 7, 4),
        ("open s", "open_s", 7, 2),
    ]
    print(f"{'backend':<11} " + " ".join(f"{title:>{width}}" for title, _, width, _ in columns))
    for backend in results:
        cells = [
            f"{med(backend, field):>{width}.{digits}f}" if field in results[backend][0] else f"{'-':>{width}}"
            for _, field, width, digits in columns
        ]
        print(f"{backend:<11} " + " ".join(cells))
    ours, theirs = "tiering-fs", "vllm-fs"
    if ours in results and theirs in results:
        print(
            f"ratio tiering/vllm: store {med(ours, 'store_gbs') / med(theirs, 'store_gbs'):.2f}x, "
            f"load {med(ours, 'load_gbs') / med(theirs, 'load_gbs'):.2f}x, "
            f"lookup scheduler time {med(theirs, 'lookup_s') / max(med(ours, 'lookup_s'), 1e-9):.1f}x less "
            f"({med(theirs, 'lookup_rounds'):.0f} vs {med(ours, 'lookup_rounds'):.0f} rounds), "
            f"probe {med(theirs, 'probe_s') / max(med(ours, 'probe_s'), 1e-9):.1f}x less "
            f"({med(theirs, 'probe_rounds'):.0f} vs {med(ours, 'probe_rounds'):.0f} rounds), "
            f"time in the tier's methods {med(theirs, 'tier_s') / max(med(ours, 'tier_s'), 1e-9):.1f}x less"
        )
    if "raw" in results:
        for backend in (b for b in (theirs, ours) if b in results):
            print(
                f"ratio {backend}/raw: store {med(backend, 'store_gbs') / med('raw', 'store_gbs'):.2f}x, "
                f"load {med(backend, 'load_gbs') / med('raw', 'load_gbs'):.2f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

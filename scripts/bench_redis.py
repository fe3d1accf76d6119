#!/usr/bin/env python3
"""Benchmark the redis tier against a raw redis-py pipeline loop: same server, same connections, same run.

Starts a local ``redis-server`` (no persistence) on 127.0.0.1, or uses --url.
For each block size it stores then loads N blocks through
``RedisSecondaryTierManager`` (jobs of --job-blocks blocks, all submitted at
once, ``max_connections`` = --connections, ``pipeline_blocks`` = --pipeline)
and through a raw loop: --connections threads, each sending its share of the
blocks as pipelines of --pipeline ``SET`` (the slot's bytes) / ``GET`` (copied
into the slot), over a redis-py pool of the same size. Passes alternate which
path runs first; the server is flushed between passes. The tier, like the raw
loop's pool, lives through every pass of a block size (its connections stay
open), each pass with new keys; --fresh-tier builds one per pass. Printed: the median
GB/s of each path, the median of the per-pass (paired) ratios tier / raw
and how many pairs meet the 0.9 target, so a pass slowed by other load on
the machine shows as one outlier pair, not as a skewed ratio. Then a lookup of 4096 keys
(half stored by another process's tier) is asked in scheduler rounds
--step-ms apart, printing how many rounds it took to resolve.

    .venv/bin/python scripts/bench_redis.py --rounds 9 --connections 4
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import threading
import time
from typing import Any

import redis

from tiering.core import JobMetadata, OffloadingSpec, ReqContext
from tiering.core.base import block_view
from tiering.core.primary import allocate_host_buffer
from tiering.redis import RedisSecondaryTierManager
from tiering.redis.testing import LocalRedis
from tiering.testing.harness import make_key, wait_for_jobs

CTX = ReqContext("bench")


def make_tier(
    url: str, spec: OffloadingSpec, view: memoryview, args: argparse.Namespace, **extra: Any
) -> RedisSecondaryTierManager:
    return RedisSecondaryTierManager(
        spec, view, "redis", url=url, max_connections=args.connections, pipeline_blocks=args.pipeline, prefix="bench",
        **extra,
    )  # fmt: skip


def tier_pass(tier: RedisSecondaryTierManager, keys: list[Any], n: int, job_blocks: int, load: bool) -> float:
    jobs = []
    ids = iter(range(1, 1 << 30))
    started = time.perf_counter()
    for start in range(0, n, job_blocks):
        ks = keys[start : start + job_blocks]
        job = JobMetadata(next(ids), ks, list(range(start, start + len(ks))), load, CTX)
        (tier.submit_load if load else tier.submit_store)(job)
        jobs.append(job.job_id)
    results = wait_for_jobs(tier, jobs, timeout_s=300)
    elapsed = time.perf_counter() - started
    assert all(results.values()), f"{'load' if load else 'store'} jobs failed"
    return elapsed


def raw_pass(
    pool: redis.ConnectionPool, view: memoryview, names: list[str], args: argparse.Namespace, load: bool
) -> float:
    client = redis.Redis(connection_pool=pool)
    n = len(names)
    share = -(-n // args.connections)
    errors: list[BaseException] = []

    def work(lo: int, hi: int) -> None:
        try:
            for start in range(lo, hi, args.pipeline):
                idx = range(start, min(hi, start + args.pipeline))
                pipe = client.pipeline(transaction=False)
                for i in idx:
                    if load:
                        pipe.get(names[i])
                    else:
                        pipe.set(names[i], block_view(view, i))
                replies = pipe.execute()
                if load:
                    for i, reply in zip(idx, replies):
                        block_view(view, i)[:] = reply
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(lo, min(n, lo + share))) for lo in range(0, n, share)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


def bench_size(url: str, block_bytes: int, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """Store then load ``n`` blocks through both paths, ``args.rounds`` passes; returns the figures printed."""
    spec = OffloadingSpec({"cpu_bytes_to_use": n * block_bytes, "block_bytes": block_bytes, "model": "bench/redis"})
    view = allocate_host_buffer(n, block_bytes)
    for i in range(n):
        block_view(view, i)[:] = os.urandom(64) * (block_bytes // 64)
    pool = redis.ConnectionPool.from_url(url, max_connections=args.connections)
    flusher = redis.Redis.from_url(url)
    times: dict[str, list[float]] = {"tier store": [], "raw store": [], "tier load": [], "raw load": []}
    # One tier for every pass, as the raw loop keeps one pool: both paths' connections stay open (and their TCP
    # windows grown) from pass to pass. --fresh-tier builds a new tier (new connections) for each pass instead.
    kept = None if args.fresh_tier else make_tier(url, spec, view, args, startup_scan=False)
    for r in range(args.rounds):
        for path in ("tier", "raw") if r % 2 == 0 else ("raw", "tier"):
            flusher.flushall()
            if path == "tier":
                tier = kept or make_tier(url, spec, view, args, startup_scan=False)
                keys = [make_key(i, f"r{r}".encode()) for i in range(n)]  # new keys: no store is skipped
                times["tier store"].append(tier_pass(tier, keys, n, args.job_blocks, load=False))
                times["tier load"].append(tier_pass(tier, keys, n, args.job_blocks, load=True))
                if kept is None:
                    tier.shutdown()
            else:
                names = [f"raw:{r}:{i}" for i in range(n)]
                times["raw store"].append(raw_pass(pool, view, names, args, load=False))
                times["raw load"].append(raw_pass(pool, view, names, args, load=True))
    if kept is not None:
        kept.shutdown()
    flusher.flushall()
    total = n * block_bytes
    gbs = {k: total / statistics.median(v) / 1e9 for k, v in times.items()}
    out: dict[str, Any] = {"block_kib": block_bytes // 1024, "blocks": n, **{k: round(v, 3) for k, v in gbs.items()}}
    line = f"{block_bytes // 1024:>5} KiB x {n:>4}:"
    for what in ("store", "load"):
        # Paired ratios: tier and raw of the same pass ran back to back, so a pass's ratio is not skewed by
        # load that came and went between passes; the median of the pairs and how many meet the target.
        pairs = [raw / tier for tier, raw in zip(times[f"tier {what}"], times[f"raw {what}"], strict=True)]
        ratio = statistics.median(pairs)
        meeting = sum(1 for x in pairs if x >= 0.9)
        out[f"{what} ratio"] = round(ratio, 3)
        out[f"{what} pairs >= 0.9"] = meeting
        line += (
            f" {what} tier {gbs[f'tier {what}']:.2f} GB/s raw {gbs[f'raw {what}']:.2f} GB/s"
            f" ratio {ratio:.2f} ({meeting}/{len(pairs)} pairs >= 0.9) |"
        )
    print(line.rstrip(" |"), flush=True)
    if args.verbose:
        for what in ("store", "load"):
            print(f"    {what} pairs: " + " ".join(f"{r / t:.2f}" for t, r in zip(times[f"tier {what}"],
                  times[f"raw {what}"], strict=True)), flush=True)  # fmt: skip
    pool.disconnect()
    flusher.close()
    return out


def bench_lookup(url: str, args: argparse.Namespace) -> None:
    block_bytes = 4096
    spec = OffloadingSpec({"cpu_bytes_to_use": 64 * block_bytes, "block_bytes": block_bytes, "model": "bench/redis"})
    view = allocate_host_buffer(64, block_bytes)
    writer = make_tier(url, spec, view, args)
    present = [make_key(i, b"lookup") for i in range(2048)]
    ids = iter(range(1, 1 << 30))
    jobs = []
    for start in range(0, len(present), 64):
        job = JobMetadata(next(ids), present[start : start + 64], list(range(64)), False, CTX)
        writer.submit_store(job)
        jobs.append(job.job_id)
    wait_for_jobs(writer, jobs, timeout_s=120)
    writer.shutdown()
    results = []
    for trial in range(args.lookup_trials):
        reader = make_tier(url, spec, view, args, startup_scan=False)  # knows nothing: every key goes to the server
        keys = present + [make_key(i, b"lookup-absent-%d" % trial) for i in range(2048)]
        rounds = 0
        started = time.perf_counter()
        pending = keys
        while pending:
            rounds += 1
            answers = {k: reader.lookup(k, CTX) for k in pending}
            pending = [k for k, v in answers.items() if v is None]
            if pending:
                time.sleep(args.step_ms / 1000)
        elapsed = time.perf_counter() - started
        hits = sum(1 for k in present if reader.lookup(k, CTX))
        batches = reader.stats()["lookup_batches"]
        reader.shutdown()
        results.append(rounds)
        print(
            f"lookup of {len(keys)} keys, trial {trial + 1}: {rounds} scheduler rounds ({args.step_ms:g} ms apart), "
            f"{elapsed * 1000:.1f} ms, {batches} batches; {hits} of {len(present)} present found",
            flush=True,
        )
    within = sum(1 for r in results if r <= 2)
    print(
        f"lookup rounds: median {statistics.median(results):g}, {within} of {len(results)} trials within 2 rounds "
        "(target: <= 2)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="an existing server (default: start a local redis-server)")
    parser.add_argument("--rounds", type=int, default=9, help="passes per block size (each: tier and raw)")
    parser.add_argument("--verbose", action="store_true", help="print every pass's paired ratio")
    parser.add_argument("--fresh-tier", action="store_true", help="a new tier (new connections) for every pass")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--pipeline", type=int, default=8, help="blocks per pipeline")
    parser.add_argument("--job-blocks", type=int, default=16, help="blocks per tier job")
    parser.add_argument("--small", type=int, default=256, help="number of 256 KiB blocks")
    parser.add_argument("--large", type=int, default=64, help="number of 2 MiB blocks")
    parser.add_argument("--step-ms", type=float, default=10.0, help="scheduler step of the lookup test")
    parser.add_argument("--lookup-trials", type=int, default=5, help="trials of the 4096-key lookup")
    args = parser.parse_args()
    logging.getLogger("tiering.redis").setLevel(logging.ERROR)  # the no-maxmemory warning of the bench server
    server = None if args.url else LocalRedis().start()
    url = args.url or server.url  # type: ignore[union-attr]
    try:
        print(f"server {url}, {args.connections} connections, {args.pipeline} blocks per pipeline", flush=True)
        bench_size(url, 256 * 1024, args.small, args)
        bench_size(url, 2 * 1024 * 1024, args.large, args)
        bench_lookup(url, args)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()

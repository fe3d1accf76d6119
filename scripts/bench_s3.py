#!/usr/bin/env python3
"""Benchmark the S3 tier against a raw boto3 loop, same server, same concurrency, same run.

Starts moto's server in a separate process on 127.0.0.1 (so its CPU does not
share this process's GIL; ``tiering.s3.testing.moto_server``), or uses
--endpoint. For each block size it PUTs then GETs N blocks through
``S3SecondaryTierManager`` (one job per block, all submitted at once,
``max_concurrency`` = --concurrency) and through a plain
``ThreadPoolExecutor`` of ``put_object`` / ``get_object().read()`` calls with
the same object size and botocore settings. One untimed raw pass warms the
server up; rounds alternate which path runs first; the median MB/s of each
path and their ratio are printed.

    .venv-s3/bin/python scripts/bench_s3.py --rounds 3 --concurrency 8
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import statistics
import sys
import time

import boto3
from botocore.config import Config

from tiering.core import JobMetadata, OffloadingSpec, ReqContext
from tiering.core.base import block_view
from tiering.core.format import HEADER_SIZE
from tiering.core.primary import allocate_host_buffer
from tiering.s3 import S3SecondaryTierManager
from tiering.s3.testing import moto_server
from tiering.testing.harness import make_key, wait_for_jobs

BUCKET = "bench"
CREDS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}


def raw_client(endpoint: str, concurrency: int):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(
            max_pool_connections=concurrency + 1,
            retries={"mode": "standard", "total_max_attempts": 3},
            connect_timeout=5,
            read_timeout=60,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
        **CREDS,
    )


def bench_tier(endpoint: str, view: memoryview, spec: OffloadingSpec, n: int, concurrency: int, salt: bytes):
    tier = S3SecondaryTierManager(
        spec,
        view,
        "s3",
        bucket=BUCKET,
        prefix=f"tier-{salt.decode()}",
        endpoint_url=endpoint,
        region_name="us-east-1",
        max_concurrency=concurrency,
        read_timeout=60,
        **CREDS,
    )
    ctx = ReqContext("bench")
    keys = [make_key(i, salt) for i in range(n)]
    try:
        jobs = [JobMetadata(i + 1, [k], [i], False, ctx) for i, k in enumerate(keys)]
        t0 = time.perf_counter()
        for job in jobs:
            tier.submit_store(job)
        assert all(wait_for_jobs(tier, [j.job_id for j in jobs], 600).values()), "a store failed"
        put_s = time.perf_counter() - t0
        jobs = [JobMetadata(n + i + 1, [k], [n - 1 - i], True, ctx) for i, k in enumerate(keys)]
        t0 = time.perf_counter()
        for job in jobs:
            tier.submit_load(job)
        assert all(wait_for_jobs(tier, [j.job_id for j in jobs], 600).values()), "a load failed"
        get_s = time.perf_counter() - t0
    finally:
        tier.shutdown()
    return put_s, get_s


def bench_raw(endpoint: str, view: memoryview, n: int, concurrency: int, salt: bytes):
    client = raw_client(endpoint, concurrency)
    header = bytes(HEADER_SIZE)
    names = [f"raw-{salt.decode()}/{i:06d}" for i in range(n)]

    def put(i: int) -> None:
        client.put_object(Bucket=BUCKET, Key=names[i], Body=b"".join((header, block_view(view, i))))

    def get(i: int) -> None:
        data = client.get_object(Bucket=BUCKET, Key=names[i])["Body"].read()
        block_view(view, n - 1 - i)[:] = memoryview(data)[HEADER_SIZE:]

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        t0 = time.perf_counter()
        list(pool.map(put, range(n)))
        put_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        list(pool.map(get, range(n)))
        get_s = time.perf_counter() - t0
    client.close()
    return put_s, get_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", help="use this S3 endpoint instead of starting moto (bucket 'bench' must exist)")
    parser.add_argument("--blocks-256k", type=int, default=256, help="blocks of 256 KiB (default %(default)s)")
    parser.add_argument("--blocks-2m", type=int, default=64, help="blocks of 2 MiB (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        server = None if args.endpoint else stack.enter_context(moto_server(BUCKET, process=True))
        endpoint = server.endpoint_url if server else args.endpoint
        print(f"endpoint {endpoint}, concurrency {args.concurrency}, {args.rounds} rounds (median)")
        print(f"{'size':>8} {'blocks':>6} {'op':>4} {'tier MB/s':>10} {'raw MB/s':>9} {'ratio':>6}")
        for size, n in ((256 * 1024, args.blocks_256k), (2 * 1024 * 1024, args.blocks_2m)):
            spec = OffloadingSpec({"cpu_bytes_to_use": n * size, "block_bytes": size, "model": "bench"})
            view = allocate_host_buffer(n, size)
            for i in range(n):
                block_view(view, i)[:] = os.urandom(size)
            rates: dict[str, list[float]] = {"tier-put": [], "tier-get": [], "raw-put": [], "raw-get": []}
            mb = n * (size + HEADER_SIZE) / 1e6
            bench_raw(endpoint, view, n, args.concurrency, f"warmup-{size}".encode())  # a cold server is slower
            for r in range(args.rounds):
                salt = f"{size}-{r}".encode()
                order = ("tier", "raw") if r % 2 == 0 else ("raw", "tier")
                for path in order:
                    if path == "tier":
                        put_s, get_s = bench_tier(endpoint, view, spec, n, args.concurrency, salt)
                    else:
                        put_s, get_s = bench_raw(endpoint, view, n, args.concurrency, salt)
                    rates[f"{path}-put"].append(mb / put_s)
                    rates[f"{path}-get"].append(mb / get_s)
                if server is not None:  # free the server's memory between rounds
                    server.reset()
            for op in ("put", "get"):
                tier, raw = statistics.median(rates[f"tier-{op}"]), statistics.median(rates[f"raw-{op}"])
                label = f"{size // 1024} KiB" if size < 2**20 else f"{size // 2**20} MiB"
                print(f"{label:>8} {n:>6} {op:>4} {tier:>10.1f} {raw:>9.1f} {tier / raw:>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark our fs tier as an LMCache L2 adapter against LMCache's own fs adapter, in one run.

Both adapters are built by LMCache's own factory from the config a user
writes (``--l2-adapter`` JSON) and driven through ``L2AdapterInterface`` as
LMCache's storage controllers drive them: every task is submitted at once,
completions are collected from the event fds. Per adapter: store N objects
(random bytes) in tasks of ``--batch`` objects, ``os.sync``, drop the page
cache (root only; otherwise the loads are warm and the script says so),
look them all up, load them into fresh L1-style buffers and compare every
byte with what was stored. Prints GB/s (1e9 bytes/s of object payload) and
the ratio ours / LMCache's, and what the one copy our adapter makes per
object (between LMCache's buffer and the tier's staging row) costs: the
time of copying every object once, against our load time.

    python scripts/bench_lmcache.py --objects 256 --object-mib 4 --batch 16

Needs the ``lmcache`` hatch environment (``hatch run lmcache:bench``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import get_l2_adapter_config_class

from tiering.lmcache.driver import lookup_and_lock, memory_obj, object_key, wait_for


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def build(config: dict[str, Any]) -> Any:
    return create_l2_adapter(get_l2_adapter_config_class(config["type"]).from_dict(config))


OURS, THEIRS = "tiering fs (plugin)", "LMCache fs"


def config(name: str, root: str, object_bytes: int, o_direct: bool | str = "auto") -> dict[str, Any]:
    """The ``--l2-adapter`` JSON of adapter ``name`` over a fresh directory under ``root``."""
    if name == THEIRS:
        return {"type": "fs", "base_path": os.path.join(root, "lmcache")}
    os.makedirs(os.path.join(root, "tiering"))  # the fs tier uses a root, it does not create one
    return {
        "type": "plugin",
        "module_path": "tiering.lmcache.adapter",
        "class_name": "TieringL2Adapter",
        "adapter_params": {
            "object_bytes": object_bytes,
            "tier": {"type": "fs", "root": os.path.join(root, "tiering"), "o_direct": o_direct},
        },
    }


def run_all(adapter: Any, kind: str, batches: list[tuple[list[Any], list[Any]]], timeout_s: float = 600.0) -> list[Any]:
    """Submit every batch at once, then collect each result (store: L2StoreResult, load: indices)."""
    if kind == "store":
        ids = [adapter.submit_store_task(k, o) for k, o in batches]
        done: dict[int, Any] = {}

        def poll() -> Any:
            done.update(adapter.pop_completed_store_tasks())
            return True if all(i in done for i in ids) else None

        wait_for(adapter.get_store_event_fd(), poll, timeout_s)
        return [done[i] for i in ids]
    ids = [adapter.submit_load_task(k, o) for k, o in batches]
    results: dict[int, Any] = {}

    def poll_load() -> Any:
        for i in ids:
            if i not in results and (bitmap := adapter.query_load_result(i)) is not None:
                results[i] = list(bitmap.get_indices_list())
        return True if len(results) == len(ids) else None

    wait_for(adapter.get_load_event_fd(), poll_load, timeout_s)
    return [results[i] for i in ids]


def bench(name: str, config: dict[str, Any], payloads: list[bytes], batch: int) -> dict[str, float]:
    keys = [object_key(i) for i in range(len(payloads))]
    total = sum(map(len, payloads))
    adapter = build(config)
    try:
        sources = [memory_obj(p) for p in payloads]
        chunks = [(keys[i : i + batch], sources[i : i + batch]) for i in range(0, len(keys), batch)]
        t0 = time.perf_counter()
        stored = run_all(adapter, "store", chunks)
        os.sync()
        store_s = time.perf_counter() - t0
        if not all(r.is_successful() for r in stored):
            raise SystemExit(f"{name}: a store task failed")
    finally:
        adapter.close()
    cold = drop_caches()
    adapter = build(config)  # a fresh process's view: nothing cached in the adapter
    try:
        hits = lookup_and_lock(adapter, keys)
        if hits != list(range(len(keys))):
            raise SystemExit(f"{name}: {len(keys) - len(hits)} object(s) not found after the store")
        targets = [memory_obj(len(p)) for p in payloads]
        chunks = [(keys[i : i + batch], targets[i : i + batch]) for i in range(0, len(keys), batch)]
        t0 = time.perf_counter()
        loaded = run_all(adapter, "load", chunks)
        load_s = time.perf_counter() - t0
        adapter.submit_unlock(keys)
        if sum(map(len, loaded)) != len(keys):
            raise SystemExit(f"{name}: {len(keys) - sum(map(len, loaded))} object(s) failed to load")
        bad = sum(bytes(t.byte_array) != p for t, p in zip(targets, payloads, strict=True))
        if bad:
            raise SystemExit(f"{name}: {bad} object(s) loaded with other bytes than stored")
    finally:
        adapter.close()
    return {"store_gbs": total / store_s / 1e9, "load_gbs": total / load_s / 1e9, "cold": float(cold)}


def copy_seconds(payloads: list[bytes]) -> float:
    """Seconds to copy every payload once into a staging row (the adapter's one copy per object)."""
    row = memoryview(bytearray(max(map(len, payloads))))
    row[: len(payloads[0])] = payloads[0]  # the row's pages mapped, as the adapter's staging rows are
    t0 = time.perf_counter()
    for payload in payloads:
        row[: len(payload)] = payload
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=128, help="objects stored and loaded per adapter")
    parser.add_argument("--object-mib", type=float, default=2.0, help="object size, MiB (LMCache's chunk object)")
    parser.add_argument("--batch", type=int, default=16, help="objects per store / load task")
    parser.add_argument("--dir", default=None, help="directory for both roots (default: a temporary one)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per adapter, the best one is shown")
    parser.add_argument(
        "--o-direct",
        choices=("auto", "true", "false"),
        default="auto",
        help="our fs tier's o_direct (auto: O_DIRECT on a local root; LMCache's fs adapter uses the page cache)",
    )
    args = parser.parse_args()
    object_bytes = int(args.object_mib * 1024 * 1024)
    payloads = [os.urandom(object_bytes) for _ in range(args.objects)]
    total_mib = object_bytes * args.objects / 2**20
    print(
        f"{args.objects} objects of {object_bytes} bytes ({total_mib:.0f} MiB), tasks of {args.batch}, "
        f"our fs tier's o_direct {args.o_direct}"
    )
    results: dict[str, dict[str, float]] = {}
    for _ in range(args.repeat):
        for name in (OURS, THEIRS):
            base = tempfile.mkdtemp(prefix="bench-lmcache-", dir=args.dir)
            try:
                o_direct = {"auto": "auto", "true": True, "false": False}[args.o_direct]
                result = bench(name, config(name, base, object_bytes, o_direct), payloads, args.batch)
            finally:
                shutil.rmtree(base, ignore_errors=True)
            best = results.setdefault(name, result)
            for key in ("store_gbs", "load_gbs"):
                best[key] = max(best[key], result[key])
    print("| adapter | store GB/s | load GB/s (verified) |\n|---|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['store_gbs']:.2f} | {r['load_gbs']:.2f} |")
    ours, theirs = results[OURS], results[THEIRS]
    print(
        f"ratio ours / LMCache's: store {ours['store_gbs'] / theirs['store_gbs']:.2f}x, "
        f"load {ours['load_gbs'] / theirs['load_gbs']:.2f}x"
    )
    total = object_bytes * args.objects
    copy_s = min(copy_seconds(payloads) for _ in range(3))
    print(
        f"one staging copy of every object: {copy_s * 1e3:.1f} ms ({total / copy_s / 1e9:.1f} GB/s), "
        f"{100 * copy_s / (total / ours['load_gbs'] / 1e9):.0f}% of our load time"
    )
    if not all(r["cold"] for r in results.values()):
        print("note: page cache not dropped (not root): loads are warm")


if __name__ == "__main__":
    main()

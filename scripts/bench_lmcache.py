#!/usr/bin/env python3
"""Benchmark our fs tier as an LMCache L2 adapter against LMCache's own fs adapters (Python and C++), paired.

Every adapter is built by LMCache's own factory from the config a user
writes (``--l2-adapter`` JSON) and driven through ``L2AdapterInterface`` as
LMCache's storage controllers drive it: every task is submitted at once,
completions are collected from the event fds.

**Steady state** (the figures to compare): per round, each adapter in turn
(the order rotates from round to round) gets a fresh directory, is built,
and first runs a warm-up pass (store and load of other objects, so that
every buffer on the path has been used once); then the timed pass: store N
objects (random bytes) in tasks of ``--batch`` objects, ``os.sync``, drop the
page cache (as root; else the loads are warm and the script says so), look
every object up, load them all into L1-style buffers that were written
before (as LMCache's L1 arena is), and compare every byte. One adapter
instance serves the whole round, as in a running server. Prints GB/s (1e9
bytes/s of object payload) per round, the ratios ours / theirs per round
and their medians.

**LMCache's own benchmark**, ``lmcache bench l2`` (LMCache's CLI, in the
same environment), against the same three adapter configs: per round (order
rotating), each adapter gets a fresh directory, one ``lmcache bench l2 --only
store`` process stores ``--bench-rounds`` rounds of ``--batch`` objects
(after a warm-up round), ``sync`` and the page cache dropped, then a second
``--only load`` process loads the same keys (LMCache's bench uses the same
keys in both) and every object must be reported loaded. Prints LMCache's
throughput (its MB/s, 1e6 bytes/s) per round and the ratios. Its store time
is until the adapter reports the task done (LMCache's adapters write into
the page cache; ours into the disk, ``O_DIRECT``). LMCache's bench compares
bytes only when store and load run in one process, so that comparison is the
steady-state pass above; our adapter checks every load's checksum in both.

**First-touch cost** (paid once): what our adapter pays at start to fault in
its staging buffer (``staging_populate_s`` of ``report_status``, per GiB),
and, as the reason, one copy of every object into a freshly mapped buffer
against the same copy into a mapped one.

    python scripts/bench_lmcache.py --objects 64 --object-mib 2 --batch 16 --rounds 3

Needs the ``lmcache`` hatch environment (``hatch run lmcache:bench``).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import get_l2_adapter_config_class

from tiering.lmcache.driver import lookup_and_lock, memory_obj, object_key, wait_for

OURS, FS, NATIVE = "tiering fs (plugin)", "LMCache fs", "LMCache fs_native (C++)"


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


def config(name: str, root: str, object_bytes: int, o_direct: bool | str, native_odirect: bool) -> dict[str, Any]:
    """The ``--l2-adapter`` JSON of adapter ``name`` over a fresh directory under ``root``."""
    if name == FS:
        return {"type": "fs", "base_path": os.path.join(root, "lmcache")}
    if name == NATIVE:
        return {"type": "fs_native", "base_path": os.path.join(root, "native"), "use_odirect": native_odirect}
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


def one_pass(
    name: str, adapter: Any, first: int, payloads: list[bytes], targets: list[Any], batch: int
) -> tuple[float, float, bool]:
    """Store, sync, drop the page cache, look up, load and verify ``payloads`` under keys ``first``...

    Returns:
        Store seconds (until ``os.sync`` returned), load seconds, whether the page cache was dropped.
    """
    keys = [object_key(first + i) for i in range(len(payloads))]
    sources = [memory_obj(p) for p in payloads]
    chunks = [(keys[i : i + batch], sources[i : i + batch]) for i in range(0, len(keys), batch)]
    t0 = time.perf_counter()
    stored = run_all(adapter, "store", chunks)
    os.sync()
    store_s = time.perf_counter() - t0
    if not all(r.is_successful() for r in stored):
        raise SystemExit(f"{name}: a store task failed")
    cold = drop_caches()
    hits = lookup_and_lock(adapter, keys)
    if hits != list(range(len(keys))):
        raise SystemExit(f"{name}: {len(keys) - len(hits)} object(s) not found after the store")
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
    return store_s, load_s, cold


def bench(name: str, cfg: dict[str, Any], payloads: list[bytes], warmup: list[bytes], batch: int) -> dict[str, Any]:
    """One adapter's round: build, warm-up pass, timed pass. GB/s, and the adapter's start-up seconds."""
    total = sum(map(len, payloads))
    # L1-style targets written once before (LMCache's L1 arena is mapped long before a load lands in it).
    targets = [memory_obj(bytes(len(p))) for p in payloads]
    t0 = time.perf_counter()
    adapter = build(cfg)
    start_s = time.perf_counter() - t0
    try:
        status = adapter.report_status()
        one_pass(name, adapter, 1_000_000, warmup, targets[: len(warmup)], batch)
        store_s, load_s, cold = one_pass(name, adapter, 0, payloads, targets, batch)
    finally:
        adapter.close()
    return {
        "store": total / store_s / 1e9,
        "load": total / load_s / 1e9,
        "cold": cold,
        "start_s": start_s,
        "populate_s": status.get("staging_populate_s"),
        "staging_bytes": status.get("staging_bytes"),
    }


def print_ratios(rounds: Sequence[dict[str, dict[str, float]]], names: Sequence[str], unit: str) -> None:
    """Print each adapter's store / load figures per round, then ours / theirs per round and the medians."""
    print("| adapter | " + " | ".join(f"round {r + 1}" for r in range(len(rounds))) + f" | median ({unit}) |")
    print("|---|" + "---:|" * (len(rounds) + 1))
    for name in names:
        cells = [f"{rd[name]['store']:.2f} / {rd[name]['load']:.2f}" for rd in rounds]
        med = f"{statistics.median(rd[name]['store'] for rd in rounds):.2f} / "
        med += f"{statistics.median(rd[name]['load'] for rd in rounds):.2f}"
        print(f"| {name} | " + " | ".join(cells) + f" | {med} |")
    for theirs in names[1:]:
        for kind in ("store", "load"):
            ratios = [rd[OURS][kind] / rd[theirs][kind] for rd in rounds]
            per = ", ".join(f"{x:.2f}x" for x in ratios)
            print(f"ours / {theirs}, {kind}: {per} (median {statistics.median(ratios):.2f}x)")


def lmcache_bench_l2(cfg: dict[str, Any], op: str, args: argparse.Namespace, object_bytes: int) -> float:
    """One ``lmcache bench l2 --only op`` process over the adapter of ``cfg``; LMCache's mean MB/s.

    Raises:
        SystemExit: the command failed, or not every object of a round was stored / loaded.
    """
    lmcache = os.path.join(os.path.dirname(sys.executable), "lmcache")
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [
            lmcache if os.path.exists(lmcache) else "lmcache",
            "bench",
            "l2",
            "--l2-adapter",
            json.dumps(cfg),
            "--only",
            op,
            "--num-keys",
            str(args.batch),
            "--rounds",
            str(args.bench_rounds),
            "--data-size-kb",
            str(object_bytes // 1024),
            "--l1-align-bytes",
            "4096",  # LMCache's advice for O_DIRECT adapters; the same buffers for every adapter
            "--format",
            "json",
            "--output",
            out.name,
            "-q",
        ]
        env = {**os.environ, "LMCACHE_DISABLE_BANNER": "1"}
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, check=False)
        if done.returncode != 0:
            raise SystemExit(
                f"lmcache bench l2 --only {op} {cfg['type']}: exit {done.returncode}\n{done.stderr[-2000:]}"
            )
        with open(out.name) as f:
            result = json.load(f)["metrics"]["op_0"]
    if result["total_success"] != result["total_keys"] or result["rounds_timed_out"]:
        raise SystemExit(f"lmcache bench l2 --only {op} {cfg['type']}: {result}")
    return float(result["throughput_avg_mbps"])


def run_lmcache_bench(args: argparse.Namespace, names: list[str], object_bytes: int, o_direct: bool | str) -> None:
    """Paired rounds of LMCache's own ``lmcache bench l2``: store process, sync and drop, load process."""
    print(
        f"\nlmcache bench l2: {args.bench_rounds} rounds of {args.batch} objects per process (after one warm-up "
        f"round), page cache dropped before each load process, load average {os.getloadavg()[0]:.1f} at start"
    )
    rounds: list[dict[str, dict[str, float]]] = []
    cold = True
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        results: dict[str, dict[str, float]] = {}
        for name in order:
            base = tempfile.mkdtemp(prefix="bench-lmcache-l2-", dir=args.dir)
            try:
                cfg = config(name, base, object_bytes, o_direct, args.native_odirect)
                store = lmcache_bench_l2(cfg, "store", args, object_bytes)
                cold = drop_caches() and cold
                results[name] = {"store": store, "load": lmcache_bench_l2(cfg, "load", args, object_bytes)}
            finally:
                shutil.rmtree(base, ignore_errors=True)
        rounds.append(results)
        line = ", ".join(f"{n}: store {results[n]['store']:.0f} load {results[n]['load']:.0f}" for n in order)
        print(f"round {r + 1} (order {' / '.join(order)}), MB/s: {line}, load average {os.getloadavg()[0]:.1f}")
    print("\nlmcache bench l2, LMCache's MB/s per round (store / load):")
    print_ratios(rounds, names, "MB/s")
    if not cold:
        print("note: page cache not dropped (not root): loads are warm")


def first_touch(payloads: list[bytes]) -> dict[str, float]:
    """One copy of every payload into rows of a freshly mapped buffer, then again into the now mapped rows."""
    row_bytes = max(map(len, payloads))
    buffer = mmap.mmap(-1, row_bytes * len(payloads), flags=mmap.MAP_PRIVATE)
    view = memoryview(buffer)
    out: dict[str, float] = {}
    try:
        for label in ("fresh", "mapped"):
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            for i, payload in enumerate(payloads):
                view[i * row_bytes : i * row_bytes + len(payload)] = payload
            out[f"{label}_s"] = time.perf_counter() - t0
            out[f"{label}_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    finally:
        view.release()
        buffer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=64, help="objects stored and loaded per adapter and round")
    parser.add_argument("--object-mib", type=float, default=2.0, help="object size, MiB (LMCache's chunk object)")
    parser.add_argument("--batch", type=int, default=16, help="objects per store / load task")
    parser.add_argument("--dir", default=None, help="directory for the roots (default: a temporary one)")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds (each adapter once per round)")
    parser.add_argument(
        "--o-direct",
        choices=("auto", "true", "false"),
        default="auto",
        help="our fs tier's o_direct (auto: O_DIRECT on a local root; LMCache's fs adapter uses the page cache)",
    )
    parser.add_argument("--native-odirect", action="store_true", help="LMCache's fs_native adapter with use_odirect")
    parser.add_argument("--no-native", action="store_true", help="leave LMCache's fs_native (C++) adapter out")
    parser.add_argument(
        "--bench-rounds", type=int, default=4, help="measured rounds inside each `lmcache bench l2` process"
    )
    parser.add_argument("--no-lmcache-bench", action="store_true", help="skip the `lmcache bench l2` runs")
    args = parser.parse_args()
    object_bytes = int(args.object_mib * 1024 * 1024)
    payloads = [os.urandom(object_bytes) for _ in range(args.objects)]
    warmup = [os.urandom(object_bytes) for _ in range(min(args.objects, 2 * args.batch))]
    names = [OURS, FS] + ([] if args.no_native else [NATIVE])
    o_direct_values: dict[str, bool | str] = {"auto": "auto", "true": True, "false": False}
    o_direct = o_direct_values[args.o_direct]
    print(
        f"{args.objects} objects of {object_bytes} bytes ({object_bytes * args.objects / 2**20:.0f} MiB), "
        f"tasks of {args.batch}, {args.rounds} rounds, our fs tier's o_direct {args.o_direct}, "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    rounds: list[dict[str, dict[str, Any]]] = []
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        results: dict[str, dict[str, Any]] = {}
        for name in order:
            base = tempfile.mkdtemp(prefix="bench-lmcache-", dir=args.dir)
            try:
                cfg = config(name, base, object_bytes, o_direct, args.native_odirect)
                results[name] = bench(name, cfg, payloads, warmup, args.batch)
            finally:
                shutil.rmtree(base, ignore_errors=True)
        rounds.append(results)
        line = ", ".join(f"{n}: store {results[n]['store']:.2f} load {results[n]['load']:.2f}" for n in order)
        print(f"round {r + 1} (order {' / '.join(order)}), GB/s: {line}")
    print("\nsteady state, GB/s per round (store / load, every load verified):")
    print_ratios(rounds, names, "GB/s")
    ours = rounds[0][OURS]
    starts = ", ".join(f"{n} {statistics.median(rd[n]['start_s'] for rd in rounds) * 1e3:.0f} ms" for n in names)
    if ours["staging_bytes"]:
        populate = statistics.median(rd[OURS]["populate_s"] for rd in rounds)
        print(
            f"\nfirst touch, paid once at start: our staging buffer of {ours['staging_bytes'] / 2**20:.0f} MiB "
            f"faulted in in {populate * 1e3:.0f} ms (median of {len(rounds)}), "
            f"{populate / (ours['staging_bytes'] / 2**30):.2f} s per GiB; adapter start {starts}"
        )
    else:
        print(f"\nour adapter reports no staging buffer (not faulted in at start); adapter start {starts}")
    touch = first_touch(payloads)
    total = object_bytes * args.objects
    print(
        f"one copy of every object into a freshly mapped buffer: {touch['fresh_s'] * 1e3:.0f} ms "
        f"({total / touch['fresh_s'] / 1e9:.2f} GB/s, {touch['fresh_faults']:.0f} page faults); into the same rows "
        f"once mapped: {touch['mapped_s'] * 1e3:.0f} ms ({total / touch['mapped_s'] / 1e9:.2f} GB/s, "
        f"{touch['mapped_faults']:.0f} faults)"
    )
    if not all(res["cold"] for rd in rounds for res in rd.values()):
        print("note: page cache not dropped (not root): loads are warm")
    if not args.no_lmcache_bench:
        run_lmcache_bench(args, names, object_bytes, o_direct)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()

"""The ``tiering`` command: ``bench`` and ``check`` (``ls``/``stat``/``gc``/``verify``: :mod:`tiering.core.commands`).

Exit status: 0 on success, 1 when a replay fails (a loaded byte differs, a
request hangs), 2 on a bad configuration or bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path
from typing import Any

from tiering.core.commands import add_commands
from tiering.core.factory import CachePolicyFactory, SecondaryTierFactory, create_spec, resolve_tier

logger = logging.getLogger("tiering.core.cli")

DEFAULT_BENCH_BLOCK_BYTES = 16 * 1024
DEFAULT_BENCH_PRIMARY_BLOCKS = 1024
DEFAULT_REQUESTS = 2000


def default_cache_dir() -> Path:
    """``$TIERING_CACHE_DIR``, else ``$XDG_CACHE_HOME/tiering``, else ``~/.cache/tiering``."""
    if env := os.environ.get("TIERING_CACHE_DIR"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tiering"


def default_bench_config(block_bytes: int) -> dict[str, Any]:
    """CPU primary of 1024 blocks plus the fs tier under the cache dir (the example tier without tiering-fs)."""
    tier: dict[str, Any]
    if "fs" in SecondaryTierFactory.known_names():
        tier = {"type": "fs", "root": str(default_cache_dir() / "bench")}
    else:
        tier = {"type": "example"}
    return {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": DEFAULT_BENCH_PRIMARY_BLOCKS * block_bytes,
        "block_bytes": block_bytes,
        "eviction_policy": "lru",
        "secondary_tiers": [tier],
    }


def load_config(path: str) -> dict[str, Any]:
    """Read a JSON config file; a ``kv_connector_extra_config`` wrapper is unwrapped.

    Raises:
        ValueError: unreadable file or not a JSON object (the message names the file).
    """
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read config {path}: {exc}") from exc
    if isinstance(config, dict) and isinstance(config.get("kv_connector_extra_config"), dict):
        config = config["kv_connector_extra_config"]
    if not isinstance(config, dict):
        raise ValueError(f"config {path} must hold a JSON object")
    return config


def provider_of(cls: type) -> str:
    """``"<distribution> <version>"`` of the installed package providing ``cls``, or ``"unknown"``.

    The distribution named after the longest module prefix wins
    (``tiering.fs.tier`` -> ``tiering-fs``), since namespace packages share
    their top level; otherwise the single distribution owning the top level.
    """
    parts = cls.__module__.split(".")
    names = ["-".join(parts[:n]) for n in range(len(parts), 0, -1)]
    names += packages_distributions().get(parts[0], [])[:1]
    for name in names:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            continue
    return "unknown"


def cmd_check(args: argparse.Namespace) -> int:
    """Resolve every tier and the eviction policy of a config; print what each resolved to."""
    config = load_config(args.config)
    spec = create_spec(config)
    print(f"spec: {type(spec).__module__}.{type(spec).__qualname__}")
    print(f"namespace {spec.namespace.digest}: {json.dumps(spec.namespace.to_dict(), sort_keys=True)}")
    print(f"primary: {spec.num_primary_blocks} blocks x {spec.block_bytes} bytes")
    policy = getattr(spec, "eviction_policy", None)
    if policy is not None:
        cls = CachePolicyFactory.get_class(policy, getattr(spec, "cache_policy_module_path", None))
        print(f"eviction_policy {policy!r}: {cls.__module__}.{cls.__qualname__} ({provider_of(cls)})")
    for index, tier_config in enumerate(getattr(spec, "secondary_tiers", [])):
        tier_cls, tier_type, _ = resolve_tier(tier_config, index)
        print(
            f"secondary_tiers[{index}] type {tier_type!r}: "
            f"{tier_cls.__module__}.{tier_cls.__qualname__} ({provider_of(tier_cls)})"
        )
    if args.probe:
        from tiering.core.inspection import inspector_for
        from tiering.core.primary import allocate_host_buffer
        from tiering.core.spec import TieringOffloadingSpec

        if isinstance(spec, TieringOffloadingSpec):
            tiers = spec.create_secondary_tiers(allocate_host_buffer(1, spec.block_bytes))
            for index, (tier, tier_config) in enumerate(zip(tiers, spec.secondary_tiers, strict=True)):
                inspector = inspector_for(tier_config, index)
                where = f" ({inspector.location()})" if inspector is not None else ""
                print(f"probe {tier.tier_type!r}{where}: ok")
                tier.shutdown()
    print("config ok" if args.probe else "config ok (names and keys; --probe builds each tier, checking every value)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Replay a workload through a stack, verify every loaded byte, print a report."""
    from tqdm import tqdm

    from tiering.core.bench import Replayer, VerificationError, load_mooncake_trace, synthetic_chat
    from tiering.core.bench.workload import MOONCAKE_BLOCK_TOKENS
    from tiering.core.spec import TieringOffloadingSpec

    if args.config:
        # A given config is used as it is, so bench stores blocks in the very
        # namespace `tiering check`, `stat` and an engine use; --block-bytes
        # overrides it only when given, and says so.
        config = load_config(args.config)
        if args.block_bytes is not None and config.get("block_bytes") != args.block_bytes:
            print(f"--block-bytes {args.block_bytes} overrides the config's block_bytes", file=sys.stderr)
            config["block_bytes"] = args.block_bytes
    else:
        config = default_bench_config(args.block_bytes or DEFAULT_BENCH_BLOCK_BYTES)
        if args.trace:
            config["block_size"] = MOONCAKE_BLOCK_TOKENS
    spec = create_spec(config)
    if not isinstance(spec, TieringOffloadingSpec):
        raise ValueError(f"tiering bench needs a TieringOffloadingSpec, got {type(spec).__name__}")
    requests = (
        load_mooncake_trace(args.trace, args.requests) if args.trace else synthetic_chat(args.requests, spec.block_size)
    )
    manager = spec.get_manager()
    if args.metrics_port is not None:
        from tiering.core.metrics_prometheus import serve

        serve(manager, args.metrics_port)
        print(f"serving metrics on http://127.0.0.1:{args.metrics_port}/metrics", file=sys.stderr)
    names = [f"{i}:{t.tier_type}" for i, t in enumerate(manager.secondary_tiers)]
    print(
        f"tiering bench: {args.trace or 'synthetic chat'} ({args.requests} requests), primary "
        f"{spec.num_primary_blocks} x {spec.block_bytes} B ({spec.eviction_policy}), secondary: "
        f"{', '.join(names) or 'none'}",
        file=sys.stderr,
    )
    replayer = Replayer(manager, names)
    try:
        with tqdm(total=args.requests, unit="req", file=sys.stderr, disable=None) as bar:
            report = replayer.run(requests, bar.update)
    except (VerificationError, TimeoutError) as exc:
        print(f"tiering bench: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        manager.shutdown()
    data = report.to_dict()
    data["config"] = config
    print(format_report(data))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    if args.plot:
        from tiering.core.bench.plot import plot_report

        print(f"plot written to {plot_report(data, args.plot)}", file=sys.stderr)
    return 0


def format_report(data: dict[str, Any]) -> str:
    """The human-readable replay report."""
    lines = [
        f"requests           {data['requests']}",
        f"block lookups      {data['block_lookups']}",
        f"hits               {data['hits_total']}  ({1 - data['miss_ratio']:.1%})",
    ]
    lines += [f"  {tier:<16} {n}" for tier, n in sorted(data["hits"].items())]
    lines += [
        f"misses             {data['misses']}  (miss ratio {data['miss_ratio']:.1%})",
        f"blocks stored      {data['blocks_stored']}  (rejected: {data['store_rejected']})",
    ]
    for tier in sorted(set(data["bytes_stored"]) | set(data["bytes_loaded"])):
        stored, loaded = data["bytes_stored"].get(tier, 0), data["bytes_loaded"].get(tier, 0)
        lines.append(f"  {tier:<16} stored {stored / 1e6:10.1f} MB   loaded {loaded / 1e6:10.1f} MB")
    lat = data["scheduler_call_us"]
    lines += [
        f"verified blocks    {data['verified_blocks']} (every loaded byte matched)",
        f"short loads        {data['short_loads']} (requests that loaded fewer blocks than their lookup found:"
        " a promotion failed or no primary slot was free; the rest was recomputed)",
        f"throughput         {data['throughput_gb_s']:.3f} GB/s",
        f"scheduler calls    {data['scheduler_calls']}: p50 {lat['p50']:.1f} us, p90 {lat['p90']:.1f} us, "
        f"p99 {lat['p99']:.1f} us, max {lat['max']:.1f} us",
        f"wall time          {data['wall_s']:.2f} s",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The ``tiering`` argument parser."""
    parser = argparse.ArgumentParser(prog="tiering", description="KV-cache tiering: replays and config checks.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench", help="replay a workload through a tier stack and verify every loaded byte")
    bench.add_argument("--config", help="JSON config (kv_connector_extra_config shape); default: primary + fs tier")
    bench.add_argument("--trace", help="Mooncake JSONL trace; default: synthetic multi-turn chat")
    bench.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help="requests to replay (default 2000)")
    bench.add_argument(
        "--block-bytes",
        type=int,
        help=f"bytes per block (default: the config's; {DEFAULT_BENCH_BLOCK_BYTES} for the default stack)",
    )
    bench.add_argument("--json", help="also write the report as JSON to this file")
    bench.add_argument("--plot", help="also draw hit ratio, bytes moved and latency into this PNG (needs [plot])")
    bench.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (needs [metrics])")
    bench.set_defaults(func=cmd_bench)
    check = sub.add_parser("check", help="resolve every tier and policy of a config")
    check.add_argument("config", help="JSON config file")
    check.add_argument("--probe", action="store_true", help="also construct each tier (probes roots, buckets)")
    check.set_defaults(func=cmd_check)
    add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tiering`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): not an error of ours.
        sys.stderr.close()
        return 0
    except (ValueError, TypeError, ImportError, AttributeError, OSError) as exc:
        print(f"tiering {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

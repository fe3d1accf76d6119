"""``tiering bench``: replay a trace through a tier stack, verify every loaded byte, print a report.

With no arguments it replays the first 2,000 requests of the shipped
Mooncake conversation trace through the default stack
(:mod:`tiering.core.bench.stack`) in a temporary directory that is removed
afterwards (``--root DIR`` keeps the blocks in ``DIR``).

Exit status: 0 on success, 1 when a replay fails (a loaded byte differs, a
request hangs), 2 on a bad configuration or bad arguments, 130 / 143 when
ended by SIGINT / SIGTERM (the partial report is printed and written).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tiering.core.bench.arguments import check_output_dir, check_output_file, check_plot_file, positive_size
from tiering.core.bench.interrupt import StopOnSignal
from tiering.core.bench.progress import Progress
from tiering.core.bench.replay import Replayer, VerificationError
from tiering.core.bench.report import describe_stack, format_header, format_report
from tiering.core.bench.stack import DEFAULT_BENCH_BLOCK_BYTES, bench_config, default_local_tier
from tiering.core.bench.ttft import format_ttft_rows, modelled_ttft
from tiering.core.bench.workload import (
    DEFAULT_TRACE,
    SHIPPED_TRACES,
    TRACE_FORMAT,
    Request,
    load_mooncake_trace,
    resolve_trace,
)
from tiering.core.configfile import documentation_url, install_hint, load_config, redact_text, tier_location
from tiering.core.factory import redact_offloading_config
from tiering.core.manager import TieringManager
from tiering.core.primary.memory import format_bytes
from tiering.core.throttle import ThrottledTier, parse_throttle

DEFAULT_REQUESTS = 2000
LABEL = "tiering bench"


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def add_bench_parser(sub: Any) -> None:
    """Register ``bench`` on the ``tiering`` sub-parser."""
    names = ", ".join(SHIPPED_TRACES)
    bench = sub.add_parser(
        "bench",
        help="replay a trace through a tier stack and verify every loaded byte",
        description=(
            "Replay a Mooncake trace through a tier stack, verify every loaded byte and report. With no "
            "arguments: the first 2,000 requests of the shipped conversation trace through a CPU primary tier "
            "and a capped persistent tier in a temporary directory (removed afterwards)."
        ),
        epilog=TRACE_FORMAT,
    )
    bench.add_argument(
        "--config", help="JSON config (kv_connector_extra_config shape); default: primary + a persistent tier"
    )
    bench.add_argument(
        "--trace",
        default=DEFAULT_TRACE,
        help=f"a shipped trace ({names}; default {DEFAULT_TRACE}) or a Mooncake JSONL file (format below)",
    )
    bench.add_argument(
        "--requests", type=positive_int, default=DEFAULT_REQUESTS, help="requests to replay (default 2000)"
    )
    bench.add_argument(
        "--root", help="directory of the default stack's persistent tier, kept (default: a temporary one, removed)"
    )
    bench.add_argument(
        "--block-bytes",
        type=positive_size,
        help=(
            f"bytes per block, e.g. 16KiB or 64MiB (default: the config's; {DEFAULT_BENCH_BLOCK_BYTES} for the "
            "default stack, whose primary tier holds 1,024 blocks)"
        ),
    )
    bench.add_argument(
        "--cpu-bytes",
        type=positive_size,
        help=(
            "bytes of the CPU primary tier, e.g. 4GiB (default: the config's cpu_bytes_to_use; 1,024 blocks "
            "for the default stack); it must fit in this machine's memory"
        ),
    )
    bench.add_argument("--json", help="also write the report as JSON to this file")
    bench.add_argument("--plot", help="also draw hit ratio, bytes moved and latency into this PNG (needs [plot])")
    bench.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (needs [metrics])")
    bench.add_argument(
        "--recompute-tokens-per-s",
        type=positive_float,
        help=(
            "the engine's prefill rate: replay twice, load cost model off then on, each on a fresh stack, and "
            "report the modelled time to first token of both (sets the config's recompute_tokens_per_s)"
        ),
    )
    bench.add_argument(
        "--throttle",
        type=_throttle,
        metavar="LATENCY_S[,BANDWIDTH]",
        help="make every secondary tier's loads slow on purpose, e.g. 0.05,20MiB (50 ms per job, 20 MiB/s)",
    )
    bench.set_defaults(func=cmd_bench)


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _throttle(text: str) -> tuple[float, float | None]:
    try:
        return parse_throttle(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"--plot needs matplotlib: {install_hint('tiering-core', extra='plot')}") from exc


@contextlib.contextmanager
def _workspace(root: str | None, needed: bool = True) -> Iterator[tuple[Path | None, bool]]:
    """``(directory, temporary)``: ``root`` as given (kept), or a new temporary directory removed on exit.

    Nothing when not ``needed`` (a ``--config`` says where its tiers live).
    """
    if not needed:
        yield None, False
        return
    if root is not None:
        path = Path(root)
        path.mkdir(parents=True, exist_ok=True)
        yield path, False
        return
    path = Path(tempfile.mkdtemp(prefix="tiering-bench-"))
    try:
        yield path, True
    finally:
        remove_tree(path)


REMOVE_THREADS = 32
"""Threads unlinking a temporary directory's files: one unlink costs milliseconds on a disk
mounted with ``discard`` (online TRIM) and the kernel overlaps many; 16 threads removed
10,000 block files 6x faster than one on the development machine."""


def remove_tree(path: Path) -> None:
    """Remove a directory tree, unlinking its files from :data:`REMOVE_THREADS` threads; errors are ignored."""
    files: list[str] = []
    for dirpath, _, filenames in os.walk(path):
        files.extend(os.path.join(dirpath, name) for name in filenames)

    def unlink(name: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(name)

    with ThreadPoolExecutor(REMOVE_THREADS, thread_name_prefix="tiering-bench-rm") as pool:
        for _ in pool.map(unlink, files, chunksize=64):
            pass
    shutil.rmtree(path, ignore_errors=True)


def _stack_config(args: argparse.Namespace, directory: Path | None) -> dict[str, Any]:
    if args.config or directory is None:
        # A given config is used as it is, so bench stores blocks in the very
        # namespace `tiering check`, `stat` and an engine use; --block-bytes
        # overrides it only when given, and says so.
        config = load_config(args.config)
        for flag, key, value in (
            ("--block-bytes", "block_bytes", args.block_bytes),
            ("--cpu-bytes", "cpu_bytes_to_use", args.cpu_bytes),
        ):
            if value is not None and config.get(key) != value:
                print(f"{LABEL}: {flag} {value} overrides the config's {key}", file=sys.stderr)
                config[key] = value
        return config
    tier = default_local_tier(directory)
    if tier is None:
        print(
            f"{LABEL}: no installed tier keeps blocks on a local disk; replaying through the CPU primary tier "
            f"only. Install a persistent tier's distribution ({install_hint('tiering-<name>')}; the tier packages "
            f"are listed at {documentation_url('index.md')}) or pass --config",
            file=sys.stderr,
        )
    return bench_config([tier] if tier else [], args.block_bytes or DEFAULT_BENCH_BLOCK_BYTES, args.cpu_bytes)


def _check_primary_fits(spec: Any) -> None:
    """Refuse a primary tier larger than this machine's memory, naming the flag that sets its size."""
    from tiering.core.primary.memory import check_primary_fits

    try:
        check_primary_fits(spec.num_primary_blocks * spec.block_bytes)
    except ValueError as exc:
        raise ValueError(
            f"{exc}; in tiering bench pass --cpu-bytes with a smaller size (e.g. --cpu-bytes 4GiB), "
            "which overrides the config's cpu_bytes_to_use"
        ) from None


def cmd_bench(args: argparse.Namespace) -> int:
    """Replay a workload through a stack, verify every loaded byte, print (and write) the report."""
    if args.config and args.root:
        raise ValueError("--root places the default stack's tier; with --config the config's tiers say where")
    # Paths are checked before the replay, not after it: a typo must not cost the run.
    if args.root is not None:
        check_output_dir("--root", args.root)
    if args.json:
        check_output_file("--json", args.json)
    if args.plot:
        check_plot_file(args.plot)
    if args.root is not None and default_local_tier(args.root) is None:
        raise ValueError(
            f"--root {args.root}: no installed tier keeps blocks in a local directory, so nothing would be kept "
            "there; install a tier package whose tier does (the filesystem tier's; the tier packages are listed "
            f"at {documentation_url('index.md')}), or replay without --root (CPU primary tier only), or with --config"
        )
    if args.plot:
        _check_plot_available()
    trace = resolve_trace(args.trace)
    rate = args.recompute_tokens_per_s
    # With a recompute rate: the same replay with the cost model off, then on, each on a fresh stack.
    passes: list[bool | None] = [False, True] if rate else [None]
    views: dict[str, dict[str, float]] = {}
    if rate and args.config:
        print(
            f"{LABEL}: both replays use the tiers of {args.config} where it places them: the second (model on) "
            "starts with the blocks the first stored",
            file=sys.stderr,
        )
    with StopOnSignal(LABEL) as stopper:
        for model in passes:
            outcome = _replay_pass(args, trace, stopper, model)
            if isinstance(outcome, int):
                return outcome
            data, header = outcome
            if rate:
                views[f"model {'on' if model else 'off'}"] = modelled_ttft(data["timings"], rate)
            if stopper.reason() is not None:
                break
        if rate:
            data["modelled_ttft"] = {"recompute_tokens_per_s": rate, **views}
        # On one terminal the header printed at the start is still on screen: not twice.
        print(format_report(data, None if shares_terminal() else header))
        if rate:
            print("\n".join(format_ttft_rows(views, rate)))
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        if args.plot:
            from tiering.core.bench.plot import plot_report

            print(f"plot written to {plot_report(data, args.plot)}", file=sys.stderr)
    return stopper.exit_status or 0


def _replay_pass(
    args: argparse.Namespace, trace: Any, stopper: StopOnSignal, model: bool | None
) -> tuple[dict[str, Any], str] | int:
    """One replay on a fresh stack: ``(report data, header)``, or the exit status of a failed replay.

    ``model`` True / False turns the load cost model on / off (with ``--recompute-tokens-per-s`` as the rate);
    None keeps the config's settings.
    """
    from tiering.core.factory import create_spec
    from tiering.core.spec import TieringOffloadingSpec

    with _workspace(args.root, not args.config) as workspace:
        directory, temporary = workspace
        config = _stack_config(args, directory)
        if model is not None:
            config = {**config, "load_cost_model": model, "recompute_tokens_per_s": args.recompute_tokens_per_s}
        spec = create_spec(config)
        if not isinstance(spec, TieringOffloadingSpec):
            raise ValueError(f"tiering bench needs a TieringOffloadingSpec, got {type(spec).__name__}")
        _check_primary_fits(spec)
        requests = list(load_mooncake_trace(trace, args.requests))
        if len(requests) < args.requests:
            print(
                f"{LABEL}: the trace {args.trace} has only {len(requests)} requests; replaying all "
                f"{len(requests)} (--requests {args.requests} asked for more)",
                file=sys.stderr,
            )
        locations = {f"{i}:{t['type']}": tier_location(t, i) for i, t in enumerate(spec.secondary_tiers)}
        block_tokens = requests[0].block_tokens if requests else spec.block_size
        manager = _manager(spec, args.throttle, block_tokens)
        try:
            if args.metrics_port is not None and model is not False:
                from tiering.core.metrics_prometheus import serve

                serve(manager, args.metrics_port)
                print(f"serving metrics on http://127.0.0.1:{args.metrics_port}/metrics", file=sys.stderr)
            names = [f"{i}:{t.tier_type}" for i, t in enumerate(manager.secondary_tiers)]
            stack = _stack(spec, manager, names, locations, temporary, requests, default_stack=not args.config)
            if args.throttle:
                latency, bandwidth = args.throttle
                limit = f", {format_bytes(bandwidth)}/s" if bandwidth else ""
                stack["throttle"] = f"throttle: every secondary tier's loads take +{latency:g} s per job{limit}"
            if model is not None:
                stack["load_cost_model"] = spec.load_cost.describe()
            header = format_header(args.trace, len(requests), stack)
            print(header, file=sys.stderr, flush=True)
            replayer = Replayer(manager, names, abandon=stopper.abandon)

            def figures() -> tuple[int, int, int, int]:
                rep = replayer.report
                return rep.requests, rep.total_hits, rep.block_lookups, replayer.bytes_moved()

            with Progress(len(requests), figures, label=LABEL) as progress:
                report = replayer.run(requests, progress.update, stop=stopper.reason)
        except (VerificationError, TimeoutError) as exc:
            print(f"{LABEL}: FAILED: {redact_text(str(exc), config)}", file=sys.stderr)
            return 1
        finally:
            manager.shutdown()
        data = report.to_dict()
        data["trace"] = args.trace
        data["stack"] = stack
        data["locations"] = {name: {"location": loc, "temporary": temporary} for name, loc in locations.items()}
        data["config"] = redact_offloading_config(config)
        if temporary:
            print(f"{LABEL}: removing the temporary directory {directory}", file=sys.stderr)
    return data, header


def _manager(spec: Any, throttle: tuple[float, float | None] | None, block_tokens: int) -> TieringManager:
    """The spec's stack (its admission policies too), every tier a :class:`ThrottledTier` when ``throttle`` is given."""
    primary = spec.create_primary()
    tiers = spec.create_secondary_tiers(primary.kv_view)
    tiers = [ThrottledTier(tier, *throttle) for tier in tiers] if throttle is not None else tiers
    return TieringManager(primary, tiers, spec.load_cost, block_tokens, admission=spec.admission())


def shares_terminal() -> bool:
    """Whether stdout and stderr are the same terminal (a shell without redirection)."""
    try:
        if not (sys.stdout.isatty() and sys.stderr.isatty()):
            return False
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False
    return (out.st_dev, out.st_ino, out.st_rdev) == (err.st_dev, err.st_ino, err.st_rdev)


def _stack(
    spec: Any,
    manager: Any,
    names: list[str],
    locations: dict[str, str | None],
    temporary: bool,
    requests: list[Request],
    default_stack: bool,
) -> dict[str, Any]:
    tiers = [
        {
            "name": name,
            "capacity_bytes": int(tier.stats().get("capacity_bytes", 0)),
            "location": locations.get(name),
            "temporary": temporary and locations.get(name) is not None,
        }
        for name, tier in zip(names, manager.secondary_tiers, strict=True)
    ]
    block_tokens = requests[0].block_tokens if requests else spec.block_size
    return describe_stack(spec, tiers, block_tokens, default_stack)

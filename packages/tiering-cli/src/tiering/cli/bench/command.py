"""``tiering bench``: replay a trace through a tier stack, verify every loaded byte, print a report.

With no arguments it replays the first 2,000 requests of the shipped
Mooncake conversation trace through the default stack
(:mod:`tiering.cli.bench.stack`) in a temporary directory that is removed
afterwards (``--root DIR`` keeps the blocks in ``DIR``).

Exit status: 0 on success, 1 when a replay fails (a loaded byte differs, a
request hangs), 2 on a bad configuration or bad arguments, 130 / 143 when
ended by SIGINT / SIGTERM (the partial report is printed and written).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tiering.cli.bench.arguments import (
    check_output_dir,
    check_output_file,
    check_plot_file,
    positive_float,
    positive_int,
    positive_size,
    throttle_argument,
)
from tiering.cli.bench.interrupt import StopOnSignal
from tiering.cli.bench.passes import name_tenants, pass_summary, policies_line
from tiering.cli.bench.pins import PIN_TTL_S, format_pin_rows, pin_candidates, pin_figures, survivors, with_pin_budget
from tiering.cli.bench.progress import Progress
from tiering.cli.bench.replay import Replayer, VerificationError
from tiering.cli.bench.report import describe_stack, format_header, format_report
from tiering.cli.bench.stack import (
    DEFAULT_BENCH_BLOCK_BYTES,
    DEFAULT_BENCH_PRIMARY_BLOCKS,
    bench_capacity_bytes,
    bench_config,
    default_local_tier,
)
from tiering.cli.bench.throttle import ThrottledTier
from tiering.cli.bench.ttft import format_ttft_rows, modelled_ttft
from tiering.cli.bench.workload import (
    DEFAULT_TRACE,
    SHIPPED_TRACES,
    TRACE_FORMAT,
    Request,
    assign_tenants,
    load_mooncake_trace,
    resolve_trace,
    tenant_rule,
)
from tiering.cli.bench.workspace import workspace
from tiering.cli.terminal import documentation_url, redact_text, tier_location
from tiering.core.capabilities import PinnableTier
from tiering.core.configfile import install_hint, load_config
from tiering.core.factory import redact_offloading_config
from tiering.core.primary.memory import format_bytes
from tiering.core.runtime.manager import TieringManager

DEFAULT_REQUESTS = 2000
LABEL = "tiering bench"


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
    bench.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="the report as JSON: written to FILE besides the text report, or, without FILE, printed instead of it "
        "(as the other commands' --json)",
    )
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
        "--tenants",
        type=positive_int,
        default=1,
        help="give the requests to N tenants, request i to tenant i mod N (default 1: no tenants)",
    )
    bench.add_argument(
        "--throttle",
        type=throttle_argument,
        metavar="LATENCY_S[,BANDWIDTH]",
        help="make every secondary tier's loads slow on purpose, e.g. 0.05,20MiB (50 ms per job, 20 MiB/s)",
    )
    bench.add_argument(
        "--pin",
        type=positive_int,
        metavar="N",
        help=(
            "replay twice, each on a fresh stack: without pins, then with the trace's N most shared blocks pinned "
            "in every tier that can pin; report the hit ratio of the pinned blocks and of the rest for both"
        ),
    )
    bench.set_defaults(func=cmd_bench)


def _check_plot_available() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"--plot needs matplotlib: {install_hint('tiering-core', extra='plot')}") from exc


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
    block_bytes = args.block_bytes or DEFAULT_BENCH_BLOCK_BYTES
    primary_bytes = args.cpu_bytes if args.cpu_bytes is not None else DEFAULT_BENCH_PRIMARY_BLOCKS * block_bytes
    tier = default_local_tier(directory, bench_capacity_bytes(primary_bytes))
    if tier is None:
        print(
            f"{LABEL}: no installed tier keeps blocks on a local disk; replaying through the CPU primary tier "
            f"only. Install a persistent tier's distribution ({install_hint('tiering-<name>')}; the tier packages "
            f"are listed at {documentation_url('index.md')}) or pass --config",
            file=sys.stderr,
        )
    return bench_config([tier] if tier else [], block_bytes, args.cpu_bytes)


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
    started = time.monotonic()
    if args.config and args.root:
        raise ValueError("--root places the default stack's tier; with --config the config's tiers say where")
    # Paths are checked before the replay, not after it: a typo must not cost the run.
    if args.root is not None:
        check_output_dir("--root", args.root)
    to_stdout = args.json == "-"
    if args.json and not to_stdout:
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
    if rate and args.pin:
        raise ValueError("--pin and --recompute-tokens-per-s each replay twice: give one of them")
    if args.pin and args.tenants > 1:
        raise ValueError("--pin pins the trace's blocks of no tenant: give --pin or --tenants, not both")
    # With a recompute rate (or --pin): the same replay with the cost model (pins) off, then on, each on a fresh stack.
    passes: list[bool | None] = [False, True] if rate or args.pin else [None]
    names = {False: "pins off", True: "pins on"} if args.pin else {False: "model off", True: "model on"}
    summaries: list[dict[str, Any]] = []
    views: dict[str, dict[str, float]] = {}
    pin_views: dict[str, dict[str, Any]] = {}
    if (rate or args.pin) and args.config:
        print(
            f"{LABEL}: both replays use the tiers of {args.config} where it places them: the second "
            f"({'pins' if args.pin else 'model'} on) starts with the blocks the first stored",
            file=sys.stderr,
        )
    with StopOnSignal(LABEL) as stopper:
        for number, model in enumerate(passes, 1):
            label = None if model is None else f"pass {number} of {len(passes)}, {names[model]}"
            outcome = _replay_pass(args, trace, stopper, model, label)
            if isinstance(outcome, int):
                return outcome
            data, header = outcome
            if model is not None:
                summaries.append(pass_summary(names[model], data))
            if rate:
                views[f"model {'on' if model else 'off'}"] = modelled_ttft(data["timings"], rate)
            if args.pin:
                pin_views[f"pins {'on' if model else 'off'}"] = data["pins"]
            if stopper.reason() is not None:
                break
        if rate:
            data["modelled_ttft"] = {"recompute_tokens_per_s": rate, **views}
        data["passes"] = summaries
        data["command_wall_s"] = time.monotonic() - started
        if pin_views:
            data["pin_comparison"] = pin_views
        if to_stdout:
            print(json.dumps(data, indent=2, sort_keys=True))
        else:
            # Where stdout and stderr are one terminal or file the header printed at the start is there: not twice.
            print(format_report(data, None if shares_terminal() else header))
            if rate:
                print("\n".join(format_ttft_rows(views, rate)))
            if pin_views:
                print("\n".join(format_pin_rows(pin_views)))
        if args.json and not to_stdout:
            Path(args.json).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        if args.plot:
            from tiering.cli.bench.plot import plot_report

            print(f"plot written to {plot_report(data, args.plot)}", file=sys.stderr)
    return stopper.exit_status or 0


def _replay_pass(
    args: argparse.Namespace, trace: Any, stopper: StopOnSignal, model: bool | None, label: str | None = None
) -> tuple[dict[str, Any], str] | int:
    """One replay on a fresh stack: ``(report data, header)``, or the exit status of a failed replay.

    ``model`` True / False turns the load cost model on / off (with ``--recompute-tokens-per-s`` as the rate)
    or, with ``--pin N``, the pins; None keeps the config's settings. ``label`` names the pass
    (``"pass 2 of 2, model on"``): its header line says so, and a later pass prints one line, not the header.
    """
    from tiering.core.factory import create_spec
    from tiering.core.runtime.tiering_spec import TieringOffloadingSpec

    with workspace(args.root, not args.config) as (directory, temporary):
        config = _stack_config(args, directory)
        requests = assign_tenants(list(load_mooncake_trace(trace, args.requests)), args.tenants)
        pinned = pin_candidates(requests, args.pin) if args.pin else []
        if model and args.pin:
            config = with_pin_budget(config, len(pinned), create_spec(config).block_bytes)
        elif model is not None and not args.pin:
            config = {**config, "load_cost_model": model, "recompute_tokens_per_s": args.recompute_tokens_per_s}
        spec = create_spec(config)
        if not isinstance(spec, TieringOffloadingSpec):
            raise ValueError(f"tiering bench needs a TieringOffloadingSpec, got {type(spec).__name__}")
        _check_primary_fits(spec)
        if len(requests) < args.requests:
            print(
                f"{LABEL}: the trace {args.trace} has only {len(requests)} requests; replaying all "
                f"{len(requests)} (--requests {args.requests} asked for more)",
                file=sys.stderr,
            )
        locations = {f"{i}:{t['type']}": tier_location(t, i) for i, t in enumerate(spec.secondary_tiers)}
        block_tokens = requests[0].block_tokens if requests else spec.block_size
        manager = _manager(spec, args.throttle, block_tokens)
        pinned_in: list[bool] = []
        try:
            if args.metrics_port is not None and model is not False:
                from tiering.core.runtime.prometheus import serve

                serve(manager, args.metrics_port)
                print(f"serving metrics on http://127.0.0.1:{args.metrics_port}/metrics", file=sys.stderr)
            names = [f"{i}:{t.tier_type}" for i, t in enumerate(manager.secondary_tiers)]
            stack = _stack(spec, manager, names, locations, temporary, requests, default_stack=not args.config)
            if args.throttle:
                latency, bandwidth = args.throttle
                limit = f", {format_bytes(bandwidth)}/s" if bandwidth else ""
                stack["throttle"] = f"throttle: every secondary tier's loads take +{latency:g} s per job{limit}"
            if model is not None and not args.pin:
                stack["load_cost_model"] = spec.load_cost.describe()
            stack["policies"] = policies_line(spec.secondary_tiers, spec.load_cost.describe())
            if label is not None:
                stack["policies"] = f"{label}: {stack['policies']}"
            if args.tenants > 1:
                stack["tenants"] = tenant_rule(args.tenants)
            header = format_header(args.trace, len(requests), stack)
            first = label is None or label.startswith("pass 1 ")
            print(header if first else f"{LABEL}: {stack['policies']}", file=sys.stderr, flush=True)
            replayer = Replayer(manager, names, abandon=stopper.abandon, pinned=pinned)
            pinned_in = manager.pin(pinned, PIN_TTL_S) if model and pinned else []

            def figures() -> tuple[int, int, int, int]:
                rep = replayer.report
                return rep.requests, rep.total_hits, rep.block_lookups, replayer.bytes_moved()

            with Progress(len(requests), figures, label=LABEL) as progress:
                report = replayer.run(requests, progress.update, stop=stopper.reason)
            survived = survivors(manager, pinned)
        except (VerificationError, TimeoutError) as exc:
            print(f"{LABEL}: FAILED: {redact_text(str(exc), config)}", file=sys.stderr)
            return 1
        finally:
            if pinned_in:  # the bench's pins end with it: a --config's tiers are the user's
                for tier in manager.secondary_tiers:
                    if isinstance(tier, PinnableTier):
                        tier.unpin(pinned)
            manager.shutdown()
        data = report.to_dict()
        tenants = {r.tenant for r in requests}
        data["tier_stats"] = {name: name_tenants(s, tenants) for name, s in data["tier_stats"].items()}
        if args.pin:
            data["pins"] = pin_figures(data, len(pinned), survived, pinned_in)
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
    """Whether stdout and stderr are one terminal, file or pipe (a shell without redirection, or ``> log 2>&1``)."""
    try:
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
    tiers = []
    for name, tier in zip(names, manager.secondary_tiers, strict=True):
        stats = tier.stats()
        entry = {
            "name": name,
            "capacity_bytes": int(stats.get("capacity_bytes", 0)),
            "location": locations.get(name),
            "temporary": temporary and locations.get(name) is not None,
        }
        if not entry["capacity_bytes"] and stats.get("configured_capacity_bytes"):
            entry["fleet_capacity_bytes"] = int(stats["configured_capacity_bytes"])  # the fleet's processes evict at it
        tiers.append(entry)
    block_tokens = requests[0].block_tokens if requests else spec.block_size
    return describe_stack(spec, tiers, block_tokens, default_stack)

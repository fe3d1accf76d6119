"""``tiering ls / stat / gc / verify``: see and manage what a tier stack holds.

Each command reads the same JSON config as ``tiering bench`` and works on
every persistent tier of it (those whose class offers an ``inspector``).
Without a config, the stack is given on the command line, generically (core
names no backend):

- ``--root DIR``: the tier ``tiering bench`` uses by default, in ``DIR``
  (what ``tiering bench --root DIR`` wrote);
- ``--tier TYPE --KEY VALUE ...``: one tier entry; each ``--some-key VALUE``
  is the tier's config key ``some_key`` (``--tier s3 --bucket kv --prefix a``),
  its value read as the tier's schema declares it.

The stack around that tier is the benchmark's default one (its namespace); :mod:`tiering.cli.stacks` builds it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm

from tiering.cli.bench.arguments import positive_size
from tiering.cli.bench.stack import DEFAULT_BENCH_BLOCK_BYTES
from tiering.cli.options import STACK_EPILOG, add_namespace_argument, add_stack_arguments
from tiering.cli.stacks import in_namespace, persistent_tiers, stack_config, text_output, tier_location
from tiering.cli.terminal import echo, printable
from tiering.core.inspection import BlockInfo, TierInspector, inspector_for
from tiering.core.store.settings import inspecting
from tiering.core.units import duration_argument, format_bytes, size_argument

STAT_WAIT_S = 60.0


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _walk(inspector: TierInspector, digest: str, label: str) -> list[BlockInfo]:
    return list(
        tqdm(inspector.blocks(digest), desc=printable(label), unit="block", file=sys.stderr, disable=None, leave=False)
    )


def cmd_ls(args: argparse.Namespace) -> int:
    """Per tier: namespaces present (fields from namespace.json), block count and bytes, oldest and newest."""
    report = []
    for index, tier_config, inspector in persistent_tiers(stack_config(args)):
        location = tier_location(inspector, tier_config)
        entry: dict[str, Any] = {"index": index, "type": tier_config["type"], "location": location}
        entry["namespaces"] = []
        for digest in inspector.namespaces():
            summary = inspector.summary(digest)
            entry["namespaces"].append(
                {
                    "digest": digest,
                    "fields": summary.fields,
                    "blocks": summary.blocks,
                    "bytes": summary.bytes,
                    "oldest": _when(summary.oldest),
                    "newest": _when(summary.newest),
                }
            )
        entry["foreign"] = sorted(inspector.foreign())
        report.append(entry)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    for entry in report:
        echo(f"secondary_tiers[{entry['index']}] {entry['type']} at {entry['location']}")
        for ns in entry["namespaces"]:
            fields = ns["fields"] or {}
            desc = ", ".join(f"{k}={fields[k]}" for k in sorted(fields)) or "namespace.json missing"
            echo(
                f"  {ns['digest']}  {ns['blocks']:,} blocks  {_size(ns['bytes'])}  "
                f"oldest {ns['oldest']}  newest {ns['newest']}"
            )
            echo(f"    {desc}")
        if not entry["namespaces"]:
            echo("  (no namespaces)")
        if entry["foreign"]:
            echo(f"  {len(entry['foreign'])} foreign entries (not ours, never deleted), e.g. {entry['foreign'][0]}")
    return 0


def cmd_stat(args: argparse.Namespace) -> int:
    """Live figures of the configured stack (each tier opened as an engine would open it).

    Creates nothing: a missing root is an error (as for ``ls``), and a persistent
    tier that does not hold the stack's namespace is reported with the
    namespaces it holds (exit status 1) instead of being opened.
    """
    from tiering.core.factory import create_spec
    from tiering.core.primary import allocate_host_buffer
    from tiering.core.runtime.tiering_spec import TieringOffloadingSpec

    config = stack_config(args)
    spec = create_spec(in_namespace(config, args.namespace) if args.namespace else config)
    if not isinstance(spec, TieringOffloadingSpec):
        raise ValueError(f"tiering stat needs a TieringOffloadingSpec, got {type(spec).__name__}")
    missing = _tiers_without_namespace(spec.secondary_tiers, spec.namespace.digest)
    if missing:
        fields = ", ".join(f"{k}={v}" for k, v in sorted(spec.namespace.to_dict().items()))
        echo(f"tiering stat: no namespace {spec.namespace.digest} ({fields}) in:", sys.stderr)
        for line in missing:
            echo(f"  {line}", sys.stderr)
        echo(
            "(stat opens a tier only where its namespace is; `tiering ls` shows what each holds, and "
            "--namespace DIGEST opens one of them, such as an engine's)",
            sys.stderr,
        )
        return 1
    with inspecting():  # read-only: no eviction down to the config's cap, no expiry, no trim, nothing written
        tiers = spec.create_secondary_tiers(allocate_host_buffer(1, spec.block_bytes))
    report: dict[str, Any] = {
        "namespace": spec.namespace.digest,
        "primary": {"capacity_bytes": spec.num_primary_blocks * spec.block_bytes, "blocks": spec.num_primary_blocks},
        "tiers": [],
    }
    try:
        for index, tier in enumerate(tiers):
            wait = getattr(tier, "wait_for_scan", None)
            if callable(wait):
                wait(args.wait)
            stats = dict(tier.stats())
            entry = {"index": index, "type": tier.tier_type, "stats": stats}
            if "pinned_blocks" in stats and not stats.get("max_pinned_bytes"):
                # pinning is off in this config, so the tier counts no pin: another config's pins still hold
                from tiering.cli.pin import live_pins

                entry["pins_on_medium"] = len(live_pins(tier))
            inspector = inspector_for(spec.secondary_tiers[index], index)
            if inspector is not None:
                entry["location"] = tier_location(inspector, spec.secondary_tiers[index])
            if "capacity_bytes" in stats:
                entry["capacity"] = "unbounded" if not stats["capacity_bytes"] else stats["capacity_bytes"]
            report["tiers"].append(entry)
    finally:
        for tier in tiers:
            tier.shutdown()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    from tiering.cli.stat_format import stat_lines

    for line in stat_lines(report):  # the tier's state; every counter is in --json
        echo(line)
    return 0


def _tiers_without_namespace(tier_configs: Sequence[Mapping[str, Any]], digest: str) -> list[str]:
    """One line per persistent tier that does not hold namespace ``digest``, with the namespaces it holds.

    Looks only (opening a tier would create its root and ``namespace.json``).

    Raises:
        FileNotFoundError: a tier's root does not exist (as ``ls`` / ``gc`` / ``verify`` say it).
        OSError: a tier's bucket or server cannot be used (its inspector's error).
    """
    lines = []
    for index, tier_config in enumerate(tier_configs):
        inspector = inspector_for(tier_config, index)
        if inspector is None:
            continue
        present = inspector.namespaces()
        if digest not in present:
            where = f"secondary_tiers[{index}] {tier_config['type']} at {tier_location(inspector, tier_config)}"
            lines.append(f"{where}: namespaces there: {', '.join(present) or 'none'}")
    return lines


def _size(n: int) -> str:
    """``"20.0 KiB = 20480 bytes"``: a size as the reports print it, with the exact count."""
    return f"{format_bytes(n)} = {n} bytes"


def cmd_gc(args: argparse.Namespace) -> int:
    """Remove a stale namespace, blocks older than a duration, or the oldest blocks down to a size."""
    cutoff = time.time() - args.older_than if args.older_than is not None else None
    verb = "would remove" if args.dry_run else "removed"
    found_namespace = False
    say = text_output(args)
    results: list[dict[str, Any]] = []
    for index, tier_config, inspector in persistent_tiers(stack_config(args)):
        location = tier_location(inspector, tier_config)
        label = f"secondary_tiers[{index}] {tier_config['type']} at {location}"
        foreign = sorted(inspector.foreign())
        result: dict[str, Any] = {"index": index, "type": tier_config["type"], "location": location}
        result.update({"dry_run": args.dry_run, "foreign": len(foreign)})
        results.append(result)
        if args.namespace:
            if args.namespace not in inspector.namespaces():
                say(f"{label}: no namespace {args.namespace}")
                result.update(namespace=None, blocks=0, bytes=0)
                continue
            found_namespace = True
            blocks = _walk(inspector, args.namespace, label)
            n = len(blocks) if args.dry_run else inspector.remove_namespace(args.namespace)
            size = sum(b.size for b in blocks)
            result.update(namespace=args.namespace, blocks=n, bytes=size)
            say(f"{label}: {verb} namespace {args.namespace} ({n} blocks, {_size(size)})")
        else:
            everything = [(d, b) for d in inspector.namespaces() for b in _walk(inspector, d, label)]
            if cutoff is not None:
                victims = [(d, b) for d, b in everything if b.mtime < cutoff]
            else:
                everything.sort(key=lambda item: item[1].mtime)
                excess = sum(b.size for _, b in everything) - args.to_bytes
                victims = []
                for item in everything:
                    if excess <= 0:
                        break
                    victims.append(item)
                    excess -= item[1].size
            n = len(victims)
            if not args.dry_run:
                n = 0
                for digest in {d for d, _ in victims}:
                    n += inspector.remove_blocks(digest, [b for d, b in victims if d == digest])
            size = sum(b.size for _, b in victims)
            result.update(blocks=n, bytes=size)
            say(f"{label}: {verb} {n} blocks ({_size(size)})")
        if foreign:
            say(f"{label}: left {len(foreign)} foreign entries alone, e.g. {foreign[0]}")
    if args.json:
        print(json.dumps(results, indent=2))
    if args.namespace and not found_namespace:
        echo(f"tiering gc: no tier holds namespace {args.namespace} (see `tiering ls`)", sys.stderr)
        return 1
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Read blocks, check their headers and checksums; report (and with --remove, delete) corrupt ones."""
    corrupt_total = 0
    say = text_output(args)
    results: list[dict[str, Any]] = []
    for index, tier_config, inspector in persistent_tiers(stack_config(args)):
        location = tier_location(inspector, tier_config)
        label = f"secondary_tiers[{index}] {tier_config['type']} at {location}"
        digests = list(inspector.namespaces())
        if not digests:
            say(f"{label}: no namespace found, nothing to verify (see `tiering ls`)")
        for digest in digests:
            blocks = _walk(inspector, digest, label)
            if args.sample is not None and args.sample < len(blocks):
                blocks = random.Random(0).sample(blocks, args.sample)
            corrupt = []
            for block in tqdm(
                blocks, desc=printable(f"verify {digest[:8]}"), unit="block", file=sys.stderr, disable=None
            ):
                try:
                    reason = inspector.verify(digest, block)
                except FileNotFoundError:
                    continue  # removed meanwhile (eviction by a running engine)
                if reason is not None:
                    corrupt.append(block)
                    say(f"{label}: CORRUPT {block.name}: {reason}")
            if corrupt and args.remove:
                inspector.remove_blocks(digest, corrupt)
            results.append(
                {
                    "index": index,
                    "type": tier_config["type"],
                    "location": location,
                    "namespace": digest,
                    "checked": len(blocks),
                    "sound": len(blocks) - len(corrupt),
                    "corrupt": [block.name for block in corrupt],
                    "removed": bool(corrupt and args.remove),
                }
            )
            say(
                f"{label}: namespace {digest}: {len(blocks)} checked, {len(blocks) - len(corrupt)} sound, "
                f"{len(corrupt)} corrupt" + (" (removed)" if corrupt and args.remove else "")
            )
            corrupt_total += len(corrupt)
    if args.json:
        print(json.dumps(results, indent=2))
    return 1 if corrupt_total else 0


def add_commands(sub: Any) -> None:
    """Register ls, stat, gc and verify on the ``tiering`` sub-parser."""
    ls = sub.add_parser("ls", help="namespaces, blocks and bytes held by each persistent tier", epilog=STACK_EPILOG)
    add_stack_arguments(ls, "print JSON: per tier its namespaces, blocks, bytes, oldest and newest")
    ls.set_defaults(func=cmd_ls)
    stat = sub.add_parser(
        "stat",
        help="the state of each tier: blocks, bytes, cap, pins, tenants (--json: every counter)",
        epilog=STACK_EPILOG,
    )
    add_stack_arguments(stat, "print JSON, with every counter of each tier")
    add_namespace_argument(stat)
    stat.add_argument("--wait", type=float, default=STAT_WAIT_S, help="seconds to wait for start-up scans")
    stat.add_argument(
        "--block-bytes",
        type=positive_size,
        help=f"without CONFIG: bytes per block of the namespace to open (default {DEFAULT_BENCH_BLOCK_BYTES})",
    )
    stat.set_defaults(func=cmd_stat)
    gc = sub.add_parser("gc", help="remove stale namespaces, old blocks, or evict down to a size", epilog=STACK_EPILOG)
    add_stack_arguments(gc, "print JSON: per tier the blocks and bytes removed (or that would be)")
    what = gc.add_mutually_exclusive_group(required=True)
    what.add_argument("--namespace", metavar="DIGEST", help="remove this whole namespace")
    what.add_argument(
        "--older-than",
        type=duration_argument,
        metavar="DURATION",
        help="remove blocks older than e.g. 7d, 12h, 30m (m: minutes), 90s, 2w",
    )
    what.add_argument(
        "--to-bytes",
        type=size_argument,
        metavar="N",
        help="remove the oldest blocks until at most N bytes remain (500M, 64GiB)",
    )
    gc.add_argument("--dry-run", action="store_true", help="only report what would be removed")
    gc.set_defaults(func=cmd_gc)
    verify = sub.add_parser("verify", help="check stored blocks' headers and checksums", epilog=STACK_EPILOG)
    add_stack_arguments(verify, "print JSON: per tier and namespace the blocks checked, sound and corrupt")
    verify.add_argument("--sample", type=int, metavar="N", help="check N random blocks per namespace")
    verify.add_argument("--remove", action="store_true", help="delete the corrupt blocks found")
    verify.set_defaults(func=cmd_verify)

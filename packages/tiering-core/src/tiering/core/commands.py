"""``tiering ls / stat / gc / verify``: see and manage what a tier stack holds.

Each command reads the same JSON config as ``tiering bench`` and works on
every persistent tier of it (those whose class offers an ``inspector``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import time
from typing import Any

from tqdm import tqdm

from tiering.core.inspection import BlockInfo, TierInspector, inspector_for, parse_duration, parse_size

STAT_WAIT_S = 60.0


def _config(args: argparse.Namespace) -> dict[str, Any]:
    from tiering.core.cli import load_config

    return load_config(args.config)


def _inspectors(config: dict[str, Any]) -> list[tuple[int, dict[str, Any], TierInspector]]:
    tiers = config.get("secondary_tiers", [])
    if not isinstance(tiers, list):
        raise ValueError("config key 'secondary_tiers' must be a list of objects")
    out = []
    for index, tier_config in enumerate(tiers):
        inspector = inspector_for(tier_config, index)
        if inspector is None:
            print(f"secondary_tiers[{index}] ({tier_config.get('type')}): nothing persistent to inspect")
        else:
            out.append((index, tier_config, inspector))
    if not out:
        raise ValueError("the config has no persistent secondary tier to inspect")
    return out


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _walk(inspector: TierInspector, digest: str, label: str) -> list[BlockInfo]:
    return list(tqdm(inspector.blocks(digest), desc=label, unit="block", file=sys.stderr, disable=None, leave=False))


def cmd_ls(args: argparse.Namespace) -> int:
    """Per tier: namespaces present (fields from namespace.json), block count and bytes, oldest and newest."""
    report = []
    for index, tier_config, inspector in _inspectors(_config(args)):
        entry: dict[str, Any] = {"index": index, "type": tier_config["type"], "location": inspector.location()}
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
        print(f"secondary_tiers[{entry['index']}] {entry['type']} at {entry['location']}")
        for ns in entry["namespaces"]:
            fields = ns["fields"] or {}
            desc = ", ".join(f"{k}={fields[k]}" for k in sorted(fields)) or "namespace.json missing"
            print(
                f"  {ns['digest']}  {ns['blocks']} blocks  {ns['bytes']} bytes  "
                f"oldest {ns['oldest']}  newest {ns['newest']}\n    {desc}"
            )
        if not entry["namespaces"]:
            print("  (no namespaces)")
        if entry["foreign"]:
            print(f"  {len(entry['foreign'])} foreign entries (not ours, never deleted), e.g. {entry['foreign'][0]}")
    return 0


def cmd_stat(args: argparse.Namespace) -> int:
    """Live figures of the configured stack (each tier opened as an engine would open it)."""
    from tiering.core.factory import create_spec
    from tiering.core.primary import allocate_host_buffer
    from tiering.core.spec import TieringOffloadingSpec

    spec = create_spec(_config(args))
    if not isinstance(spec, TieringOffloadingSpec):
        raise ValueError(f"tiering stat needs a TieringOffloadingSpec, got {type(spec).__name__}")
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
            report["tiers"].append({"index": index, "type": tier.tier_type, "stats": dict(tier.stats())})
    finally:
        for tier in tiers:
            tier.shutdown()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    print(f"namespace {report['namespace']}")
    print(f"primary  {report['primary']['blocks']} blocks, {report['primary']['capacity_bytes']} bytes")
    for entry in report["tiers"]:
        print(f"secondary_tiers[{entry['index']}] {entry['type']}")
        for key, value in sorted(entry["stats"].items()):
            print(f"  {key:<28} {value}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    """Remove a stale namespace, blocks older than a duration, or the oldest blocks down to a size."""
    cutoff = time.time() - parse_duration(args.older_than) if args.older_than else None
    verb = "would remove" if args.dry_run else "removed"
    for index, tier_config, inspector in _inspectors(_config(args)):
        label = f"secondary_tiers[{index}] {tier_config['type']} at {inspector.location()}"
        foreign = sorted(inspector.foreign())
        if args.namespace:
            if args.namespace not in inspector.namespaces():
                print(f"{label}: no namespace {args.namespace}")
                continue
            blocks = _walk(inspector, args.namespace, label)
            n = len(blocks) if args.dry_run else inspector.remove_namespace(args.namespace)
            print(f"{label}: {verb} namespace {args.namespace} ({n} blocks, {sum(b.size for b in blocks)} bytes)")
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
            print(f"{label}: {verb} {n} blocks ({sum(b.size for _, b in victims)} bytes)")
        if foreign:
            print(f"{label}: left {len(foreign)} foreign entries alone, e.g. {foreign[0]}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Read blocks, check their headers and checksums; report (and with --remove, delete) corrupt ones."""
    corrupt_total = 0
    for index, tier_config, inspector in _inspectors(_config(args)):
        label = f"secondary_tiers[{index}] {tier_config['type']} at {inspector.location()}"
        for digest in inspector.namespaces():
            blocks = _walk(inspector, digest, label)
            if args.sample is not None and args.sample < len(blocks):
                blocks = random.Random(0).sample(blocks, args.sample)
            corrupt = []
            for block in tqdm(blocks, desc=f"verify {digest[:8]}", unit="block", file=sys.stderr, disable=None):
                try:
                    reason = inspector.verify(digest, block)
                except FileNotFoundError:
                    continue  # removed meanwhile (eviction by a running engine)
                if reason is not None:
                    corrupt.append(block)
                    print(f"{label}: CORRUPT {block.name}: {reason}")
            if corrupt and args.remove:
                inspector.remove_blocks(digest, corrupt)
            print(
                f"{label}: namespace {digest}: {len(blocks)} checked, {len(blocks) - len(corrupt)} sound, "
                f"{len(corrupt)} corrupt" + (" (removed)" if corrupt and args.remove else "")
            )
            corrupt_total += len(corrupt)
    return 1 if corrupt_total else 0


def add_commands(sub: Any) -> None:
    """Register ls, stat, gc and verify on the ``tiering`` sub-parser."""
    ls = sub.add_parser("ls", help="namespaces, blocks and bytes held by each persistent tier")
    ls.add_argument("config")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=cmd_ls)
    stat = sub.add_parser("stat", help="live figures of each tier of the configured stack")
    stat.add_argument("config")
    stat.add_argument("--json", action="store_true", help="print JSON")
    stat.add_argument("--wait", type=float, default=STAT_WAIT_S, help="seconds to wait for start-up scans")
    stat.set_defaults(func=cmd_stat)
    gc = sub.add_parser("gc", help="remove stale namespaces, old blocks, or evict down to a size")
    gc.add_argument("config")
    what = gc.add_mutually_exclusive_group(required=True)
    what.add_argument("--namespace", metavar="DIGEST", help="remove this whole namespace")
    what.add_argument(
        "--older-than", metavar="DURATION", help="remove blocks older than e.g. 7d, 12h, 30m (m: minutes), 90s, 2w"
    )
    what.add_argument(
        "--to-bytes",
        type=parse_size,
        metavar="N",
        help="remove the oldest blocks until at most N bytes remain (500M, 64GiB)",
    )
    gc.add_argument("--dry-run", action="store_true", help="only report what would be removed")
    gc.set_defaults(func=cmd_gc)
    verify = sub.add_parser("verify", help="check stored blocks' headers and checksums")
    verify.add_argument("config")
    verify.add_argument("--sample", type=int, metavar="N", help="check N random blocks per namespace")
    verify.add_argument("--remove", action="store_true", help="delete the corrupt blocks found")
    verify.set_defaults(func=cmd_verify)

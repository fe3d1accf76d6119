"""``tiering pin``: pin a prefix in every secondary tier of a stack that can pin (or ``--unpin`` it).

The prefix is given as the prompt's token ids (``--tokens FILE``: a JSON
list of integers or whitespace-separated integers; keys made with the
stack's ``block_size``, :func:`tiering.core.policies.pinning.prefix_keys`), as block
ids of a Mooncake trace (``--hash-ids 0,1,2``: the keys ``tiering bench``
replays), or as keys in hex (``--keys``). The stack is given as for
``tiering stat`` (a CONFIG file, ``--root DIR`` or ``--tier TYPE --KEY
VALUE``); the tiers are opened as an engine opens them (a root or namespace
not there yet is created: a block may be pinned before it is stored; a tier
holding no block of the namespace is named in a warning, as a config that
does not match the engine's pins a namespace nobody fills). ``--tenant``
pins that tenant's blocks (:func:`tiering.core.policies.tenants.scope_key`). Exit
status 0 when every tier pinned every key, 1 when a tier refused or cannot
pin (the reason is logged), 2 on bad arguments. ``--list`` lists each tier's
live pins (key, tenant, expiry, whether the block is stored) and changes nothing;
``--unpin`` says how many of the given blocks were pinned.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiering.cli.options import STACK_EPILOG, add_namespace_argument, add_stack_arguments
from tiering.cli.terminal import echo
from tiering.core.base import OffloadKey, ReqContext
from tiering.core.capabilities import PinnableTier
from tiering.core.keys import trace_block_key
from tiering.core.policies.pin_records import MAX_PIN_EXPIRY_S
from tiering.core.policies.pinning import pin_in_tiers, prefix_keys
from tiering.core.policies.tenancy import DEFAULT_TAG, PREFIX_BYTES, tag_of
from tiering.core.policies.tenants import scope_keys
from tiering.core.store.settings import inspecting
from tiering.core.units import DURATION_EXAMPLES, duration_argument, format_bytes, format_count

__all__ = ["add_pin_parser", "cmd_pin", "read_token_ids"]

_LIST_CONTEXT = ReqContext("tiering-pin-list")
"""The request context of ``--list``'s lookups (is a pinned block stored?)."""


def read_token_ids(path: str) -> list[int]:
    """Token ids from a file: a JSON list of integers, or integers separated by white space or commas.

    Raises:
        ValueError: the file holds anything else (the message names the file and the first bad token).
        OSError: the file cannot be read.
    """
    text = Path(path).read_text(encoding="utf-8").strip()
    if text.startswith("["):
        ids = json.loads(text)
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"--tokens {path}: a JSON list must hold only integers")
        return ids
    out = []
    for token in text.replace(",", " ").split():
        if not token.isdigit():
            raise ValueError(f"--tokens {path}: {token!r} is not a token id (a non-negative integer)")
        out.append(int(token))
    return out


def _keys(args: argparse.Namespace, block_size: int) -> list[OffloadKey]:
    if args.tokens:
        return prefix_keys(read_token_ids(args.tokens), block_size)
    if args.hash_ids:
        try:
            return [trace_block_key(int(i)) for i in args.hash_ids.split(",") if i.strip()]
        except ValueError:
            raise ValueError(f"--hash-ids {args.hash_ids!r}: give block ids as integers separated by commas") from None
    try:
        return [OffloadKey(bytes.fromhex(k)) for k in args.keys]
    except ValueError:
        raise ValueError("--keys: give each key as hex digits (an even number of 0-9a-f)") from None


def cmd_pin(args: argparse.Namespace) -> int:
    """Pin (or unpin) the given prefix in every secondary tier of the stack; one line per tier."""
    from tiering.cli.stacks import in_namespace, stack_config, text_output
    from tiering.core.factory import create_spec
    from tiering.core.primary import allocate_host_buffer

    config = stack_config(args)
    spec: Any = create_spec(in_namespace(config, args.namespace) if args.namespace else config)
    say = text_output(args)
    if args.list:
        if args.unpin or args.ttl is not None:
            raise ValueError("--list changes nothing: give it without --ttl and --unpin")
        return _list_pins(spec, say, args.json)
    keys = scope_keys(args.tenant, _keys(args, int(getattr(spec, "block_size", 16))))
    if not keys:
        raise ValueError("no keys to pin")
    if not args.unpin and args.ttl is None:
        raise ValueError(f"give --ttl DURATION ({DURATION_EXAMPLES}) or --unpin")
    with inspecting():  # read-only: the command writes pin records only, never evicts, expires or trims a block
        tiers = spec.create_secondary_tiers(allocate_host_buffer(1, spec.block_bytes))
    report: list[dict[str, Any]] = []
    try:
        if args.unpin:
            for index, tier in enumerate(tiers):
                can_pin = "pinned_blocks" in tier.stats() and isinstance(tier, PinnableTier)
                before = set(live_pins(tier))
                if isinstance(tier, PinnableTier):
                    tier.unpin(keys)
                ended = len(before & set(keys))
                state = (
                    f"pins of {ended} of the {len(keys)} blocks ended ({len(keys) - ended} were not pinned)"
                    if can_pin
                    else "cannot pin (nothing to unpin)"
                )
                report.append({"index": index, "type": tier.tier_type, "can_pin": can_pin, "unpinned": ended})
                say(f"secondary_tiers[{index}] {tier.tier_type}: {state}")
            if args.json:
                print(json.dumps(report, indent=2))
            return 0
        results = pin_in_tiers(tiers, keys, args.ttl)
        for index, (tier, ok) in enumerate(zip(tiers, results, strict=True)):
            stats, name = tier.stats(), f"secondary_tiers[{index}] {tier.tier_type}"
            entry: dict[str, Any] = {"index": index, "type": tier.tier_type, "can_pin": "pinned_blocks" in stats}
            report.append(entry)
            if "pinned_blocks" not in stats:
                say(f"{name}: cannot pin")
                continue
            state = (
                f"pinned {format_count(len(keys), 'block')} {_lifetime(args.ttl)}"
                if ok
                else "refused (see the warning above)"
            )
            pinned, pending = stats["pinned_blocks"], stats["pins_pending"]
            entry.update(pinned=len(keys) if ok else 0, refused=not ok, pinned_blocks=pinned, pins_pending=pending)
            now = f"the tier now has {format_count(pinned, 'block')} pinned, {pending} pinned but not stored yet"
            say(f"{name}: {state}; {now}")
            if not stats.get("resident_blocks"):
                echo(
                    f"{name}: warning: the tier holds no block of namespace {spec.namespace.digest}: check that "
                    "the config matches the engine's (tiering ls lists the namespaces of a root)",
                    sys.stderr,
                )
    finally:
        for tier in tiers:
            tier.shutdown()
    if args.json:
        print(json.dumps(report, indent=2))
    if not any(results):
        echo("tiering pin: no tier pinned the prefix", sys.stderr)
    return 0 if results and all(results) else 1


def live_pins(tier: Any) -> dict[OffloadKey, float]:
    """The tier's live pins as its medium holds them now: key -> expiry (epoch seconds); {} when it cannot pin.

    Read from the pin records themselves, so pins another process made are listed also where this process's
    config has pinning off (``max_pinned_bytes`` 0).
    """
    medium = getattr(getattr(tier, "pins", None), "medium", None)
    if medium is None:
        return {}
    now = time.time()
    out: dict[OffloadKey, float] = {}
    for key, expiry in medium.list_pins():
        if expiry > now and expiry > out.get(key, 0.0):
            out[key] = expiry
    return out


def _list_pins(spec: Any, say: Callable[[str], None], as_json: bool) -> int:
    """``tiering pin --list``: each tier's pins, one line per pin, soonest expiry first (or JSON); changes nothing."""
    from tiering.core.primary import allocate_host_buffer

    report: list[dict[str, Any]] = []
    tiers = spec.create_secondary_tiers(allocate_host_buffer(1, spec.block_bytes))
    try:
        now = time.time()
        for index, tier in enumerate(tiers):
            name, stats = f"secondary_tiers[{index}] {tier.tier_type}", tier.stats()
            entry: dict[str, Any] = {"index": index, "type": tier.tier_type, "can_pin": "pinned_blocks" in stats}
            report.append(entry)
            if "pinned_blocks" not in stats:
                say(f"{name}: cannot pin")
                continue
            bound = int(stats.get("max_pinned_bytes", 0))
            pins = live_pins(tier)
            limit = (
                f"max_pinned_bytes {format_bytes(bound)}"
                if bound
                else "pinning is off in this config (max_pinned_bytes 0; --max-pinned-bytes SIZE turns it on)"
            )
            say(f"{name}: {len(pins)} pins; {limit}")
            entry.update(max_pinned_bytes=bound, pins=[])
            policy = getattr(tier, "tenants", None)
            for key, expiry in sorted(pins.items(), key=lambda item: item[1]):
                tag = tag_of(key)
                tenant = "" if tag == DEFAULT_TAG else policy.name(tag) if policy is not None else f"tag:{tag.hex()}"
                own = key[PREFIX_BYTES:] if tag != DEFAULT_TAG else key
                until = datetime.datetime.fromtimestamp(expiry, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
                found = tier.lookup(key, _LIST_CONTEXT)
                stored = "stored" if found else "not stored yet" if found is False else "stored: not known yet"
                who = f", tenant {tenant}" if tenant else ""
                entry["pins"].append({"key": own.hex(), "tenant": tenant, "expiry": expiry, "stored": found})
                say(f"  {own.hex()}{who}: until {until} UTC (in {max(expiry - now, 0):,.0f} s), {stored}")
    finally:
        for tier in tiers:
            tier.shutdown()
    if as_json:
        print(json.dumps(report, indent=2))
    return 0


def add_pin_parser(sub: Any) -> None:
    """Register ``tiering pin`` on the ``tiering`` sub-parser."""
    pin = sub.add_parser(
        "pin",
        help="pin a prefix in every tier that can pin, for a while (or --unpin it)",
        epilog=STACK_EPILOG,
        # argparse cannot say "required unless --unpin or --list": the usage line says it
        usage=(
            "tiering pin [CONFIG | --root DIR | --tier TYPE [--KEY VALUE ...]] [--namespace DIGEST] [--tenant NAME]\n"
            "             [--json]\n"
            "             (--ttl DURATION (--tokens FILE | --hash-ids IDS | --keys HEX [HEX ...])\n"
            "              | --unpin (--tokens FILE | --hash-ids IDS | --keys HEX [HEX ...]) | --list)"
        ),
    )
    add_stack_arguments(pin, "print JSON: per tier what it pinned (or unpinned), or with --list its pins")
    add_namespace_argument(pin)
    pin.add_argument(
        "--ttl",
        type=duration_argument,
        metavar="DURATION",
        help="how long: 90 (seconds), 90s, 30m, 1h, 7d; required to pin (not with --unpin or --list)",
    )
    what = pin.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--list", action="store_true", help="list each tier's pins (key, tenant, expiry); changes nothing"
    )
    what.add_argument("--tokens", metavar="FILE", help="the prompt's token ids (JSON list, or separated by spaces)")
    what.add_argument("--hash-ids", metavar="IDS", help="Mooncake trace block ids, comma separated (0,1,2)")
    what.add_argument("--keys", nargs="+", metavar="HEX", help="block keys in hex")
    pin.add_argument("--tenant", default="", metavar="NAME", help="the tenant whose blocks these are (default: none)")
    pin.add_argument("--unpin", action="store_true", help="end the pins of these blocks now")
    pin.set_defaults(func=cmd_pin)


def _lifetime(ttl_s: float) -> str:
    """How long a pin of ``ttl_s`` seconds lasts, in words: its TTL, or the latest expiry where it saturates."""
    if time.time() + ttl_s >= MAX_PIN_EXPIRY_S:
        return f"until 9999-12-31 23:59:59 UTC (the latest pin expiry: a --ttl of {ttl_s:g} s saturates there)"
    return f"for {ttl_s:g} s"

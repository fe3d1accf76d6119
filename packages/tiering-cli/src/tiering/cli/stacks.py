"""The stack an inspection command works on: a CONFIG file, ``--root DIR`` or ``--tier TYPE --KEY VALUE``.

- :func:`stack_config`: the config (the file, or the default stack's tier built from the options);
- :func:`in_namespace`: that config set to open a namespace the root already holds (an engine's);
- :func:`persistent_tiers` / :func:`tier_location`: the tiers with an inspector, and where each keeps its blocks;
- :func:`option_pairs`: the ``--KEY VALUE`` tier options as config keys; :func:`text_output`: lines or ``--json``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from tiering.cli.bench.stack import DEFAULT_BENCH_BLOCK_BYTES, bench_config, default_local_tier
from tiering.cli.terminal import echo, redact_text
from tiering.core.configfile import load_config
from tiering.core.factory import SecondaryTierFactory
from tiering.core.inspection import TierInspector, inspector_for
from tiering.core.units import size_or_none

__all__ = ["in_namespace", "option_pairs", "persistent_tiers", "stack_config", "text_output", "tier_location"]


def option_pairs(argv: Sequence[str]) -> dict[str, str]:
    """``["--bucket", "kv", "--endpoint-url=http://h:9000"]`` -> ``{"bucket": "kv", "endpoint_url": "http://h:9000"}``.

    Raises:
        ValueError: a token is not ``--key`` or lacks its value.
    """
    out: dict[str, str] = {}
    items = list(argv)
    while items:
        token = items.pop(0)
        if not token.startswith("--") or len(token) < 3:
            raise ValueError(f"unrecognized argument {token!r} (tier keys are given as --key VALUE)")
        key, eq, value = token[2:].partition("=")
        if not eq:
            if not items or items[0].startswith("--"):
                raise ValueError(f"tier option {token} needs a value")
            value = items.pop(0)
        out[key.replace("-", "_")] = value
    return out


def _coerce(cls: type, key: str, text: str) -> Any:
    """A command-line value as the tier's schema declares ``key`` (a string when it accepts one, else JSON)."""
    schema = getattr(cls, "config_schema", None)
    spec = schema.keys.get(key) if schema is not None else None
    if spec is not None and str in spec.types:
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def stack_config(args: argparse.Namespace, notes: list[str] | None = None) -> dict[str, Any]:
    """The config a command works on: the CONFIG file, or a stack built from ``--root`` / ``--tier`` options.

    ``notes`` receives what :func:`~tiering.core.configfile.load_config` says of the file (the form it read).

    Raises:
        ValueError: both or neither given; no installed tier offers a local default.
    """
    options: dict[str, str] = dict(getattr(args, "tier_options", None) or {})
    if args.config:
        if args.tier or args.root or options:
            raise ValueError("give either a CONFIG file or --root / --tier options, not both")
        return load_config(args.config, notes)
    if args.tier is None:
        if args.root is None:
            raise ValueError(
                "give a CONFIG file, --root DIR (the directory of `tiering bench --root DIR`), or --tier TYPE "
                "with the tier's keys as options (--KEY VALUE)"
            )
        entry = default_local_tier(args.root)
        if entry is None:
            raise ValueError("no installed tier keeps blocks in a local directory; use --tier TYPE or a CONFIG")
    else:
        entry = {"type": args.tier}
        if args.root is not None:
            entry["root"] = args.root
    cls = SecondaryTierFactory.get_class(entry["type"])
    entry.update({key: _coerce(cls, key, value) for key, value in options.items()})
    return bench_config([entry], getattr(args, "block_bytes", None) or DEFAULT_BENCH_BLOCK_BYTES)


def in_namespace(config: dict[str, Any], digest: str) -> dict[str, Any]:
    """``config`` set to open namespace ``digest`` (or a unique prefix of it), as a persistent tier of it holds it.

    An engine binding sets the namespace from the engine's config when it starts (the vLLM binding: model,
    dtype, row layout and size), which a config file does not say; the namespace's ``namespace.json`` in the
    root, bucket or server does, and its fields become the config's keys
    (:meth:`~tiering.core.spec.Namespace.config_keys`).

    Raises:
        ValueError: no persistent tier holds such a namespace, the prefix is ambiguous, or its
            ``namespace.json`` is missing or does not give back its digest; the message says which.
    """
    from tiering.core.spec import Namespace, OffloadingSpec

    found = {
        held: inspector
        for _, _, inspector in persistent_tiers(config)
        for held in inspector.namespaces()
        if held.startswith(digest)
    }
    if len(found) != 1:
        what = "no persistent tier of the stack holds it" if not found else f"it names {len(found)} namespaces"
        raise ValueError(f"--namespace {digest}: {what} (`tiering ls` lists the namespaces each tier holds)")
    ((full, inspector),) = found.items()
    fields = inspector.namespace_fields(full)
    if not fields:
        raise ValueError(f"--namespace {full}: its namespace.json is missing or unreadable, so it cannot be opened")
    keys = Namespace.config_keys(fields)
    cpu = size_or_none(config.get("cpu_bytes_to_use")) or 0
    opened = {**config, **keys, "cpu_bytes_to_use": max(cpu, int(keys["block_bytes"]))}
    if OffloadingSpec(opened, strict=False).namespace.digest != full:
        raise ValueError(f"--namespace {full}: its namespace.json does not give back its digest (another format)")
    return opened


def tier_location(inspector: TierInspector, tier_config: Mapping[str, Any]) -> str:
    """Where the inspector's tier keeps its blocks, credentials redacted."""
    return redact_text(inspector.location(), {"secondary_tiers": [tier_config]})


def persistent_tiers(config: dict[str, Any]) -> list[tuple[int, dict[str, Any], TierInspector]]:
    """``(index, entry, inspector)`` of each persistent tier of ``config``; the others are named in one line each.

    Raises:
        ValueError: ``secondary_tiers`` is not a list, or no tier of it is persistent.
    """
    tiers = config.get("secondary_tiers", [])
    if not isinstance(tiers, list):
        raise ValueError("config key 'secondary_tiers' must be a list of objects")
    out = []
    for index, tier_config in enumerate(tiers):
        inspector = inspector_for(tier_config, index)
        if inspector is None:
            echo(f"secondary_tiers[{index}] ({tier_config.get('type')}): nothing persistent to inspect")
        else:
            out.append((index, tier_config, inspector))
    if not out:
        raise ValueError("the config has no persistent secondary tier to inspect")
    return out


def text_output(args: argparse.Namespace) -> Any:
    """Where a command's report lines go: :func:`echo`, or nowhere with ``--json`` (which prints JSON instead)."""
    return (lambda line: None) if args.json else echo

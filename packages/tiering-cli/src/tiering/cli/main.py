"""The ``tiering`` command: ``bench``, ``check``, ``ls``, ``stat``, ``gc``, ``verify``, ``pin``.

``bench`` lives in :mod:`tiering.cli.bench.command`, ``ls``/``stat``/``gc``/``verify``
in :mod:`tiering.cli.commands`, ``pin`` in :mod:`tiering.cli.pin`.

Exit status: 0 on success, 1 when a replay or a check of stored blocks fails,
2 on a bad configuration or bad arguments, 130 / 143 when ended by SIGINT /
SIGTERM. Every config value and error text printed goes through
:mod:`tiering.core.redact`: no credential reaches the output.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import re
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, distributions, packages_distributions, version
from typing import Any

from tiering.cli.bench.command import add_bench_parser
from tiering.cli.commands import add_commands
from tiering.cli.options import STACK_EPILOG, add_stack_arguments, check_tier_options, split_tier_options
from tiering.cli.pin import add_pin_parser
from tiering.cli.sizes import size_lines, sized_by_engine, spec_size_warnings
from tiering.cli.stacks import option_pairs, stack_config, text_output
from tiering.cli.terminal import echo, redact_text
from tiering.core.configfile import install_hint
from tiering.core.declared import check_one_block
from tiering.core.factory import (
    POLICY_KEYS,
    CachePolicyFactory,
    check_tier_constructor,
    create_secondary_tier,
    create_spec,
    resolve_tier,
    tier_error,
)
from tiering.core.policies.admission import ALWAYS, admission_config
from tiering.core.primary.memory import check_primary_fits
from tiering.core.units import format_bytes

logger = logging.getLogger("tiering.cli.main")


def provider_of(cls: type) -> str:
    """``"<distribution> <version>"`` of the installed package providing ``cls`` (or says it is none).

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
    return "not from an installed distribution"


PLUGIN_GROUPS = ("tiering.tiers", "tiering.cache_policies", "tiering.specs", "tiering.config_forms")
"""Entry-point groups through which installed distributions add tiers, cache policies, specs and config forms."""


def installed_distributions() -> list[tuple[str, str]]:
    """``(name, version)`` of every installed tiering distribution and of every third-party one plugging into it.

    Tiering's own are those whose name starts with ``tiering``; a third-party
    one declares an entry point in :data:`PLUGIN_GROUPS` and its version is
    followed by what it provides (``"1.2.0 (tiering.tiers: dict)"``). Sorted by name.
    """
    found: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().replace("_", "-").startswith("tiering"):
            found.setdefault(name, dist.version)
            continue
        provided = sorted(f"{ep.group}: {ep.name}" for ep in dist.entry_points if ep.group in PLUGIN_GROUPS)
        if provided:
            found.setdefault(name, f"{dist.version} ({', '.join(provided)})")
    return sorted(found.items(), key=lambda item: item[0].lower())


class _VersionAction(argparse.Action):
    """``--version``: each installed tiering distribution and third-party tier package, its version; the Python."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        for name, ver in installed_distributions():
            echo(f"{name} {ver}")
        echo(f"Python {platform.python_version()} ({sys.executable})")
        parser.exit()


def cmd_check(args: argparse.Namespace) -> int:
    """Check a config without side effects (every value against each tier's schema); ``--probe`` opens each tier.

    The stack is a CONFIG file, or ``--root DIR`` / ``--tier TYPE --KEY VALUE`` as for ``ls`` and ``stat``.
    ``--json`` prints what was checked as one JSON object (spec, namespace, primary, tiers with their sizes in
    bytes, warnings, probe lines) instead of the lines.
    """
    say = text_output(args)
    notes: list[str] = []
    config = stack_config(args, notes)
    report: dict[str, Any] = {"notes": notes, "warnings": [], "tiers": []}
    for line in notes:
        say(line)
    spec = create_spec(config)
    report["spec"] = f"{type(spec).__module__}.{type(spec).__qualname__}"
    say(f"spec: {report['spec']}")
    engine_sized = bool(args.config) and sized_by_engine(args.config)
    report["block_bytes_set_by_engine"] = engine_sized
    if engine_sized:
        # the digest of this file's keys alone ("model": "unknown") is not one the engine ever writes
        report["namespace"] = {"set_by_engine": True}
        say(
            "namespace: the engine's, set when it starts (model, dtype, row layout and block_bytes from its own "
            "config); `tiering ls CONFIG` lists the namespaces the root holds, `tiering stat CONFIG --namespace "
            "DIGEST` opens one"
        )
    else:
        report["namespace"] = {"digest": spec.namespace.digest, "fields": spec.namespace.to_dict()}
        say(f"namespace {spec.namespace.digest}: {json.dumps(spec.namespace.to_dict(), sort_keys=True)}")
    primary = spec.num_primary_blocks * spec.block_bytes
    report["primary"] = {"blocks": spec.num_primary_blocks, "block_bytes": spec.block_bytes, "bytes": primary}
    if engine_sized:  # 65536-byte blocks are this file's default, not the engine's rows
        report["primary"] = {"bytes": primary}
        say(
            f"primary: {primary} bytes ({format_bytes(primary)}); "
            "its blocks are the engine's rows, sized when it starts"
        )
    else:
        blocks = f"{spec.num_primary_blocks} blocks x {spec.block_bytes} bytes"
        say(f"primary: {blocks} = {primary} bytes ({format_bytes(primary)})")
    check_primary_fits(primary)
    for line in spec_size_warnings(config):
        report["warnings"].append(line)
        say(line)
    policy = getattr(spec, "eviction_policy", None)
    if policy is not None:
        cls = CachePolicyFactory.get_class(policy, getattr(spec, "cache_policy_module_path", None))
        report["eviction_policy"] = policy
        say(f"eviction_policy {policy!r}: {cls.__module__}.{cls.__qualname__} ({provider_of(cls)})")
    load_cost = getattr(spec, "load_cost", None)
    if load_cost is not None:
        say(load_cost.describe())
    tier_configs = list(getattr(spec, "secondary_tiers", []))
    if engine_sized and tier_configs:
        say("block_bytes: set by the engine (not in the config): bounds are compared with one block when it starts")
    for index, tier_config in enumerate(tier_configs):
        tier_cls, tier_type, kwargs = resolve_tier(tier_config, index)
        check_tier_constructor(tier_cls, tier_type, kwargs, spec, index=index)
        schema = getattr(tier_cls, "config_schema", None)
        label = f"secondary_tiers[{index}]"
        sizes: list[str] = []
        entry: dict[str, Any] = {
            "index": index,
            "type": tier_type,
            "class": f"{tier_cls.__module__}.{tier_cls.__qualname__}",
        }
        report["tiers"].append(entry)
        if schema is not None:
            values = schema.validate(kwargs, entry=label, also_accepted=POLICY_KEYS)
            # the bench or an engine would refuse it when the tier opens; the block size is known here
            stored_block_bytes = spec.block_bytes + getattr(tier_cls, "block_overhead_bytes", 0)
            if not engine_sized:
                check_one_block(tier_type, values, stored_block_bytes, label)
            sizes = size_lines(label, schema, tier_config, values)
            entry["sizes"] = {name: values.get(name) for name, key in schema.keys.items() if key.size}
            checked = (
                f"every value checked against its schema ({len(schema.keys)} key{'' if len(schema.keys) == 1 else 's'})"
            )
        else:
            checked = "keys checked against its constructor (the tier declares no schema; --probe checks values)"
        admission = admission_config(tier_config, index)
        if admission.policy != ALWAYS:
            checked += f"; admission {admission.policy!r} (sketch of {format_bytes(admission.sketch_bytes)})"
        entry["checked"] = checked
        say(
            f"secondary_tiers[{index}] type {tier_type!r}: "
            f"{tier_cls.__module__}.{tier_cls.__qualname__} ({provider_of(tier_cls)}); {checked}"
        )
        for line in sizes:
            if line.startswith("warning:"):
                report["warnings"].append(line)
            say(line)
    if args.probe:
        report["probe"] = []
        _probe(spec, tier_configs, say if not args.json else report["probe"].append)
        say("config ok (every tier opened)")
    else:
        say("config ok (no side effects: nothing opened; --probe also opens each root, bucket or server)")
    if args.json:
        print(json.dumps({"ok": True, **report}, indent=2, sort_keys=True))
    return 0


class TierOpenError(Exception):
    """A tier raised an error of its own type while ``tiering check --probe`` opened it; one line, exit status 2."""


CONFIG_ERRORS = (ValueError, TypeError, ImportError, AttributeError, OSError, TierOpenError)
"""What a command reports as one line with exit status 2 (a bad config, argument, path or tier)."""


def _probe(spec: Any, tier_configs: list[Any], say: Callable[[str], None]) -> None:
    """Open each tier: its class's ``probe(entry)`` when it offers one (creates nothing), else construct it.

    Every error names the entry (``secondary_tiers[N]`` and, where it can be told, ``.<key>``), as plain check does.

    Raises:
        ValueError, TypeError, ImportError, AttributeError, OSError: as raised by the tier, labelled.
        TierOpenError: the tier raised any other exception; the message names the entry and the exception's type.
    """
    from tiering.core.primary import allocate_host_buffer

    view = allocate_host_buffer(1, spec.block_bytes)
    for index, tier_config in enumerate(tier_configs):
        try:
            _probe_tier(spec, view, tier_config, index, say)
        except Exception as exc:
            labelled = tier_error(exc, tier_config, index)
            if not isinstance(labelled, CONFIG_ERRORS):
                # a tier's own exception type would otherwise end the command with a traceback
                raise TierOpenError(f"{labelled} ({type(exc).__name__})") from exc
            if isinstance(labelled, OSError) and labelled.errno is not None:
                # "[Errno 2] secondary_tiers[0]: ..." would put the errno before the entry and hide the type
                text = re.sub(r"^\[Errno -?\d+\] ", "", str(labelled))
                raise TierOpenError(f"{text} ({type(exc).__name__})") from exc
            if labelled is exc:
                raise
            raise labelled from exc


def _probe_tier(spec: Any, view: memoryview, tier_config: Any, index: int, say: Callable[[str], None]) -> None:
    """Probe or open entry ``secondary_tiers[index]`` and print what was found; errors unlabelled."""
    from tiering.core.capabilities import Probeable, ReportsProbe
    from tiering.core.inspection import inspector_for
    from tiering.core.primary.memory import format_bytes

    cls, tier_type, kwargs = resolve_tier(tier_config, index)
    inspector = inspector_for(tier_config, index)
    where = None if inspector is None else redact_text(inspector.location(), {"secondary_tiers": [tier_config]})
    free = None if inspector is None else inspector.free_bytes()
    found = cls.probe(tier_config) if isinstance(cls, Probeable) else None
    head = f"probe {tier_type!r} ({where})" if where else f"probe {tier_type!r}"
    tail = "" if where else " (in memory, nothing kept)"
    capacity = kwargs.get("capacity_bytes")  # in bytes, also where the config wrote "4GiB"
    if free is not None and isinstance(capacity, int) and capacity > free:
        say(
            f"warning: secondary_tiers[{index}].capacity_bytes: {capacity} bytes ({format_bytes(capacity)}) is "
            f"more than the {free} bytes ({format_bytes(free)}) free at {where}; the tier holds no more than the disk "
            "does"
        )
    if found is not None:
        say(f"{head}: ok{tail}; {redact_text(found, {'secondary_tiers': [tier_config]})}")
        return
    tier = create_secondary_tier(tier_config, view, spec, index=index)
    try:
        say(f"{head}: ok{tail}")
        for line in tier.probe_report() if isinstance(tier, ReportsProbe) else []:
            say(f"  {redact_text(line, {'secondary_tiers': [tier_config]})}")
    finally:
        tier.shutdown()


def build_parser() -> argparse.ArgumentParser:
    """The ``tiering`` argument parser."""
    parser = argparse.ArgumentParser(prog="tiering", description="KV-cache tiering: replays and config checks.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the version of every installed tiering package and third-party tier package",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_parser(sub)
    check = sub.add_parser(
        "check",
        help="check a config: every value, without side effects (--probe: also open each tier)",
        epilog=STACK_EPILOG,
    )
    add_stack_arguments(check, "print what was checked as JSON (sizes in bytes, warnings, probe lines)")
    check.add_argument("--probe", action="store_true", help="also construct each tier: opens roots, buckets, servers")
    check.set_defaults(func=cmd_check)
    add_commands(sub)
    add_pin_parser(sub)
    for command in sub.choices.values():  # `tiering check -v CONFIG` as well as `tiering -v check CONFIG`
        command.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log at INFO level"
        )
    return parser


def _secret_context(args: argparse.Namespace) -> Any:
    """What the command was given that may hold secrets: its config file and tier options."""
    context: dict[str, Any] = {"options": dict(getattr(args, "tier_options", None) or {})}
    path = getattr(args, "config", None)
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                context["config"] = json.load(f)
        except (OSError, ValueError):
            pass
    return context


def error_text(exc: BaseException, context: Any = None) -> str:
    """The one-line message of a failed command: redacted, with the install hint it needs.

    The ``PYTHONPATH`` advice for a ``module_path`` that is not found comes with the error itself
    (:func:`tiering.core.registry.import_module_path`), only when the module itself is missing (not when
    something it imports, such as vLLM, is).
    """
    text = redact_text(exc, context)
    if "./packages/" not in text:
        text = _PIP_INSTALL.sub(lambda m: install_hint(m.group(1)), text)
    return text


_PIP_INSTALL = re.compile(r"pip install (tiering-[a-z0-9-]*[a-z0-9])")


class _RedactingFilter(logging.Filter):
    """Redacts every log record (message and arguments) against the command's secret context."""

    def __init__(self, context: Any) -> None:
        super().__init__()
        self.context = context

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact_text(record.getMessage(), self.context)
        record.args = None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info), self.context)
            record.exc_info = None
        return True


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tiering`` command."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    argv, extra = split_tier_options(parser, argv)
    args = parser.parse_args(argv)
    check_tier_options(parser, args, extra)
    try:
        args.tier_options = option_pairs(extra)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(_RedactingFilter(_secret_context(args)))
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): not an error of ours.
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        echo(f"tiering {args.command}: interrupted", sys.stderr)
        return 130
    except CONFIG_ERRORS as exc:
        echo(f"tiering {args.command}: error: {error_text(exc, _secret_context(args))}", sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

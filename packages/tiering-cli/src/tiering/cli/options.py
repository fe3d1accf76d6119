"""The arguments every inspection subcommand shares, and its ``--KEY VALUE`` tier options.

:func:`add_stack_arguments` gives ``check``, ``ls``, ``stat``, ``gc``, ``verify`` and ``pin`` the same
``CONFIG`` / ``--root DIR`` / ``--tier TYPE`` / ``--json``, so a flag one of them takes the others take alike.

``tiering ls --tier s3 --bucket kv`` gives a tier's config keys as options.
:func:`split_tier_options` separates them from the sub-command's own
arguments; :func:`check_tier_options` accepts only keys the tier declares
(its ``config_schema``, else its constructor's parameters) and answers any
other option as argparse does, ``unrecognized option --samples (did you mean
--sample?)``, instead of reading it as a config key.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
from typing import Any

__all__ = [
    "STACK_EPILOG",
    "add_namespace_argument",
    "add_stack_arguments",
    "check_tier_options",
    "split_tier_options",
    "tier_option_keys",
]

STACK_EPILOG = (
    "Without CONFIG: --root DIR opens the tier `tiering bench --root DIR` uses; --tier TYPE --KEY VALUE ... "
    "opens one tier of that type with those config keys (e.g. --tier s3 --bucket kv --prefix fleet-a)."
)
"""The help's epilog of every subcommand that takes :func:`add_stack_arguments`."""


def add_stack_arguments(parser: argparse.ArgumentParser, json_help: str) -> None:
    """Add ``CONFIG`` (optional), ``--tier TYPE``, ``--root DIR`` and ``--json`` to an inspection subcommand.

    The stack is a CONFIG file or one tier given on the command line (``--root DIR``: the default stack's tier
    there; ``--tier TYPE`` with its keys as ``--KEY VALUE``, which :func:`split_tier_options` sets aside);
    :func:`tiering.cli.stacks.stack_config` builds it and refuses both or neither.

    Args:
        parser: the subcommand's parser.
        json_help: what ``--json`` prints for this subcommand.
    """
    parser.add_argument("config", nargs="?", help="JSON config file (or --root / --tier)")
    parser.add_argument("--tier", metavar="TYPE", help="a tier type; its config keys follow as --KEY VALUE")
    parser.add_argument("--root", metavar="DIR", help="the directory of the tier (`tiering bench --root DIR`)")
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.set_defaults(accepts_tier_options=True)


def add_namespace_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--namespace DIGEST`` to a subcommand that opens the tiers (``stat``, ``pin``).

    It opens the namespace a root already holds (its ``namespace.json``: :func:`tiering.cli.stacks.in_namespace`)
    instead of the config's own, which an engine binding completes only when the engine starts.
    """
    parser.add_argument(
        "--namespace",
        metavar="DIGEST",
        help="open this namespace of the root (a digest `tiering ls` lists, or a unique prefix), e.g. the one an "
        "engine wrote: its namespace.json gives the model, dtype, layout and block size",
    )


def split_tier_options(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate the ``--KEY VALUE`` tier options of ``ls``/``stat``/``gc``/``verify`` from their own arguments.

    Options the sub-command does not declare (with their value) are tier
    keys; everything else stays, in order, for argparse.

    Returns:
        ``(arguments for argparse, tier option tokens)``.
    """
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    index = next((i for i, token in enumerate(argv) if token in subparsers.choices), None)
    if index is None:
        return argv, []
    sub = subparsers.choices[argv[index]]
    if sub.get_default("accepts_tier_options") is not True:
        return argv, []
    known = sub._option_string_actions
    kept, extra = argv[: index + 1], []
    tokens = argv[index + 1 :]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, _ = token.partition("=")
        takes_value = token.startswith("--") and not eq and i + 1 < len(tokens)
        if token.startswith("--") and name not in known:
            extra.append(token)
            if takes_value and not tokens[i + 1].startswith("--"):
                extra.append(tokens[i + 1])
                i += 1
        else:
            kept.append(token)
            action = known.get(name)
            if action is not None and action.nargs != 0 and takes_value:
                kept.append(tokens[i + 1])
                i += 1
        i += 1
    return kept, extra


def tier_option_keys(args: argparse.Namespace) -> set[str] | None:
    """The config keys that may follow as ``--KEY VALUE``: those of ``--tier TYPE``, or of ``--root DIR``'s tier.

    Returns:
        The keys (empty: no tier options allowed, e.g. with a CONFIG file), or
        None when the tier cannot be resolved here (its own error follows later).
    """
    from tiering.cli.bench.stack import default_local_tier
    from tiering.core.factory import SecondaryTierFactory

    if getattr(args, "config", None) or (args.tier is None and args.root is None):
        return set()
    try:
        if args.tier is not None:
            cls = SecondaryTierFactory.get_class(args.tier)
        else:
            entry = default_local_tier(args.root)
            if entry is None:
                return None
            cls = SecondaryTierFactory.get_class(entry["type"])
    except (ValueError, ImportError, AttributeError, TypeError):
        return None
    schema = getattr(cls, "config_schema", None)
    if schema is not None:
        return set(schema.keys)
    params = inspect.signature(cls.__init__).parameters
    return {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD} - {
        "self",
        "offloading_spec",
        "primary_kv_view",
        "tier_type",
    }


def check_tier_options(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> None:
    """Exit (status 2, argparse's usage error) on an option that is neither the sub-command's nor a tier key.

    Args:
        parser: the ``tiering`` parser.
        args: the parsed sub-command arguments.
        extra: the tokens :func:`split_tier_options` set aside.
    """
    options = [t for t in extra if t.startswith("--")]
    if not options:
        return
    keys = tier_option_keys(args)
    if keys is None:
        return
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub: Any = subparsers.choices[args.command]
    own = [o for o in sub._option_string_actions if o.startswith("--")]
    for token in options:
        name = token.partition("=")[0]
        if name[2:].replace("-", "_") in keys:
            continue
        close = difflib.get_close_matches(name, own + ["--" + k.replace("_", "-") for k in sorted(keys)], 1, 0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        if not keys and getattr(args, "config", None):
            hint += "; with a CONFIG file, tier keys are set in the file"
        elif not keys:
            hint += "; tier keys (--KEY VALUE) follow --tier TYPE or --root DIR"
        sub.error(f"unrecognized option {name}{hint}")

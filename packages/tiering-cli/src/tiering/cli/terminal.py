"""Text output for a terminal: names read from storage or a config never steer it.

Namespace fields (a model name), file and object names, roots and error
messages come from places anyone may write. Printed raw, a newline in a model
name splits one entry over two lines, an ANSI escape sequence recolours or
rewrites the terminal, and a right-to-left override shows a name reversed.
Every text line of the ``tiering`` commands goes through :func:`printable`
(:func:`echo` prints with it); JSON output needs nothing of it, since
``json.dumps`` escapes those characters and a JSON reader gets the exact string back.

No credential is printed either: every error text goes through
:func:`redact_text` (:mod:`tiering.core.redact`, with the secret keys each tier
declares in its schema; whole configs go through
:func:`tiering.core.factory.redact_offloading_config`).
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from tiering.core import redact
from tiering.core.factory import SecondaryTierFactory

_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
"""Escapes written by name; a backslash is doubled, so an escape is never confused with a name's own backslash."""


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: object) -> str:
    r"""``str(text)`` with every character that is not printable written as a Python escape.

    Escaped: control characters (C0, DEL, C1: newline ``\n``, ESC ``\x1b``),
    format characters (the bidirectional overrides and isolates such as
    U+202E ``\u202e``, zero-width characters), line and paragraph separators,
    spaces other than U+0020, lone surrogates (a file name that is not UTF-8),
    private-use and unassigned code points: whatever ``str.isprintable``
    refuses. A backslash is doubled. The result is one line and shows every
    such character where it is.

    Args:
        text: any object; its ``str()`` is escaped.

    Returns:
        The escaped text (``text`` itself, as a str, when nothing needed escaping).
    """
    s = str(text)
    if s.isprintable() and "\\" not in s:
        return s
    return "".join(ch if ch.isprintable() and ch != "\\" else _escape(ch) for ch in s)


def echo(text: object, file: TextIO | None = None) -> None:
    """Print ``printable(text)`` as one line on ``file`` (standard output by default)."""
    print(printable(text), file=file if file is not None else sys.stdout)


def documentation_url(page: str = "") -> str:
    """The ``Documentation`` URL of tiering-core's metadata (``[project.urls]``), with ``page`` appended."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        urls = metadata("tiering-core").get_all("Project-URL") or []
    except PackageNotFoundError:
        urls = []
    base = next((u.split(",", 1)[1].strip() for u in urls if u.lower().startswith("documentation,")), "")
    return f"{base.rstrip('/')}/{page}" if base else page


def secret_keys(config: Any) -> frozenset[str]:
    """The secret key names declared by the schemas of the tiers a config names (installed ones)."""
    keys: set[str] = set()
    tiers = config.get("secondary_tiers") if isinstance(config, Mapping) else None
    for entry in tiers if isinstance(tiers, list) else []:
        name = entry.get("type") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or name not in SecondaryTierFactory.known_names():
            continue
        try:
            schema = SecondaryTierFactory.get_class(name).config_schema
        except (ImportError, TypeError, ValueError, AttributeError):
            continue
        if schema is not None:
            keys.update(schema.secret_keys)
    return frozenset(keys)


def redact_text(text: object, config: Any = None) -> str:
    """``str(text)`` without any credential (of ``config``, URL passwords, ``key=value`` secrets)."""
    return redact.redact_text(text, config, secret_keys(config) if config is not None else ())


def tier_location(tier_config: Mapping[str, Any], index: int = 0) -> str | None:
    """Where a tier entry keeps its blocks (its inspector's location, credentials redacted); None: nowhere."""
    from tiering.core.inspection import inspector_for

    inspector = inspector_for(tier_config, index)
    return None if inspector is None else redact_text(inspector.location(), {"secondary_tiers": [tier_config]})


def shares_terminal() -> bool:
    """Whether stdout and stderr are one terminal, file or pipe (a shell without redirection, or ``> log 2>&1``)."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False
    return (out.st_dev, out.st_ino, out.st_rdev) == (err.st_dev, err.st_ino, err.st_rdev)

"""Text output for a terminal: names read from storage or a config never steer it.

Namespace fields (a model name), file and object names, roots and error
messages come from places anyone may write. Printed raw, a newline in a model
name splits one entry over two lines, an ANSI escape sequence recolours or
rewrites the terminal, and a right-to-left override shows a name reversed.
Every text line of the ``tiering`` commands goes through :func:`printable`
(:func:`echo` prints with it); JSON output needs nothing of it, since
``json.dumps`` escapes those characters and a JSON reader gets the exact string back.
"""

from __future__ import annotations

import sys
from typing import TextIO

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

"""Unambiguous encodings of several fields: length-prefixed bytes and structured text.

A name or digest built from several fields must never let two different
field lists give the same bytes. Joining fields with nothing between them
(``"ab" + "c"`` == ``"a" + "bc"``) or with a separator a field may contain
does exactly that: a LoRA name and a cache salt, or a user's layout name and
an engine's layout facts, could then pass for each other, and two
configurations would read each other's blocks. Every digest of tiering is
built from one of these two encodings instead.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping

_LENGTH = struct.Struct("<Q")


def length_prefixed(*fields: bytes) -> bytes:
    """Each field as its length (uint64, little-endian, bytes) followed by its bytes, concatenated.

    The encoding is injective: the lengths say where each field ends, so
    ``(b"ab", b"c")`` and ``(b"a", b"bc")`` give different bytes.
    """
    return b"".join(_LENGTH.pack(len(field)) + bytes(field) for field in fields)


def structured(fields: Mapping[str, str | int]) -> str:
    """``fields`` as compact JSON text, in the order given (strings quoted and escaped).

    Used where a composite value must stay readable (a namespace's
    ``kv_layout``, which ``namespace.json`` and ``tiering stat`` show): JSON's
    quoting makes it injective whatever characters a field holds.

    Raises:
        TypeError: a value is neither a str nor an int.
    """
    for name, value in fields.items():
        if not isinstance(value, (str, int)):
            raise TypeError(f"field {name!r} must be a str or an int, got {type(value).__name__}")
    return json.dumps(dict(fields), separators=(",", ":"))

"""Byte sizes and durations, read and written one way everywhere: ``"4GiB"`` in, ``"4.0 GiB"`` out.

:func:`parse_size` reads what a person writes (``gc --to-bytes 100MB``, a
config's ``"cpu_bytes_to_use": "4GiB"``), :func:`size_value` reads a config's size key through it (one
path, one message); :func:`format_bytes` is how every
report prints a size (binary units: KiB, MiB, GiB, TiB).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)b?$", re.IGNORECASE)

SIZE_EXAMPLES = "e.g. 4GiB, 256MiB, 500MB or 65536"
"""What a size looks like, for messages."""


def parse_size(text: str) -> int:
    """``"500000000"``, ``"500M"``, ``"100GB"`` (powers of 1000) or ``"64GiB"`` (powers of 1024) -> bytes.

    Raises:
        ValueError: another form; the message names the value.
    """
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError(f"size {text!r} is not a number of bytes with an optional unit ({SIZE_EXAMPLES})")
    number, unit, binary = match.groups()
    power = "kmgtp".find(unit.lower()) + 1 if unit else 0
    return int(float(number) * (1024 if binary else 1000) ** power)


def size_value(value: Any, where: str, minimum: int = 0, why: str = "") -> int:
    """A byte count as every key tiering reads takes it: an integer, or text with a unit (:func:`parse_size`).

    The one path of the sizes tiering reads outside a tier's schema (the spec's ``cpu_bytes_to_use`` and
    ``block_bytes``, tenants' ``quota_bytes``, LMCache's ``object_bytes``), so each takes the same forms and
    answers a bad one alike. Keys vLLM reads itself stay integers (:mod:`tiering.core.configfile` says so).

    Args:
        value: the config's value (``"4GiB"``, ``"500MB"``, ``"65536"`` or ``65536``).
        where: the key for messages (``"config key 'block_bytes'"``, ``"tenants.default.quota_bytes"``).
        minimum: the smallest count accepted, bytes.
        why: where the minimum comes from, for the message.

    Raises:
        ValueError: ``"<where> must be an integer of bytes >= <minimum> or a size with a unit (e.g. ...), got
            <value>"``, for a malformed text, a bool, a float, another type or a count below ``minimum``.
    """
    count = value
    if isinstance(value, str):
        try:
            count = parse_size(value)
        except ValueError:
            count = None
    if isinstance(count, bool) or not isinstance(count, int) or count < minimum:
        because = f" ({why})" if why else ""
        raise ValueError(
            f"{where} must be an integer of bytes >= {minimum}{because} or a size with a unit ({SIZE_EXAMPLES}), "
            f"got {value!r}"
        )
    return count


def size_or_none(value: Any) -> int | None:
    """:func:`size_value` where a malformed value is reported elsewhere: the count, or None."""
    try:
        return size_value(value, "size")
    except ValueError:
        return None


def decimal_unit_note(text: str) -> str | None:
    """What a size written with a decimal unit (``"4GB"``: powers of 1000) is, for a warning; None otherwise.

    ``"4GB"`` -> ``'"4GB" is 4000000000 bytes (3.7 GiB: GB is a power of 1000); for 4 GiB write "4GiB" or
    4294967296'``. Integers, binary units (``"4GiB"``) and malformed text give None.
    """
    match = _SIZE.match(text.strip()) if isinstance(text, str) else None
    if not match or not match.group(2) or match.group(3):
        return None
    number, unit = match.group(1), match.group(2).upper()
    binary = int(float(number) * 1024 ** ("KMGTP".find(unit) + 1))
    return (
        f"{text!r} is {parse_size(text)} bytes ({format_bytes(parse_size(text))}: {unit}B is a power of 1000); "
        f'for {number} {unit}iB write "{number}{unit}iB" or {binary}'
    )


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw]?)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


DURATION_EXAMPLES = "plain seconds (90) or a number with a unit s, m, h, d or w (90s, 30m, 1h, 7d)"
"""What a duration looks like, for messages: every duration tiering reads takes both forms."""


def parse_duration(text: str) -> float:
    """``"90"`` or ``"90s"`` (seconds), ``"30m"`` (minutes), ``"12h"``, ``"7d"``, ``"2w"`` -> seconds.

    Raises:
        ValueError: another form; the message names the value.
    """
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"duration {text!r} is not {DURATION_EXAMPLES}")
    return float(match.group(1)) * _UNIT_S[match.group(2) or "s"]


def format_bytes(n: float) -> str:
    """``34359738368`` -> ``"32.0 GiB"``, ``20480`` -> ``"20.0 KiB"``, ``512`` -> ``"512 B"``.

    Binary units (KiB, MiB, GiB, TiB), one decimal.
    """
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(round(value, 1)) < 1024 or unit == "TiB":  # 1023.99 MiB is "1.0 GiB", never "1024.0 MiB"
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        value /= 1024
    raise AssertionError("unreachable")


def format_count(n: int, noun: str) -> str:
    """A count and its noun in agreement: ``(1, "block")`` -> ``"1 block"``, ``(1024, "block")`` -> ``"1,024 blocks"``.

    Args:
        n: the count.
        noun: the noun in the singular, made plural by an ``s``.
    """
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """``parse`` as an argparse ``type``: its ``ValueError`` becomes argparse's error, which names the flag.

    Used as ``type=argument_type(parse_size)``: a bad value reads ``argument --to-bytes: size '7x' is not ...``
    instead of argparse's bare ``invalid value``.
    """

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


size_argument = argument_type(parse_size)
"""A byte count with an optional unit, as an argparse type."""
duration_argument = argument_type(parse_duration)
"""A duration (``"90"``, ``"90s"``, ``"12h"``, ``"7d"``) in seconds, as an argparse type."""

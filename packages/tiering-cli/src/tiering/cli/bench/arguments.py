"""Arguments of ``tiering bench`` checked before a replay: numbers, sizes with a unit, and the paths it will write.

A replay takes seconds to minutes; a path that cannot be written is reported
at once, naming its flag, instead of after the replay.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tiering.cli.bench.throttle import parse_throttle
from tiering.core.configfile import install_hint
from tiering.core.units import size_argument


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def positive_size(text: str) -> int:
    """An argparse type: a byte count >= 1, with an optional unit (``"64MiB"``; :func:`tiering.core.units.parse_size`).

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    value = size_argument(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def throttle_argument(text: str) -> tuple[float, float | None]:
    """An argparse type: ``--throttle LATENCY_S[,BANDWIDTH]`` (:func:`tiering.cli.bench.throttle.parse_throttle`)."""
    try:
        return parse_throttle(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_output_file(flag: str, path: str) -> None:
    """Fail now, before a replay, when ``path`` could not be written at the end.

    Raises:
        ValueError: ``path`` is a directory, or its directory is missing or not writable; the message names ``flag``.
    """
    target = Path(path)
    parent = target.parent
    if target.is_dir():
        raise ValueError(f"{flag} {path}: is a directory; give a file name")
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"{flag} {path}: cannot write there (permission denied)")
    # Permission bits do not tell everything (/proc, a read-only mount): open
    # the file for append, as the end of the run will write it, and remove it
    # again when it did not exist before.
    existed = target.exists()
    try:
        os.close(os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    except OSError as exc:
        raise ValueError(f"{flag} {path}: cannot create the file: {exc.strerror or exc}") from None
    if not existed:
        target.unlink(missing_ok=True)


PLOT_FORMATS = ("eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg", "svgz", "tif", "tiff", "webp")
"""File name extensions matplotlib's non-interactive backends write (a name without one is written as PNG)."""


def check_plot_file(path: str) -> None:
    """Fail now, before a replay, when ``--plot path`` could not be drawn at the end.

    The format is taken from the extension, as matplotlib does; matplotlib is not imported.

    Raises:
        ValueError: the extension is not one of :data:`PLOT_FORMATS`, or :func:`check_output_file` fails;
            the message names ``--plot``.
    """
    suffix = Path(path).suffix.lower().removeprefix(".")
    if suffix and suffix not in PLOT_FORMATS:
        raise ValueError(
            f"--plot {path}: matplotlib cannot write the format {suffix!r}; use one of {', '.join(PLOT_FORMATS)} "
            "(e.g. replay.png)"
        )
    check_output_file("--plot", path)


def check_output_dir(flag: str, path: str) -> None:
    """Fail now, before a replay, when directory ``path`` could not be created or written.

    Raises:
        ValueError: ``path`` or the nearest existing directory above it is not a writable directory;
            the message names ``flag``.
    """
    target = Path(path)
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"{flag} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: cannot write in {existing} (permission denied)")


def check_plot_available() -> None:
    """``--plot`` needs matplotlib (the ``[plot]`` extra).

    Raises:
        ImportError: matplotlib is not installed; the message gives the install line.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"--plot needs matplotlib: {install_hint('tiering-core', extra='plot')}") from exc

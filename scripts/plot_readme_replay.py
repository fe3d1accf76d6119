#!/usr/bin/env python3
"""Regenerate the README's replay plot, docs/content/img/replay-conversation.png.

It runs the README quick start's command, ``tiering bench`` (no arguments:
the first 2,000 requests of the shipped Mooncake conversation trace through
the default stack), plus ``--plot`` into that file, with the ``tiering``
command installed beside this Python (it needs the ``[plot]`` extra), so the
picture is what the shown command produces. Its report is printed as usual.

    .venv/bin/python scripts/plot_readme_replay.py
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

README_COMMAND = ["bench"]
"""The arguments of the README quick start's ``tiering`` command (a docs test keeps the two equal)."""

PLOT = Path("docs/content/img/replay-conversation.png")
"""The README's picture, relative to the repository root."""


def main() -> int:
    """Run the README's command plus ``--plot``; its exit status."""
    argv = [str(Path(sys.executable).parent / "tiering"), *README_COMMAND, "--plot", str(REPO / PLOT)]
    print(f"running: {shlex.join(argv)}", file=sys.stderr, flush=True)
    return subprocess.call(argv, cwd=REPO)


if __name__ == "__main__":
    sys.exit(main())

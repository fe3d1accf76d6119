"""Progress of a replay on stderr: a tqdm bar on a terminal, a line every few seconds otherwise.

Logs of CI jobs, ``nohup`` runs and pipes get plain lines such as::

    tiering bench: 812/2000 requests, hit ratio 27.3%, 412.3 MiB moved, 9 s
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

from tiering.core.units import format_bytes

PROGRESS_INTERVAL_S = 3.0
"""Seconds between progress lines when stderr is not a terminal."""


class Progress:
    """Reports replay progress; call :meth:`update` after each request.

    Args:
        total: requests to replay.
        figures: returns ``(requests done, hits, block lookups, bytes moved)``; bytes moved: the payload
            requests loaded plus stored (:attr:`~tiering.cli.bench.ReplayReport.request_bytes`).
        stream: where to write (default stderr).
        interval_s: seconds between lines when ``stream`` is not a terminal.
        label: prefix of each line.
    """

    def __init__(
        self,
        total: int,
        figures: Callable[[], tuple[int, int, int, int]],
        stream: TextIO | None = None,
        interval_s: float = PROGRESS_INTERVAL_S,
        label: str = "tiering bench",
    ) -> None:
        self.total = total
        self.figures = figures
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.label = label
        self._bar: Any = None
        self._start = time.monotonic()
        self._next = self._start + interval_s

    def line(self) -> str:
        """The current progress line."""
        done, hits, lookups, moved = self.figures()
        ratio = hits / lookups if lookups else 0.0
        return (
            f"{self.label}: {done}/{self.total} requests, hit ratio {ratio:.1%}, {format_bytes(moved)} moved, "
            f"{time.monotonic() - self._start:.0f} s"
        )

    def update(self, n: int = 1) -> None:
        """Advance by ``n`` requests."""
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.interval_s
            print(self.line(), file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        isatty = getattr(self.stream, "isatty", None)
        if callable(isatty) and isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, unit="req", file=self.stream)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

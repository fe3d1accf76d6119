"""Clean ends of a replay on Ctrl-C (SIGINT) and SIGTERM.

While a :class:`StopOnSignal` is active, the first SIGINT or SIGTERM only
records itself: the replay polls :meth:`StopOnSignal.reason` between
requests, finishes the request it is in, drains the jobs in flight and
prints a partial report. A second signal asks to stop waiting
(:meth:`StopOnSignal.abandon`): the replay stops draining and the manager's
``shutdown`` reports the jobs still in flight as failed. Either way no
traceback is printed and the exit status is the shell's ``128 + signal``
(130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    """Context manager turning SIGINT / SIGTERM into a polled stop request.

    Handlers are only installed in the main thread (Python delivers signals
    there); elsewhere the context manager does nothing. The previous
    handlers are restored on exit.

    Args:
        label: prefix of the one line printed to stderr when a signal arrives.
    """

    def __init__(self, label: str = "tiering") -> None:
        self.label = label
        self.signum: int | None = None
        self.count = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum
        name = signal.Signals(signum).name
        if self.count == 1:
            print(
                f"{self.label}: {name}: finishing the request in flight and draining its jobs (again to stop waiting)",
                file=sys.stderr,
                flush=True,
            )
        elif self.count == 2:
            print(f"{self.label}: {name} again: abandoning the jobs in flight", file=sys.stderr, flush=True)

    def reason(self) -> str | None:
        """The name of the first signal received (``"SIGINT"``), or None."""
        return signal.Signals(self.signum).name if self.signum is not None else None

    def abandon(self) -> bool:
        """Whether a second signal asked to stop waiting for jobs in flight."""
        return self.count >= 2

    @property
    def exit_status(self) -> int | None:
        """``128 + signal number`` once a signal arrived (130, 143), else None."""
        return 128 + self.signum if self.signum is not None else None

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

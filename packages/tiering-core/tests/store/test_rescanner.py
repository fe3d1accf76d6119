"""The rescan thread: a wake during a pass is never lost, also when rescans run only on demand."""

from __future__ import annotations

import threading

from tiering.core.store.scans import Rescanner


def test_scans_a_wake_landing_as_the_on_demand_pass_ends_runs_one_more_pass():
    # With interval_s 0 the thread ends after its pass. A reset (first_done cleared, then wake) that lands while
    # the pass is finishing must still get a pass of its own, and first_done must wait for that pass.
    calls: list[bool] = []
    second_started = threading.Event()
    box: list[Rescanner] = []
    built = threading.Event()

    def scan(first: bool) -> None:
        calls.append(first)
        if len(calls) == 1:
            assert built.wait(30)  # the reset lands during the first pass, before the thread decides to end
            box[0].first_done.clear()
            box[0].wake()
        else:
            second_started.set()

    rescanner = Rescanner(scan, 0.0, "test-rescan")
    box.append(rescanner)
    built.set()
    try:
        assert rescanner.first_done.wait(30)
        assert second_started.wait(30), "the wake during the pass was lost: no second pass"
        assert rescanner.first_done.wait(30)
        assert calls == [True, False]
    finally:
        rescanner.stop()


def test_scans_a_wake_after_the_on_demand_thread_ended_starts_a_new_pass():
    done = threading.Semaphore(0)
    calls: list[bool] = []

    def scan(first: bool) -> None:
        calls.append(first)
        done.release()

    rescanner = Rescanner(scan, 0.0, "test-rescan")
    try:
        assert done.acquire(timeout=30) and rescanner.first_done.wait(30)
        rescanner.first_done.clear()
        rescanner.wake()
        assert done.acquire(timeout=30) and rescanner.first_done.wait(30)
        assert calls == [True, False]
    finally:
        rescanner.stop()

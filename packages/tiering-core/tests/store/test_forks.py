"""Toolkit parts used in a child forked after they were built: refused at once, never a hang."""

import os

import pytest

from tiering.core.store.forks import ForkedStackError, ProcessOwner
from tiering.core.store.index import CapacityIndex
from tiering.core.store.jobs import JobTracker
from tiering.core.store.pool import IOPool
from tiering.testing.harness import in_forked_child, load_job, make_key


def test_c20_pool_in_a_forked_child_fails_work_at_once_and_the_parent_pool_runs():
    pool = IOPool(2, 1, name="fork-test")
    try:
        assert pool.wait_idle(5)

        def child():
            failed = []
            pool.submit("read", lambda items: None, [1, 2], lambda items, exc: failed.append((list(items), exc)))
            ((items, exc),) = failed  # called at once, on this thread: no worker of the pool exists here
            with pytest.raises(ForkedStackError):
                pool.wait_idle(1)
            with pytest.raises(ForkedStackError):
                pool.pending()
            pool.shutdown()  # returns at once (nothing of the parent's is joined or drained)
            return items, type(exc).__name__, str(exc)

        outcome = in_forked_child(child, timeout_s=20)
        items, kind, message = outcome["returned"]
        assert items == [1, 2] and kind == "ForkedStackError"
        assert f"I/O pool 'fork-test' was built in process {os.getpid()}" in message
        assert "after forking" in message

        ran = []
        pool.submit("read", ran.extend, [3, 4], lambda items, exc: None)
        assert pool.wait_idle(5) and sorted(ran) == [3, 4]  # the parent's threads go on
    finally:
        pool.shutdown()


def test_c20_jobs_and_index_refuse_in_a_forked_child_and_count_the_fork():
    jobs, index = JobTracker(), CapacityIndex(None)
    assert jobs.stats()["forks"] == 0

    def child():
        refused = []
        for call in (
            lambda: jobs.start(load_job([make_key(1)], [0])),
            jobs.take_finished,
            jobs.in_flight,
            jobs.stats,
            lambda: index.lookup(make_key(1)),
            lambda: index.touch([make_key(1)]),
            index.stats,
        ):
            try:
                call()
            except ForkedStackError:
                refused.append(True)
        return len(refused), jobs.fail_all()  # fail_all (a shutdown) does nothing in the child

    assert in_forked_child(child, timeout_s=20)["returned"] == (7, [])
    assert jobs.stats()["forks"] == 1 and index.lookup(make_key(1)) is not None
    jobs.start(load_job([make_key(1)], [0]))  # the parent's tracker still works
    assert jobs.in_flight() == 1


def test_process_owner_is_forked_only_in_a_child():
    owner = ProcessOwner("the thing")
    assert not owner.forked and owner.forks() == 0
    owner.check()
    assert in_forked_child(lambda: (owner.forked, ProcessOwner("new").forked))["returned"] == (True, False)
    assert owner.forks() == 1 and not owner.forked

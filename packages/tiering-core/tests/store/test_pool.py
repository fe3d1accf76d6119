import sys
import threading
import time

import pytest

from tiering.core.store.pool import IOPool, PoolShutdownError


def collect():
    done, errors, lock = [], [], threading.Lock()

    def fn(items):
        with lock:
            done.append(list(items))

    def on_error(items, exc):
        with lock:
            errors.append((list(items), type(exc)))

    return fn, on_error, done, errors


def test_items_are_processed_in_shares():
    pool = IOPool(2, 2, max_batch=4)
    fn, on_error, done, errors = collect()
    pool.submit("write", fn, list(range(10)), on_error)
    pool.submit("read", fn, list(range(100, 103)), on_error)
    assert pool.wait_idle(5)
    pool.shutdown()
    flat = sorted(i for share in done for i in share)
    assert flat == list(range(10)) + list(range(100, 103))
    assert max(len(s) for s in done) <= 5 and not errors


def wait_for(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def occupy(pool, n):
    """Wait until all ``n`` threads of ``pool`` wait for work, then give each a call that waits; returns its gate."""
    gate, running = threading.Event(), []

    def hold(items):
        running.append(items)
        gate.wait(5)

    wait_for(lambda: pool._waiting[True] + pool._waiting[False] == n)
    for _ in range(n):
        pool.submit("read", hold, [None], lambda items, exc: None)
    wait_for(lambda: len(running) == n)
    return gate


def test_busy_pool_keeps_a_job_in_one_share_idle_pool_spreads_it():
    pool = IOPool(2, 2, max_batch=16, reader_help_batch=16)  # a reader freed first may take the whole share too
    fn, on_error, done, errors = collect()
    wait_for(lambda: pool._waiting[True] + pool._waiting[False] == 4)
    pool.submit("write", fn, list(range(16)), on_error)  # idle pool: spread over the 2 writers' worth of shares
    assert pool.wait_idle(5)
    assert sorted(len(s) for s in done) == [8, 8]
    done.clear()
    gate = occupy(pool, 4)  # every thread busy now
    pool.submit("write", fn, list(range(16)), on_error)
    gate.set()
    assert pool.wait_idle(5)
    pool.shutdown()
    assert done == [list(range(16))] and not errors  # one share: one lock round for the whole job


def test_many_concurrent_small_submissions_all_run():
    # Each submission wakes only as many threads as it has shares: none may be lost.
    pool = IOPool(3, 2, max_batch=4)
    fn, on_error, done, errors = collect()

    def submitter(base):
        for j in range(200):
            pool.submit("read" if j % 3 else "write", fn, [base + j], on_error)
            if j % 50 == 0:
                time.sleep(0.001)

    threads = [threading.Thread(target=submitter, args=(1000 * t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert pool.wait_idle(10)
    pool.shutdown()
    assert sorted(i for s in done for i in s) == sorted(1000 * t + j for t in range(4) for j in range(200))
    assert not errors


@pytest.fixture
def frequent_thread_switches():
    """Switch threads every microsecond, so submits interleave with workers going to sleep at every bytecode."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def pause_before_sleep(pool, fn, on_error):
    """Run ``["first"]`` on ``pool``'s only reader, then hold it between its last look at the queues and its sleep.

    Returns the event that lets it go on: submissions made before setting it land in that window (the pool lock
    is held there, so a submit must not need it).
    """
    wait_for(lambda: pool._waiting[True] == 1)
    about_to_sleep, submitted, armed = threading.Event(), threading.Event(), [True]
    take = pool._take

    def paused_take(is_reader):
        unit = take(is_reader)
        if unit is None and armed[0]:
            armed[0] = False
            about_to_sleep.set()
            submitted.wait(5)
        return unit

    pool._take = paused_take
    pool.submit("read", fn, ["first"], on_error)  # wakes the worker; after it, the worker finds the queue empty
    assert about_to_sleep.wait(5)
    return submitted


def test_a_submit_between_a_workers_last_look_and_its_sleep_still_runs():
    # A submit takes no lock when nobody waits; a worker going to sleep looks at the queues again after it counts
    # itself as waiting. Here the submit lands exactly between the worker's last look (an empty queue) and that
    # count, so it sees no waiting thread and wakes nobody: without the re-check the item stays queued for ever.
    pool = IOPool(1, 0)
    fn, on_error, done, errors = collect()
    submitted = pause_before_sleep(pool, fn, on_error)
    pool.submit("read", fn, ["second"], on_error)
    submitted.set()
    assert pool.wait_idle(5), f"{pool.pending()} item left queued with every thread asleep"
    pool.shutdown()
    assert done == [["first"], ["second"]] and not errors


def test_a_worker_whose_last_look_finds_work_still_joins_queued_units():
    # The same window as above, with two mergeable submissions landing in it: the worker's re-check finds them after
    # it counted itself as waiting. It must un-count itself before taking them, or _take, seeing a waiting thread,
    # would not join them into one share (cross-job merging lost for that take).
    pool = IOPool(1, 0, max_batch=4)
    fn, on_error, done, errors = collect()
    submitted = pause_before_sleep(pool, fn, on_error)
    pool.submit("read", fn, ["a"], on_error, merge=True)
    pool.submit("read", fn, ["b"], on_error, merge=True)
    submitted.set()
    assert pool.wait_idle(5)
    pool.shutdown()
    assert done == [["first"], ["a", "b"]] and not errors


def test_submits_racing_a_shutdown_run_or_fail_each_item_exactly_once(frequent_thread_switches):
    pool = IOPool(2, 2, max_batch=2)
    fn, on_error, done, errors = collect()

    def slow(items):
        time.sleep(0.001)  # the queues back up, so the shutdown finds work queued
        fn(items)

    def submitter(base):
        for j in range(300):
            pool.submit("read" if j % 2 else "write", slow, [base + j], on_error)

    threads = [threading.Thread(target=submitter, args=(1000 * t,)) for t in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.01)
    pool.shutdown()
    for t in threads:
        t.join(10)
    seen = [i for s in done for i in s] + [i for items, _ in errors for i in items]
    assert sorted(seen) == sorted(1000 * t + j for t in range(3) for j in range(300))  # none lost, none twice
    assert errors and all(exc is PoolShutdownError for _, exc in errors)
    assert pool.pending() == 0


def test_exceptions_become_on_error_and_workers_survive():
    pool = IOPool(1, 1)
    fn, on_error, done, errors = collect()

    def bad(items):
        raise OSError("disk")

    pool.submit("write", bad, [1, 2], on_error)
    pool.submit("read", bad, [3], on_error)
    assert pool.wait_idle(5)
    pool.submit("read", fn, [4], on_error)  # the workers are still alive
    assert pool.wait_idle(5)
    pool.shutdown()
    assert sorted(i for items, _ in errors for i in items) == [1, 2, 3]
    assert {t for _, t in errors} == {OSError}
    assert done == [[4]]


def test_shutdown_reports_every_queued_item_once():
    pool = IOPool(1, 1, max_batch=1)
    gate = threading.Event()
    fn, on_error, done, errors = collect()

    def slow(items):
        gate.wait(5)
        fn(items)

    pool.submit("write", slow, list(range(20)), on_error)
    time.sleep(0.05)
    t = threading.Thread(target=pool.shutdown)
    t.start()
    time.sleep(0.05)
    gate.set()
    t.join(5)
    seen = sorted([i for s in done for i in s] + [i for items, _ in errors for i in items])
    assert seen == list(range(20))
    assert all(exc is PoolShutdownError for _, exc in errors)
    late = []
    pool.submit("read", fn, [99], lambda items, exc: late.append((list(items), type(exc))))
    assert late == [([99], PoolShutdownError)]


def test_readers_take_reads_first_and_help_writers_one_item_at_a_time():
    pool = IOPool(1, 0, max_batch=16, reader_help_batch=1)
    order, gate, entered = [], threading.Event(), threading.Event()

    def write(items):
        entered.set()
        gate.wait(30)
        order.append(("w", list(items)))

    def read(items):
        order.append(("r", list(items)))

    pool.submit("write", write, [1, 2, 3], lambda i, e: None)
    assert entered.wait(30)  # the reader took write item 1 and waits at the gate
    pool.submit("read", read, [10], lambda i, e: None)
    gate.set()
    assert pool.wait_idle(5)
    pool.shutdown()
    assert order[0] == ("w", [1])
    assert order[1] == ("r", [10])  # the read overtook the queued writes
    assert sorted(i for kind, items in order[2:] for i in items) == [2, 3]


def test_submit_call_and_bad_sizes():
    pool = IOPool(1, 1)
    ran = threading.Event()
    pool.submit_call("read", ran.set)
    assert ran.wait(5)
    pool.shutdown()
    pool.shutdown()  # idempotent
    with pytest.raises(ValueError):
        IOPool(0, 1)


@pytest.mark.parametrize(("min_batch", "sizes"), [(1, [2] * 8), (4, [4] * 4), (16, [16]), (32, [16])])
def test_min_batch_bounds_how_thin_an_idle_pool_spreads_a_job(min_batch, sizes):
    pool = IOPool(8, 8, max_batch=16, min_batch=min_batch)
    fn, on_error, done, errors = collect()
    wait_for(lambda: pool._waiting[True] + pool._waiting[False] == 16)
    pool.submit("write", fn, list(range(16)), on_error)  # 16 idle threads, 8 of them writers
    assert pool.wait_idle(5)
    pool.shutdown()
    assert sorted(len(s) for s in done) == sizes and not errors
    assert sorted(i for share in done for i in share) == list(range(16))


def test_a_busy_pool_joins_queued_one_block_submissions_into_shares():
    """Cross-job shares: with every thread busy, queued ``merge=True`` units of one fn join, up to ``max_batch``."""
    pool = IOPool(1, 0, max_batch=4)
    fn, on_error, done, errors = collect()
    other, _, other_done, _ = collect()
    gate = occupy(pool, 1)  # the only thread is busy: nothing waits for work
    for i in range(6):
        pool.submit("read", fn, [i], on_error, merge=True)
    pool.submit("read", other, ["x"], on_error, merge=True)  # another batch function: never joined with fn's
    pool.submit("read", fn, [6], on_error, merge=True)
    pool.submit("read", fn, [7], on_error)  # not mergeable
    gate.set()
    assert pool.wait_idle(5)
    pool.shutdown()
    assert done == [[0, 1, 2, 3], [4, 5], [6], [7]] and other_done == [["x"]] and not errors


def test_a_reader_helping_with_writes_joins_up_to_its_help_batch():
    pool = IOPool(1, 0, max_batch=16, reader_help_batch=2)
    fn, on_error, done, errors = collect()
    gate = occupy(pool, 1)
    for i in range(5):
        pool.submit("write", fn, [i], on_error, merge=True)
    gate.set()
    assert pool.wait_idle(5)
    pool.shutdown()
    assert done == [[0, 1], [2, 3], [4]] and not errors

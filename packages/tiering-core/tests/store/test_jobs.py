import random
import threading

import pytest

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext
from tiering.core.store.jobs import SHUTDOWN, JobTracker
from tiering.core.store.shares import fail_tasks, record_tasks, split_batches

CTX = ReqContext("r")


def job(job_id: int, n: int, load: bool = True) -> JobMetadata:
    keys = [OffloadKey(bytes([job_id % 256, i])) for i in range(n)]
    return JobMetadata(job_id, keys, list(range(n)), load, CTX)


def test_successful_job_reported_once_after_last_block():
    tracker = JobTracker()
    state = tracker.start(job(1, 3))
    assert state.block_done(0, True) is None
    assert state.record([(2, True, ""), (1, True, "")]) == JobResult(1, True)
    assert tracker.take_finished() == [JobResult(1, True)]
    assert tracker.take_finished() == []
    assert tracker.in_flight() == 0


def test_failed_load_reports_verified_keys_in_job_order():
    tracker = JobTracker()
    meta = job(2, 4)
    state = tracker.start(meta)
    state.record([(3, True, ""), (1, False, "checksum"), (0, True, ""), (2, True, "")])
    [result] = tracker.take_finished()
    assert result.success is False
    assert list(result.successful_keys or ()) == [meta.keys[0], meta.keys[2], meta.keys[3]]
    assert tracker.stats()["load_failed_checksum"] == 1
    assert tracker.stats()["load_jobs_failed"] == 1


def test_failed_store_has_no_successful_keys():
    tracker = JobTracker()
    state = tracker.start(job(3, 2, load=False))
    state.record([(0, True, ""), (1, False, "no_space")])
    assert tracker.take_finished() == [JobResult(3, False, None)]
    assert tracker.stats()["store_failed_no_space"] == 1


def test_empty_job_finishes_at_once():
    tracker = JobTracker()
    tracker.start(job(4, 0))
    assert tracker.take_finished() == [JobResult(4, True)]


def test_duplicate_in_flight_job_id_is_refused():
    tracker = JobTracker()
    tracker.start(job(5, 1))
    with pytest.raises(ValueError, match="job 5"):
        tracker.start(job(5, 1))


def test_outcomes_after_report_and_duplicates_are_ignored():
    tracker = JobTracker()
    state = tracker.start(job(6, 2))
    state.block_done(0, True)
    assert state.block_done(0, False) is None  # recorded twice: ignored
    state.block_done(1, True)
    assert state.block_done(1, False) is None  # after the report
    assert tracker.take_finished() == [JobResult(6, True)]


def test_should_skip_blocks_after_a_failed_one_on_loads_only():
    tracker = JobTracker()
    load = tracker.start(job(7, 4))
    load.block_done(1, False, "missing")
    assert [load.should_skip(i) for i in range(4)] == [False, False, True, True]
    store = tracker.start(job(8, 4, load=False))
    store.block_done(1, False, "io_error")
    assert not any(store.should_skip(i) for i in range(4))


@pytest.mark.parametrize("cause", ["checksum", "truncated", "foreign", "corrupt"])
def test_c24_a_load_still_reads_the_rest_after_a_block_fails_verification(cause):
    tracker = JobTracker()
    load = tracker.start(job(11, 4))
    load.block_done(1, False, "missing")
    assert load.should_skip(3)  # a miss: the rest is not worth reading
    load.block_done(2, False, cause)
    assert not any(load.should_skip(i) for i in range(4))  # damage: every block of the chain is verified


def test_fail_all_reports_each_unfinished_job_once_and_ignores_late_outcomes():
    tracker = JobTracker()
    a = tracker.start(job(9, 2))
    a.block_done(0, True)
    tracker.start(job(10, 1, load=False))
    results = tracker.fail_all()
    assert sorted(r.job_id for r in results) == [9, 10]
    assert a.block_done(1, True) is None
    finished = tracker.take_finished()
    assert sorted((r.job_id, r.success) for r in finished) == [(9, False), (10, False)]
    assert [r.successful_keys for r in finished if r.job_id == 9] == [[a.meta.keys[0]]]
    assert "load_failed_" + SHUTDOWN not in tracker.stats()  # shutdown is not a failure cause


def test_report_finishes_a_whole_job_from_an_outside_result():
    tracker = JobTracker()
    meta = job(11, 3)
    tracker.start(meta, context="ctx")
    state = tracker.report(JobResult(11, False, [meta.keys[0]]))
    assert state is not None and state.context == "ctx"
    assert tracker.report(JobResult(11, True)) is None  # duplicate
    assert tracker.report(JobResult(99, True)) is None  # unknown
    assert tracker.take_finished() == [JobResult(11, False, [meta.keys[0]])]


def test_record_tasks_and_fail_tasks_group_by_job():
    tracker = JobTracker()
    a, b = tracker.start(job(12, 2)), tracker.start(job(13, 2))
    done = record_tasks([(a, 0, True, ""), (b, 0, True, ""), (a, 1, True, "")])
    assert [r.job_id for r in done] == [12]
    failed = fail_tasks([(b, 0), (b, 1)], "internal")  # block 0 already succeeded: left alone
    assert failed == [JobResult(13, False, [b.meta.keys[0]])]
    assert tracker.stats()["load_failed_internal"] == 1


def test_split_batches():
    assert split_batches(list(range(10)), 4, 16) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert split_batches(list(range(40)), 2, 16) == [list(range(16)), list(range(16, 32)), list(range(32, 40))]
    assert split_batches([], 3, 4) == []
    with pytest.raises(ValueError):
        split_batches([1], 0, 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_concurrent_workers_report_every_job_exactly_once(seed):
    rng = random.Random(seed)
    tracker = JobTracker()
    states = [tracker.start(job(i, rng.randint(1, 20), load=bool(i % 2))) for i in range(200)]
    tasks = [(s, i) for s in states for i in range(len(s.meta.keys))]
    rng.shuffle(tasks)
    fail = {id(t) for t in tasks if rng.random() < 0.05}
    chunks = [tasks[i : i + 7] for i in range(0, len(tasks), 7)]
    lock = threading.Lock()
    collected = []

    def worker() -> None:
        while True:
            with lock:
                if not chunks:
                    return
                chunk = chunks.pop()
            record_tasks((s, i, id((s, i)) not in fail, "io_error") for s, i in chunk)
            collected.extend(tracker.take_finished())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    collected.extend(tracker.take_finished())
    assert sorted(r.job_id for r in collected) == list(range(200))
    assert tracker.in_flight() == 0


def test_scheduler_calls_do_not_wait_for_the_tracker_lock():
    tracker = JobTracker()
    done = tracker.start(job(20, 1))
    done.block_done(0, True)
    with tracker._lock:  # a worker finishing a job holds it
        state = tracker.start(job(21, 2, load=False))
        assert tracker.in_flight() == 1 and tracker.get(21) is state
        assert tracker.take_finished() == [JobResult(20, True)]
        with pytest.raises(ValueError, match="job 21"):
            tracker.start(job(21, 1))


def test_causes_are_counted_per_cause_and_read_as_a_copy():
    tracker = JobTracker()
    state = tracker.start(job(22, 4))
    assert state.causes == {}
    state.record([(0, False, "checksum"), (1, False, "checksum"), (2, False, "missing")])
    causes = state.causes
    assert causes == {"checksum": 2, "missing": 1}
    causes["checksum"] = 99  # a copy: the job's book is unchanged
    state.fail_rest("io_error")
    assert state.causes == {"checksum": 2, "missing": 1, "io_error": 1}
    stats = tracker.stats()
    assert (stats["load_failed_checksum"], stats["load_failed_missing"], stats["load_failed_io_error"]) == (2, 1, 1)
    assert tracker.take_finished() == [JobResult(22, False, None)]

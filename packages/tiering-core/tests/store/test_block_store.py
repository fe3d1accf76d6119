"""The indexed block store on an in-memory medium: both reservation modes, the delete pool, the cap under failing
and slow deletes, PRESENT writes, short blocks, the capacity check. The fs, s3 and redis suites cover real media."""

import threading
import time

import pytest

from tiering.core.format import HEADER_SIZE, encode_header, verify_block
from tiering.core.primary import allocate_host_buffer
from tiering.core.schema import ConfigKey, ConfigSchema, InvalidValueError
from tiering.core.store import PRESENT, BlockNotReadyError, IndexedTier, Medium, ScanResult
from tiering.testing import TierConformanceTests
from tiering.testing.harness import (
    fill_slots,
    load_blocks,
    make_key,
    make_spec,
    store_blocks,
    store_job,
    wait_for_results,
    wait_until,
)

BB = 4096
STORED = BB + HEADER_SIZE


class DictMedium(Medium):
    """Blocks in a dict; records the most blocks it ever held; deletes can be made to fail or to be slow."""

    label = "dict store"

    def __init__(self, digest, block_bytes, delete_threads):
        self.digest = digest
        self.stored_block_bytes = block_bytes + HEADER_SIZE
        self.delete_threads = delete_threads
        self.data = {}
        self.lock = threading.Lock()
        self.peak = 0
        self.fail_deletes = False
        self.delete_delay_s = 0.0
        self.write_delay_s = 0.0
        self.remove_calls = []

    def write_many(self, keys, block_ids, slot, stopping):
        time.sleep(self.write_delay_s)  # a remote medium's PUT latency (0 unless a test sets it)
        out = []
        for key, block_id in zip(keys, block_ids, strict=True):
            payload = slot(block_id)
            with self.lock:
                if key in self.data:
                    out.append(PRESENT)
                    continue
                self.data[key] = encode_header(self.digest, key, payload) + bytes(payload)
                self.peak = max(self.peak, len(self.data))
            out.append(None)
        return out

    def read_many(self, keys, block_ids, slot):
        out = []
        for key, block_id in zip(keys, block_ids, strict=True):
            data = self.data.get(key)
            if data is None:
                out.append(FileNotFoundError(key.hex()))
            elif len(data) < self.stored_block_bytes:
                out.append(BlockNotReadyError(f"{len(data)} bytes"))
            else:
                view = memoryview(data)
                verify_block(view[:HEADER_SIZE], view[HEADER_SIZE:], self.digest, key, stored_size=len(data))
                slot(block_id)[:] = view[HEADER_SIZE:]
                out.append(None)
        return out

    def size(self, key):
        data = self.data.get(key)
        return None if data is None else len(data)

    def remove(self, key):
        time.sleep(self.delete_delay_s)
        self.remove_calls.append(key)
        if self.fail_deletes:
            return False
        with self.lock:
            self.data.pop(key, None)
        return True

    def scan(self, stopping):
        return ScanResult({k: (len(v), 0.0) for k, v in list(self.data.items())})


class DictStoreTier(IndexedTier):
    """The block store on :class:`DictMedium` (config: cap, reservation mode, delete threads)."""

    config_schema = ConfigSchema(
        "dict-store",
        [
            ConfigKey("capacity_bytes", (int,), nullable=True, minimum=1),
            ConfigKey("on_scheduler", (bool,), default=False),
            ConfigKey("delete_threads", (int,), default=0, minimum=0),
            ConfigKey("n_read_threads", (int,), default=2, minimum=1),
            ConfigKey("n_write_threads", (int,), default=2, minimum=0),
        ],
    )

    def open_medium(self, config):
        self.reserve_on_scheduler = config["on_scheduler"]
        return DictMedium(self.namespace.digest_bytes, self.block_bytes, config["delete_threads"])


MODES = [
    pytest.param({"on_scheduler": False, "delete_threads": 0}, id="io-thread-inline-deletes"),
    pytest.param({"on_scheduler": True, "delete_threads": 2}, id="scheduler-delete-pool"),
    pytest.param({"on_scheduler": False, "delete_threads": 2}, id="io-thread-delete-pool"),
]


@pytest.fixture
def open_store():
    tiers = []

    def _open(num_blocks=16, **config):
        view = allocate_host_buffer(num_blocks, BB)
        tier = DictStoreTier(make_spec(block_bytes=BB, num_blocks=num_blocks), view, "dict-store", **config)
        tiers.append(tier)
        return tier, view

    yield _open
    for tier in tiers:
        tier.shutdown()


@pytest.mark.parametrize("mode", MODES)
def test_the_cap_holds_while_deletes_fail_and_stores_resume_once_they_succeed(open_store, mode):
    tier, view = open_store(capacity_bytes=4 * STORED, **mode)
    medium = tier.blocks
    first = [make_key(i, b"cap") for i in range(4)]
    assert store_blocks(tier, view, first)
    medium.fail_deletes = True
    more = [make_key(i, b"more") for i in range(4, 8)]
    assert not store_blocks(tier, view, more, slots=range(4, 8))
    assert medium.peak == 4 and len(medium.data) == 4  # never more blocks on the medium than the cap holds
    stats = tier.stats()
    assert stats["store_failed_no_space"] == 4 and stats["blocks_stored"] == 4
    assert stats["used_bytes"] <= 4 * STORED
    medium.fail_deletes = False
    tier.rescan()  # retries the failed deletes
    wait_until(lambda: tier.stats()["pending_delete_bytes"] == 0)
    assert store_blocks(tier, view, more, slots=range(4, 8))
    assert medium.peak == 4 and set(medium.data) == set(more)


@pytest.mark.parametrize("mode", MODES)
def test_the_cap_holds_while_deletes_are_slow(open_store, mode):
    tier, view = open_store(capacity_bytes=4 * STORED, **mode)
    tier.blocks.delete_delay_s = 0.05
    for round_ in range(3):
        keys = [make_key(i, b"slow%d" % round_) for i in range(4)]
        assert store_blocks(tier, view, keys)
    assert tier.blocks.peak == 4
    assert tier.stats()["blocks_stored"] == 12


def test_a_write_another_writer_won_counts_as_already_present(open_store):
    tier, view = open_store()
    key = make_key(1, b"present")
    other, other_view = open_store()
    tier.blocks.data = other.blocks.data  # one medium, two processes' indexes
    assert store_blocks(other, other_view, [key])
    assert store_blocks(tier, view, [key])
    stats = tier.stats()
    assert stats["stores_already_present"] == 1 and stats["blocks_stored"] == 0
    assert load_blocks(tier, view, [key])


def test_a_short_block_is_a_miss_and_never_deleted(open_store):
    tier, view = open_store()
    key = make_key(2, b"short")
    tier.blocks.data[key] = b"x" * 100  # another writer is still putting it
    assert tier.lookup(key, None) is False  # the stat fallback: not a whole block
    assert not load_blocks(tier, view, [key])
    assert tier.stats()["load_failed_truncated"] == 1
    assert tier.blocks.data[key] == b"x" * 100 and tier.blocks.remove_calls == []


def test_capacity_below_one_stored_block_names_the_key(open_store):
    with pytest.raises(InvalidValueError, match=r"capacity_bytes: capacity_bytes 100 is smaller than one stored block"):
        open_store(capacity_bytes=100)


class TestSchedulerReservationConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self):
        return {"type": "DictStoreTier", "module_path": __name__, "on_scheduler": True, "delete_threads": 2}


class TestCappedDeletePoolConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self):
        cap = 64 * (self.block_bytes + HEADER_SIZE)
        return {"type": "DictStoreTier", "module_path": __name__, "capacity_bytes": cap, "delete_threads": 2}


def test_rescan_on_demand_runs_without_a_rescan_interval(open_store):
    tier, view = open_store()  # no cap, no tenants: no periodic rescans, the scan thread ended after start-up
    keys = [make_key(i, b"rescan") for i in range(2)]
    assert store_blocks(tier, view, keys)
    del tier.blocks.data[keys[0]]  # removed behind the store's back
    tier.rescan()
    wait_until(lambda: tier.stats()["scans"] == 2)
    assert tier.stats()["resident_blocks"] == 1


@pytest.mark.parametrize("keep", [True, False])
def test_reset_forgets_every_block_unless_the_medium_kept_them(open_store, keep):
    tier, view = open_store()
    keys = [make_key(i, b"reset") for i in range(3)]
    assert store_blocks(tier, view, keys)
    tier.take_events()
    if not keep:
        tier.blocks.data.clear()  # a restarted server: a new, empty data set
    tier.reset(keep)
    assert tier.index.lookup(keys[0], touch=False).name == ("RESIDENT" if keep else "ABSENT")
    wait_until(lambda: tier.stats()["scans"] == 2)
    assert tier.stats()["resident_blocks"] == (3 if keep else 0)
    assert any(type(e).__name__ == "TierCleared" for e in tier.take_events())  # re-announced for routers


def test_wait_for_scan_after_a_reset_waits_for_its_rescan(open_store):
    tier, _ = open_store()
    assert tier.wait_for_scan(10)
    gate = threading.Event()
    scan = tier.blocks.scan
    tier.blocks.scan = lambda stopping: gate.wait(10) and scan(stopping)  # the rescan waits for the gate
    tier.reset(False)
    assert not tier.wait_for_scan(0.05) and tier.stats()["scan_done"] == 0  # the rescan has not run yet
    gate.set()
    assert tier.wait_for_scan(10) and tier.stats()["scans"] == 2


@pytest.mark.parametrize("mode", MODES)
def test_c27_a_store_waits_for_room_held_by_writes_in_flight_at_most_the_room_wait(open_store, mode):
    # The room is held by a reservation that cannot progress (as one queued behind every busy I/O thread): the
    # store fails as no space after the stated room wait instead of occupying its thread for good.
    tier, view = open_store(capacity_bytes=STORED, **mode)
    held = make_key(0, b"held")
    assert tier.index.reserve(held, STORED).ready  # the whole cap, written by no one yet
    key = make_key(1, b"waits")
    fill_slots(view, [key], [0])
    job = store_job([key], [0])
    tier.submit_store(job)
    result = wait_for_results(tier, [job.job_id], 30)[job.job_id]  # raises when the job is still running
    assert not result.success and tier.stats()["store_failed_no_space"] == 1
    tier.index.commit(held, False)  # the holder ends: room again
    assert store_blocks(tier, view, [key])
    stats = tier.stats()
    assert stats["used_bytes"] == STORED and stats["reserved_bytes"] == 0 and len(tier.blocks.data) == 1


@pytest.mark.parametrize("mode", MODES)
def test_c30_stores_succeed_again_once_deletes_stop_failing_without_waiting_for_a_rescan(open_store, mode):
    tier, view = open_store(capacity_bytes=2 * STORED, **mode)
    tier.deletes.retry_pauses_s = (60.0,)  # no timed retry round comes within the test: only the stores may retry
    medium = tier.blocks
    assert store_blocks(tier, view, [make_key(i, b"old") for i in range(2)])
    medium.fail_deletes = True  # the faults: every eviction's delete fails, its bytes stay counted
    assert not store_blocks(tier, view, [make_key(2, b"during")])
    assert not store_blocks(tier, view, [make_key(3, b"during")])
    assert tier.stats()["store_failed_no_space"] >= 1
    medium.fail_deletes = False  # the faults end
    deadline = time.monotonic() + 30
    stored = 0
    while not stored:
        assert time.monotonic() < deadline, "no store succeeded after the faults ended"
        stored = store_blocks(tier, view, [make_key(4, b"after")])
    assert tier.stats()["scans"] == 1  # the start-up scan only: no rescan freed the room
    wait_until(lambda: tier.stats()["pending_delete_bytes"] == 0)
    assert medium.peak == 2 and list(medium.data) == [make_key(4, b"after")]  # the failed deletes went too
    assert tier.stats()["used_bytes"] == STORED


def test_a_replay_with_slow_writes_and_single_deletes_on_eight_threads_finishes_and_settles(open_store):
    # The shape of a replay that once froze a tier: a cap of 20 blocks, 8 I/O threads reserving on the scheduler
    # thread, writes and single deletes of 50 ms, 300 requests of two blocks from 8 clients. Every request
    # finishes; the account returns to what the medium holds.
    tier, view = open_store(num_blocks=16, capacity_bytes=20 * STORED, on_scheduler=True, delete_threads=8,
                            n_read_threads=8, n_write_threads=8)  # fmt: skip
    tier.blocks.delete_delay_s = tier.blocks.write_delay_s = 0.05
    submit, done = threading.Lock(), threading.Event()
    finished: dict[int, bool] = {}
    requests = iter(range(300))

    def collect():
        while not done.is_set():
            for result in tier.get_finished():
                finished[result.job_id] = result.success
            time.sleep(0.001)

    def client(worker):
        slots = [worker * 2, worker * 2 + 1]
        while (n := next(requests, None)) is not None:
            keys = [make_key(n * 2 + i, b"c27-replay") for i in range(2)]
            fill_slots(view, keys, slots)
            job = store_job(keys, slots)
            with submit:
                tier.submit_store(job)
            wait_until(lambda job_id=job.job_id: job_id in finished, 60.0)

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    clients = [threading.Thread(target=client, args=(w,), daemon=True) for w in range(8)]
    try:
        for t in clients:
            t.start()
        for t in clients:
            t.join(120)
        assert not any(t.is_alive() for t in clients) and len(finished) == 300
    finally:
        done.set()
    wait_until(lambda: tier.stats()["pending_delete_bytes"] == 0 and tier.stats()["in_flight_stores"] == 0)
    stats = tier.stats()
    assert stats["reserved_bytes"] == 0 and stats["used_bytes"] == len(tier.blocks.data) * STORED
    assert tier.blocks.peak <= 20 and stats["blocks_stored"] > 20

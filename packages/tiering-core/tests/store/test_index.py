import random
import threading
import time

import pytest

from tiering.core.base import OffloadKey
from tiering.core.store.index import Admit, CapacityIndex, KeyState, Victim


def k(i: int) -> OffloadKey:
    return OffloadKey(i.to_bytes(4, "big"))


def store(index: CapacityIndex, key: OffloadKey, size: int = 10) -> tuple[Victim, ...]:
    res = index.reserve(key, size)
    assert res.admit is Admit.RESERVED
    index.commit(key, True)
    return res.victims


def test_reserve_commit_and_states():
    index = CapacityIndex(100)
    res = index.reserve(k(1), 10)
    assert res.admit is Admit.RESERVED and res.victims == ()
    assert index.lookup(k(1)) is KeyState.WRITING
    assert index.used_bytes == 10 and index.resident_bytes == 0
    index.commit(k(1), True)
    assert index.lookup(k(1)) is KeyState.RESIDENT
    assert index.reserve(k(1), 10).admit is Admit.PRESENT
    assert index.reserve(k(2), 10).admit is Admit.RESERVED
    index.commit(k(2), False)
    assert index.lookup(k(2)) is KeyState.ABSENT
    assert index.stats()["used_bytes"] == 10


def test_joined_reservation_counts_bytes_once_and_resident_if_any_writer_succeeded():
    index = CapacityIndex(100)
    index.reserve(k(1), 10)
    assert index.reserve(k(1), 10).admit is Admit.RESERVED
    assert index.used_bytes == 10
    index.commit(k(1), True)
    assert index.lookup(k(1)) is KeyState.WRITING
    index.commit(k(1), False)
    assert index.lookup(k(1)) is KeyState.RESIDENT and index.used_bytes == 10


def test_eviction_is_lru_and_keeps_bytes_until_delete_confirmed():
    index = CapacityIndex(30)
    for i in range(3):
        store(index, k(i))
    index.touch([k(0)])
    res = index.reserve(k(3), 10)
    assert res.admit is Admit.RESERVED
    assert res.victims == (Victim(k(1), 10),)
    assert index.lookup(k(1)) is KeyState.DELETING
    assert index.used_bytes == 40  # victim's bytes still exist until its delete succeeds
    index.deleted(k(1), True)
    assert index.used_bytes == 30
    assert index.lookup(k(1)) is KeyState.ABSENT
    assert index.stats()["evictions"] == 1


def test_reserve_many_is_reserve_per_key_in_one_round():
    def setup() -> CapacityIndex:
        index = CapacityIndex(40)
        for i in range(3):
            store(index, k(i))  # k(0) is the least recently used
        index.reserve(k(9), 10)  # being written
        return index

    keys = [k(1), k(9), k(3), k(4), k(3)]
    one_by_one = setup()
    expected = [one_by_one.reserve(key, 10) for key in keys]
    batched = setup()
    got = batched.reserve_many(keys, 10)
    assert got == expected
    assert [r.admit for r in got] == [Admit.PRESENT, Admit.RESERVED, Admit.RESERVED, Admit.RESERVED, Admit.RESERVED]
    assert [v.key for r in got for v in r.victims] == [k(0), k(2)]  # LRU first; k(1) was just touched
    assert batched.stats() == one_by_one.stats()
    with pytest.raises(ValueError):
        batched.reserve_many([k(5)], -1)


def test_no_space_when_everything_is_in_flight():
    index = CapacityIndex(20)
    index.reserve(k(1), 10)
    index.reserve(k(2), 10)
    res = index.reserve(k(3), 10)
    assert res.admit is Admit.NO_SPACE and res.can_wait
    index.commit(k(1), False)
    assert index.reserve(k(3), 10).admit is Admit.RESERVED


def test_store_of_a_key_being_deleted_waits():
    index = CapacityIndex(10)
    store(index, k(1))
    (victim,) = index.reserve(k(2), 10).victims
    assert index.reserve(k(1), 10).admit is Admit.DELETING
    index.deleted(victim.key, True)
    index.commit(k(2), False)
    assert index.reserve(k(1), 10).admit is Admit.RESERVED


def test_C13_load_racing_an_eviction_cannot_reinsert_the_key():
    """Case C13: a load reads a block while eviction deletes it; the index must not take the key back."""
    index = CapacityIndex(10)
    store(index, k(1))
    ticket = index.ticket()  # the load starts reading k(1)
    (victim,) = index.reserve(k(2), 10).victims  # eviction picks k(1) and deletes its file
    index.deleted(victim.key, True)
    index.commit(k(2), True)
    assert not index.adopt(k(1), 10, ticket)  # the load finished: it must not re-index the deleted block
    index.release_ticket(ticket)
    assert index.lookup(k(1)) is KeyState.ABSENT
    assert index.used_bytes == 10 and index.stats()["resident_blocks"] == 1


def test_C13_adoption_by_a_lookup_fallback_agrees_with_eviction():
    index = CapacityIndex(10)
    store(index, k(1))
    with index.reading() as ticket:  # a stat/HEAD probe of k(1) starts
        victims = index.evict_to_cap() + index.reserve(k(2), 10).victims
        index.deleted_many((v.key, True) for v in victims)
        assert not index.adopt(k(1), 10, ticket)
    # a probe that starts after the delete sees the truth again and may adopt a re-stored block
    index.commit(k(2), False)
    with index.reading() as ticket:
        assert index.adopt(k(1), 10, ticket)


def test_C13_a_read_begun_between_an_eviction_and_its_delete_cannot_adopt_the_key():
    """The bytes leave the medium when the delete ends, not when the key is evicted: a read in between saw them."""
    index = CapacityIndex(10)
    store(index, k(1))
    (victim,) = index.reserve(k(2), 10).victims  # k(1) evicted; its file is still there
    with index.reading() as ticket:  # a probe starts and finds k(1)'s file
        index.deleted(victim.key, True)  # ... which the eviction's delete then removes
        assert not index.adopt(k(1), 10, ticket)
    assert index.lookup(k(1)) is KeyState.ABSENT
    with index.reading() as ticket:  # a probe begun after the delete may adopt a block stored again
        assert index.adopt(k(1), 10, ticket)


def test_C16_a_read_begun_before_a_rescan_settles_a_failed_delete_cannot_adopt_the_key():
    index = CapacityIndex(10)
    store(index, k(1))
    (victim,) = index.reserve(k(2), 10).victims
    index.deleted(victim.key, False)
    index.commit(k(2), False)
    with index.reading() as ticket:  # a probe starts while k(1)'s undeleted file is still there
        with index.reading() as scan:
            assert index.reconcile({}, scan).deletes_confirmed == (k(1),)  # ... and the rescan finds it gone
        assert not index.adopt(k(1), 10, ticket)


def test_adopt_refused_while_writing_or_deleting():
    index = CapacityIndex(None)
    index.reserve(k(1), 10)
    t = index.ticket()
    assert not index.adopt(k(1), 10, t)
    index.commit(k(1), True)
    index.remove(k(1))
    assert not index.adopt(k(1), 10, index.ticket())


def test_C16_failed_delete_keeps_bytes_counted_and_is_retried():
    """Case C16: an eviction's delete fails; the bytes stay counted and the cap holds."""
    index = CapacityIndex(20)
    store(index, k(1))
    store(index, k(2))
    (victim,) = index.reserve(k(3), 10).victims
    index.deleted(victim.key, False)  # unlink / DeleteObjects failed
    stats = index.stats()
    assert stats["used_bytes"] == 30 and stats["failed_deletes"] == 1 and stats["pending_delete_bytes"] == 10
    assert index.lookup(k(1)) is KeyState.DELETING  # never answered True again
    index.commit(k(3), True)
    # the cap is still enforced against the bytes that really exist
    res = index.reserve(k(4), 10)
    assert [v.key for v in res.victims] == [k(2), k(3)] and res.admit is Admit.RESERVED
    assert index.retry_deletes() == (Victim(k(1), 10),)
    index.deleted_many([(k(1), True), (k(2), True), (k(3), True)])
    assert index.used_bytes == 10


def test_C16_reconcile_settles_failed_deletes_within_one_rescan():
    index = CapacityIndex(20)
    store(index, k(1))
    store(index, k(2))
    (victim,) = index.reserve(k(3), 10).victims
    index.deleted(victim.key, False)
    index.commit(k(3), True)
    with index.reading() as ticket:
        report = index.reconcile({k(2): 10, k(3): 10}, ticket)  # the bytes of k(1) turned out gone
    assert report.deletes_confirmed == (k(1),)
    assert index.used_bytes == 20 and index.stats()["pending_delete_bytes"] == 0


def test_reconcile_adds_found_drops_vanished_keeps_in_flight_and_recent_changes():
    index = CapacityIndex(None)
    store(index, k(1))
    store(index, k(2))
    index.reserve(k(9), 10)  # a write in flight, not yet listed
    ticket = index.ticket()
    store(index, k(5))  # stored after the scan began: the listing may have missed it
    report = index.reconcile({k(2): 10, k(3): 10, k(4): 10}, ticket)
    index.release_ticket(ticket)
    assert set(report.added) == {k(3), k(4)}
    assert report.vanished == (k(1),)
    assert index.keys() == [k(3), k(4), k(2), k(5)]  # found blocks are older than anything used since
    assert index.lookup(k(9)) is KeyState.WRITING
    assert index.used_bytes == 50


def test_reconcile_does_not_resurrect_a_key_removed_during_the_scan():
    index = CapacityIndex(None)
    store(index, k(1))
    ticket = index.ticket()
    index.remove(k(1), delete=False)
    index.reconcile({k(1): 10}, ticket)
    assert index.lookup(k(1)) is KeyState.ABSENT


def test_removal_records_are_pruned_when_no_ticket_is_out():
    index = CapacityIndex(None)
    t = index.ticket()
    for i in range(100):
        store(index, k(i))
        index.remove(k(i), delete=False)
    index.release_ticket(t)
    assert len(index._epochs) == 0


def test_rejects_negative_sizes():
    with pytest.raises(ValueError):
        CapacityIndex(-1)
    with pytest.raises(ValueError):
        CapacityIndex(10).reserve(k(1), -1)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_concurrent_stores_loads_evictions_keep_usage_true(seed):
    """Writers, readers and a deleter hammer the index; at the end usage equals the bytes that 'exist'."""
    cap, size = 200, 10
    index = CapacityIndex(cap)
    files: set[OffloadKey] = set()  # the "disk"
    files_lock = threading.Lock()
    fail_rng = random.Random(seed)

    def delete(victims):
        outcomes = []
        for v in victims:
            ok = fail_rng.random() > 0.2
            if ok:
                with files_lock:
                    files.discard(v.key)
            outcomes.append((v.key, ok))
        index.deleted_many(outcomes)

    def writer(wid: int) -> None:
        rng = random.Random(seed * 100 + wid)
        for _ in range(300):
            key = k(rng.randrange(60))
            res = index.reserve(key, size)
            delete(res.victims)
            if res.admit is not Admit.RESERVED:
                continue
            ok = rng.random() > 0.1
            if ok:
                with files_lock:
                    files.add(key)
            index.commit(key, ok)
            if rng.random() < 0.1:
                delete(index.retry_deletes())

    def reader(rid: int) -> None:
        rng = random.Random(seed * 1000 + rid)
        for _ in range(600):
            key = k(rng.randrange(60))
            with index.reading() as ticket:
                with files_lock:
                    present = key in files
                if present:
                    index.adopt(key, size, ticket)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    threads += [threading.Thread(target=reader, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    delete(index.retry_deletes())
    while index.stats()["pending_delete_bytes"]:
        delete(index.retry_deletes())
    # every resident key exists on "disk" (never a True for a block that is gone) ...
    resident = set(index.keys())
    assert resident <= files
    # ... and usage counts exactly the resident blocks once nothing is in flight
    stats = index.stats()
    assert stats["used_bytes"] == stats["resident_bytes"] == len(resident) * size <= cap


def test_touches_without_the_lock_are_applied_in_order_before_an_eviction():
    index = CapacityIndex(40)
    for i in range(4):
        store(index, k(i))
    with index._lock:  # an I/O thread holds the lock: touch must not wait for it
        index.touch([k(2), k(0)])
        index.touch([k(1), k(5)])  # k(5) is not resident: ignored
    assert index.keys() == [k(3), k(2), k(0), k(1)]
    index.touch([k(3)])
    res = index.reserve_many([k(6), k(7)], 10)  # evicts the two least recently used, after the touch
    assert [v.key for r in res for v in r.victims] == [k(2), k(0)]


def test_touch_queue_is_bounded():
    index = CapacityIndex(None)
    store(index, k(1))
    store(index, k(2))
    index._touched.limit = 3
    index.touch([k(1), k(1), k(1)])
    assert index._touched  # at the limit: still queued
    index.touch([k(1)])  # past it: applied by the call itself
    assert not index._touched
    assert list(index._resident) == [k(2), k(1)]


def test_reservations_without_victims_are_shared_and_immutable():
    index = CapacityIndex(None)
    a, b = index.reserve_many([k(1), k(2)], 10)
    assert a is b and a.admit is Admit.RESERVED and a.victims == ()
    index.commit_many([(k(1), True), (k(2), True)])
    p, q = index.reserve_many([k(1), k(2)], 10)
    assert p is q and p.admit is Admit.PRESENT
    with pytest.raises(AttributeError):
        p.admit = Admit.RESERVED  # type: ignore[misc]


def test_reserve_many_under_a_cap_evicts_only_for_the_keys_that_do_not_fit():
    index = CapacityIndex(40)
    for i in range(3):
        store(index, k(i))
    assert index.reserve(k(9), 10).victims == ()  # 40 bytes with it: fits, nothing evicted
    index.commit(k(9), True)
    gone = index.remove(k(2))  # k(2) now being deleted
    assert gone is not None
    res = index.reserve_many([k(9), k(2), k(5), k(5), k(6)], 10)
    assert [r.admit for r in res] == [Admit.PRESENT, Admit.DELETING, Admit.RESERVED, Admit.RESERVED, Admit.RESERVED]
    assert [r.victims for r in res[:4]] == [(), (), (), ()]  # k(5) took k(2)'s room; its second writer joins
    assert res[4].victims == (Victim(k(0), 10),)  # k(6) did not fit: the LRU block is evicted for it
    assert index.used_bytes == 10 * 6  # 1, 9 resident; 0, 2 being deleted; 5, 6 reserved


def test_C22_lower_cap_evicts_down_to_it_and_never_raises_it():
    index = CapacityIndex(100)
    for i in range(5):
        store(index, k(i))
    victims = index.lower_cap(30)
    assert [v.key for v in victims] == [k(0), k(1)]  # least recently used first, down to the new cap
    index.deleted_many((v.key, True) for v in victims)
    assert (index.capacity_bytes, index.used_bytes, index.stats()["capacity_bytes"]) == (30, 30, 30)
    assert index.lower_cap(80) == () and index.capacity_bytes == 30  # never raised
    unbounded = CapacityIndex(None)
    store(unbounded, k(1))
    assert unbounded.lower_cap(50) == () and unbounded.capacity_bytes == 50  # bounded from now on
    with pytest.raises(ValueError, match="limit_bytes"):
        index.lower_cap(-1)


def test_c21_a_reservation_on_victims_room_is_written_only_once_they_are_deleted():
    """Case C21: a victim's bytes count against the cap until its delete succeeded; the store waits for them."""
    index = CapacityIndex(20)
    store(index, k(1))
    store(index, k(2))
    res = index.reserve(k(3), 10)
    assert (res.admit, res.victims, res.ready) == (Admit.RESERVED, (Victim(k(1), 10),), False)
    assert index.wait_for_room([k(3)], 0.0) == [False]  # k1 is still on the medium
    assert index.stats()["room_wait_bytes"] == 10
    # a second store takes victims of its own (deletes of many stores run in parallel), and waits too
    res4 = index.reserve(k(4), 10)
    assert (res4.victims, res4.ready) == ((Victim(k(2), 10),), False)
    index.deleted(k(1), True)
    assert index.wait_for_room([k(3), k(4)], 0.0) == [True, False]  # k3 fits now; k4 still waits for k2
    index.deleted(k(2), False)  # failed: k2 is still there, so k4's room never came
    assert index.wait_for_room([k(4)], 0.05) == [False]
    index.commit(k(4), False)  # given up: the store fails as no space
    index.commit(k(3), True)
    stats = index.stats()
    assert (stats["used_bytes"], stats["room_wait_bytes"], stats["pending_delete_bytes"]) == (20, 0, 10)


def test_c21_a_waiting_store_wakes_when_the_delete_ends():
    index = CapacityIndex(10)
    store(index, k(1))
    res = index.reserve(k(2), 10)
    assert not res.ready
    timer = threading.Timer(0.05, index.deleted, (k(1), True))
    timer.start()
    assert index.wait_for_room([k(2)], 5.0) == [True]
    timer.join()
    assert index.reserve(k(2), 10).ready is True  # a writer joining an admitted write may write at once
    with pytest.raises(KeyError):
        index.wait_for_room([k(9)], 0.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_c21_the_medium_never_holds_more_than_the_cap_while_deletes_are_slow_and_failing(seed):
    """8 writers, one slow deleter that fails a third of its deletes: the "disk" never holds more than the cap."""
    cap, size = 50, 10
    index = CapacityIndex(cap)
    files: set[OffloadKey] = set()
    peak, pending_peak = [0], [0]
    lock = threading.Lock()
    queue: list[Victim] = []
    done = threading.Event()

    def deleter() -> None:
        rng = random.Random(seed)
        while not done.is_set() or queue:
            with lock:
                batch, queue[:] = list(queue), []
            time.sleep(0.002)
            outcomes = []
            for v in batch:
                ok = rng.random() > 0.3
                if ok:
                    with lock:
                        files.discard(v.key)
                outcomes.append((v.key, ok))
            index.deleted_many(outcomes)
            retried = index.retry_deletes()
            with lock:
                queue.extend(retried)

    def writer(wid: int) -> None:
        rng = random.Random(seed * 100 + wid)
        for _ in range(100):
            key = k(rng.randrange(200))
            res = index.reserve(key, size)
            with lock:
                queue.extend(res.victims)
            pending_peak[0] = max(pending_peak[0], index.stats()["pending_delete_bytes"])
            if res.admit is not Admit.RESERVED:
                continue
            if not index.wait_for_room([key], 1.0)[0]:
                index.commit(key, False)
                continue
            with lock:
                files.add(key)
                peak[0] = max(peak[0], len(files) * size)
            index.commit(key, True)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    cleaner = threading.Thread(target=deleter)
    cleaner.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    cleaner.join()
    assert 0 < peak[0] <= cap
    assert 0 < pending_peak[0] <= cap  # the deletes in flight are bounded by the cap
    assert set(index.keys()) <= files

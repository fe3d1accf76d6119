import threading

import pytest

from tiering.core.base import OffloadKey
from tiering.core.events import BlockRemoved, BlockStored, HeldKeys, KVEventLog, TierCleared
from tiering.core.store.index import CapacityIndex

K = [OffloadKey(bytes([i])) for i in range(8)]


def test_events_in_order_and_taken_once():
    log = KVEventLog("storage", tier="fs")
    log.record_stored(K[:2])
    log.record_removed([K[0]], cause="corrupt")
    log.record_stored([])
    assert log.take_events() == [
        TierCleared("storage", "startup", "fs"),  # a log begins with the tier's start-up clear
        BlockStored((K[0], K[1]), "storage", "store", "fs"),
        BlockRemoved((K[0],), "storage", "corrupt", "fs"),
    ]
    assert log.take_events() == []


def test_bounded_drops_oldest_and_counts():
    log = KVEventLog("memory", max_events=2)
    log.take_events()
    for k in K[:5]:
        log.record_stored([k])
    assert [e.keys for e in log.take_events()] == [(K[3],), (K[4],)]
    assert log.dropped == 3
    with pytest.raises(ValueError):
        KVEventLog("x", max_events=0)


def test_concurrent_recording_loses_nothing():
    log = KVEventLog("storage", max_events=100_000)
    log.take_events()
    taken = []

    def record(i: int) -> None:
        for j in range(500):
            log.record_stored([OffloadKey(bytes([i, j % 256, j // 256]))])

    threads = [threading.Thread(target=record, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        taken.extend(log.take_events())
    taken.extend(log.take_events())
    assert len(taken) == 4000 and len({e.keys for e in taken}) == 4000


def test_bad_locality_is_refused_by_name():
    with pytest.raises(ValueError, match="'nearby'"):
        KVEventLog("storage", locality="nearby")


def test_held_keys_turns_a_clear_into_removals_of_what_was_announced():
    held = HeldKeys()
    first = held.resolve([TierCleared("memory", "startup", "redis"), BlockStored(tuple(K[:3]), "memory", tier="redis")])
    assert first == [BlockStored(tuple(K[:3]), "memory", tier="redis")]  # nothing announced before: no removal
    out = held.resolve(
        [
            BlockRemoved((K[1],), "memory", "eviction", "redis"),
            TierCleared("memory", "reconnect", "redis", "remote"),
            BlockStored((K[2], K[4]), "memory", "announce", "redis", "remote"),
        ]
    )
    assert out == [
        BlockRemoved((K[1],), "memory", "eviction", "redis"),
        BlockRemoved((K[0], K[2]), "memory", "reconnect", "redis", "remote"),
        BlockStored((K[2], K[4]), "memory", "announce", "redis", "remote"),
    ]
    assert len(held) == 2


def _replay(events, held=None):
    """What a consumer applying ``events`` in order holds."""
    held = set() if held is None else held
    for event in events:
        if isinstance(event, TierCleared):
            held.clear()
        elif isinstance(event, BlockStored):
            held.update(event.keys)
        else:
            held.difference_update(event.keys)
    return held


def test_index_records_every_change_of_its_resident_set_with_its_cause():
    index = CapacityIndex(3 * 10)
    log = KVEventLog("storage", tier="fs")
    index.attach_events(log)
    for key in K[:4]:
        res = index.reserve(key, 10)
        index.commit(key, True)
        index.deleted_many((v.key, True) for v in res.victims)
    index.remove(K[2], delete=False, cause="corrupt")
    with index.reading() as ticket:
        index.adopt(K[5], 10, ticket)
    with index.reading() as ticket:
        index.reconcile({K[5]: 10, K[6]: 10}, ticket)  # K[1], K[3] gone behind the tier's back; K[6] new
    events = log.take_events()
    causes = [(type(e).__name__, e.cause, e.keys) for e in events]
    assert causes == [
        ("TierCleared", "startup", ()),
        ("BlockStored", "store", (K[0],)),
        ("BlockStored", "store", (K[1],)),
        ("BlockStored", "store", (K[2],)),
        ("BlockRemoved", "eviction", (K[0],)),
        ("BlockStored", "store", (K[3],)),
        ("BlockRemoved", "corrupt", (K[2],)),
        ("BlockStored", "found", (K[5],)),
        ("BlockStored", "found", (K[6],)),
        ("BlockRemoved", "vanished", (K[1], K[3])),
    ]
    assert _replay(events) == set(index.keys()) == {K[5], K[6]}


def test_index_announce_and_overflow_bring_a_consumer_back_to_the_truth():
    index = CapacityIndex(None)
    for key in K[:2]:  # resident before the log is attached: announced on attach
        index.reserve(key, 1)
        index.commit(key, True)
    log = KVEventLog("memory", max_events=4, tier="redis", locality="remote")
    index.attach_events(log)
    consumer = _replay(log.take_events())
    assert consumer == {K[0], K[1]}
    for key in K[2:8]:  # six events for a log of four: two are dropped
        index.reserve(key, 1)
        index.commit(key, True)
    assert log.dropped == 2
    events = log.take_events()
    assert isinstance(events[0], TierCleared) and events[0].cause == "overflow"
    assert _replay(events, consumer) == set(index.keys()) == set(K[:8])
    index.announce("reconnect")
    events = log.take_events()
    assert [type(e).__name__ for e in events] == ["TierCleared", "BlockStored"]
    assert events[0].cause == "reconnect" and events[1].cause == "announce" and set(events[1].keys) == set(K[:8])

import threading

import pytest

from tiering.core.base import OffloadKey
from tiering.core.toolkit.events import BlockRemoved, BlockStored, KVEventLog

K = [OffloadKey(bytes([i])) for i in range(8)]


def test_events_in_order_and_taken_once():
    log = KVEventLog("storage")
    log.record_stored(K[:2])
    log.record_removed([K[0]], reason="bad")
    log.record_stored([])
    assert log.take_events() == [BlockStored((K[0], K[1]), "storage"), BlockRemoved((K[0],), "storage", "bad")]
    assert log.take_events() == []


def test_bounded_drops_oldest_and_counts():
    log = KVEventLog("memory", max_events=2)
    for k in K[:5]:
        log.record_stored([k])
    assert [e.keys for e in log.take_events()] == [(K[3],), (K[4],)]
    assert log.dropped == 3
    with pytest.raises(ValueError):
        KVEventLog("x", max_events=0)


def test_concurrent_recording_loses_nothing():
    log = KVEventLog("storage", max_events=100_000)
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

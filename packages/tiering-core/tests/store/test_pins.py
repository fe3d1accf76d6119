"""The pin book and the index's keep hook: pinned blocks are never evicted before their pin ends."""

import logging

import pytest

from tiering.core.base import OffloadKey
from tiering.core.policies.pin_records import PinBook, PinRefusedError
from tiering.core.store.index import CapacityIndex


def k(i: int) -> OffloadKey:
    return OffloadKey(i.to_bytes(4, "big"))


class MemoryPins:
    """A pin medium in a dict (pure unit test: the real media are tested with their tiers)."""

    def __init__(self) -> None:
        self.records: set[tuple[OffloadKey, float]] = set()
        self.fail = False

    def list_pins(self):
        if self.fail:
            raise OSError("medium down")
        return sorted(self.records)

    def write_pins(self, keys, expiry):
        if self.fail:
            raise OSError("medium down")
        self.records.update((key, expiry) for key in keys)

    def remove_pins(self, records):
        self.records.difference_update(records)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def book(max_blocks=4, medium=None, clock=None):
    return PinBook(medium or MemoryPins(), max_blocks * 10, 10, "test tier", clock=clock or Clock())


def fill(index: CapacityIndex, keys) -> list[OffloadKey]:
    """Reserve and commit each key (size 10); returns the victims' keys, reported deleted."""
    victims = []
    for key in keys:
        res = index.reserve(key, 10)
        for victim in res.victims:
            index.deleted(victim.key, True)
            victims.append(victim.key)
        index.commit(key, True)
    return victims


def test_index_never_evicts_a_pinned_block_and_evicts_the_rest_in_lru_order():
    pins = book()
    index = CapacityIndex(50)
    index.keep = pins.protects
    fill(index, [k(i) for i in range(5)])
    pins.pin([k(0), k(2)], 60)
    evicted = fill(index, [k(i) for i in range(100, 130)])
    assert evicted[:3] == [k(1), k(3), k(4)]  # LRU order, pinned skipped
    assert k(0) in index and k(2) in index
    assert index.used_bytes == 50


def test_index_with_every_block_pinned_refuses_the_store_without_evicting():
    pins = book(max_blocks=5)
    index = CapacityIndex(50)
    index.keep = pins.protects
    fill(index, [k(i) for i in range(5)])
    pins.pin([k(i) for i in range(5)], 60)
    res = index.reserve(k(99), 10)
    assert res.admit.value == "no_space" and res.victims == ()
    assert len(index) == 5


def test_pin_expires_by_itself_and_the_expired_record_is_removed():
    clock, medium = Clock(), MemoryPins()
    pins = book(medium=medium, clock=clock)
    pins.pin([k(1)], 30)
    assert pins.protects(k(1))
    clock.now += 30
    assert not pins.protects(k(1))  # no I/O needed for the pin to end
    pins.refresh()
    assert medium.records == set()


def test_a_second_book_on_the_same_medium_sees_the_pins_a_restart_keeps_them():
    clock, medium = Clock(), MemoryPins()
    book(medium=medium, clock=clock).pin([k(1), k(2)], 60)
    other = book(medium=medium, clock=clock)
    assert not other.protects(k(1))
    other.refresh()
    assert other.protects(k(1)) and other.protects(k(2))


def test_bound_refuses_a_pin_as_a_whole_and_counts_it():
    pins = book(max_blocks=3)
    pins.pin([k(1), k(2)], 60)
    with pytest.raises(PinRefusedError, match=r"pinning 2 more blocks would pin 40 bytes, over max_pinned_bytes 30"):
        pins.pin([k(2), k(3), k(3), k(4)], 60)
    assert not pins.protects(k(3)) and not pins.protects(k(4))
    assert pins.stats(lambda key: True)["pins_refused"] == 3
    pins.pin([k(2), k(3)], 60)  # k(2) is pinned already: one more block fits
    assert pins.stats(lambda key: key != k(3)) == {
        "pinned_blocks": 2, "pinned_bytes": 20, "pins_pending": 1, "pins_refused": 3, "max_pinned_bytes": 30,
    }  # fmt: skip


def test_renewal_extends_never_shortens_and_replaces_the_old_record():
    clock, medium = Clock(), MemoryPins()
    pins = book(medium=medium, clock=clock)
    pins.pin([k(1)], 60)
    pins.pin([k(1)], 10)
    assert pins.pinned() == {k(1): clock.now + 60}
    pins.pin([k(1)], 120)
    assert medium.records == {(k(1), clock.now + 120)}


def test_unpin_ends_the_pin_for_every_book():
    medium = MemoryPins()
    clock = Clock()
    pins = book(medium=medium, clock=clock)
    pins.pin([k(1), k(2)], 60)
    assert pins.unpin([k(1), k(5)]) == 1
    assert not pins.protects(k(1)) and pins.protects(k(2))
    assert medium.records == {(k(2), clock.now + 60)}


def test_off_or_unsupported_refuses_and_try_pin_answers_false(caplog):
    off = PinBook(MemoryPins(), 0, 10, "off tier")
    with pytest.raises(PinRefusedError, match="pinning is off"):
        off.pin([k(1)], 60)
    with caplog.at_level(logging.WARNING):
        assert PinBook(None, 100, 10, "dict tier").try_pin([k(1)], 60) is False
    assert "this tier cannot pin" in caplog.text
    with pytest.raises(ValueError, match="ttl_s must be > 0"):
        book().pin([k(1)], 0)


def test_a_medium_failure_refuses_the_pin_and_keeps_the_last_read():
    medium = MemoryPins()
    pins = book(medium=medium)
    pins.pin([k(1)], 60)
    medium.fail = True
    assert pins.try_pin([k(2)], 60) is False
    pins.refresh()  # logged, never raised
    assert pins.protects(k(1)) and not pins.protects(k(2))
    assert pins.stats(lambda key: True)["pins_refused"] == 1


def test_a_write_failing_half_way_takes_back_the_records_written():
    class HalfWay(MemoryPins):
        def write_pins(self, keys, expiry):
            self.records.add((keys[0], expiry))
            raise OSError("disk full")

    medium = HalfWay()
    pins = book(medium=medium)
    assert pins.try_pin([k(1), k(2)], 60) is False
    assert medium.records == set() and not pins.protects(k(1))

"""The Medium defaults a simple medium relies on: block I/O one block at a time (write_one / read_one)."""

import pytest

from tiering.core.store import PRESENT, Medium, NotStartedError, ScanResult
from tiering.testing.harness import make_key


class OneAtATime(Medium):
    """Blocks in a dict through write_one / read_one only; ``bad`` keys raise, ``taken`` keys answer PRESENT."""

    stored_block_bytes = 4

    def __init__(self, bad=(), taken=()):
        self.data, self.bad, self.taken = {}, set(bad), set(taken)

    def write_one(self, key, payload):
        if key in self.bad:
            raise OSError(28, "No space left on device")
        if key in self.taken:
            return PRESENT
        self.data[key] = bytes(payload)
        return None

    def read_one(self, key, target):
        if key in self.bad:
            raise ValueError("bad bytes")
        target[:] = self.data[key]

    def size(self, key):
        return 4 if key in self.data else None

    def remove(self, key):
        return self.data.pop(key, None) is not None

    def scan(self, stopping):
        return ScanResult({k: (4, 0.0) for k in self.data})


KEYS = [make_key(i, b"one") for i in range(4)]
SLOTS = [memoryview(bytearray(bytes([i]) * 4)) for i in range(4)]


def test_write_many_reports_each_block_past_a_failure():
    medium = OneAtATime(bad=[KEYS[1]], taken=[KEYS[2]])
    out = medium.write_many(KEYS, range(4), SLOTS.__getitem__, lambda: False)
    assert out[0] is None and out[2] is PRESENT and out[3] is None
    assert isinstance(out[1], OSError) and out[1].errno == 28
    assert medium.data == {KEYS[0]: b"\0" * 4, KEYS[3]: b"\3" * 4}


def test_write_many_starts_no_block_once_the_store_stops():
    medium = OneAtATime()
    calls = iter([False, True, True, True])
    out = medium.write_many(KEYS, range(4), SLOTS.__getitem__, lambda: next(calls))
    assert out[0] is None and all(isinstance(o, NotStartedError) for o in out[1:])
    assert list(medium.data) == [KEYS[0]]


def test_read_many_attempts_every_block_and_fills_only_good_ones():
    medium = OneAtATime()
    medium.data = {KEYS[0]: b"a" * 4, KEYS[2]: b"c" * 4}
    medium.bad = {KEYS[2]}
    targets = [memoryview(bytearray(4)) for _ in range(4)]
    out = medium.read_many(KEYS[:3], range(3), targets.__getitem__)
    assert out[0] is None and bytes(targets[0]) == b"aaaa"
    assert isinstance(out[1], KeyError) and isinstance(out[2], ValueError)


@pytest.mark.parametrize("missing", ["write", "read"])
def test_a_medium_without_block_io_is_refused_when_created(missing):
    drop = {"write_one": Medium.write_one} if missing == "write" else {"read_one": Medium.read_one}
    incomplete = type("Incomplete", (OneAtATime,), drop)
    with pytest.raises(TypeError, match=rf"Incomplete must implement Medium.{missing}_many or Medium.{missing}_one"):
        incomplete()

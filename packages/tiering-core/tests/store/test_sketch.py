"""The TinyLFU frequency sketch: counts, saturation, decay, false positives and its memory bound."""

import pytest

from tiering.core.policies.sketch import MAX_COUNT, MIN_SKETCH_BYTES, FrequencySketch


def key(i: int) -> bytes:
    return i.to_bytes(8, "little")


def test_counts_follow_sightings_and_unseen_keys_read_zero():
    sketch = FrequencySketch(64 * 1024)
    assert sketch.estimate(key(1)) == 0
    for n in range(1, 6):
        assert sketch.record(key(1)) == n
        assert sketch.estimate(key(1)) == n
    assert sketch.record(key(2)) == 1  # the doorkeeper takes the first sighting
    assert sketch.estimate(key(2)) == 1
    assert sketch.estimate(key(3)) == 0


def test_counts_saturate_at_four_bits_plus_the_doorkeeper():
    sketch = FrequencySketch(4096)
    for _ in range(40):
        sketch.record(key(7))
    assert sketch.estimate(key(7)) == MAX_COUNT + 1 == 16


def test_reset_halves_counts_and_forgets_keys_seen_once():
    sketch = FrequencySketch(4096, sample_size=10)
    for _ in range(7):
        sketch.record(key(1))  # doorkeeper + 6 in the counters
    sketch.record(key(2))
    assert (sketch.estimate(key(1)), sketch.estimate(key(2)), sketch.resets) == (7, 1, 0)
    sketch.record(key(3))
    sketch.record(key(3))  # the 10th sighting: the sketch resets
    assert sketch.resets == 1
    assert sketch.estimate(key(1)) == 3  # 6 // 2, the doorkeeper cleared
    assert sketch.estimate(key(2)) == 0  # seen once: forgotten
    assert sketch.estimate(key(3)) == 0  # 1 // 2


def test_decay_happens_every_sample_size_sightings():
    sketch = FrequencySketch(1024)
    assert sketch.sample_size == (1024 // 2) * 2 // 4  # counters per row
    for i in range(3 * sketch.sample_size):
        sketch.record(key(i))
    assert sketch.resets == 3


@pytest.mark.parametrize("memory", [MIN_SKETCH_BYTES, 100, 4096, 5000, 1 << 20])
def test_memory_stays_within_its_bound(memory):
    sketch = FrequencySketch(memory)
    assert memory // 2 < sketch.nbytes <= memory
    for i in range(5000):
        sketch.record(key(i))
    sketch.reset()
    assert sketch.nbytes <= memory


def test_keys_seen_once_rarely_read_as_seen_twice():
    sketch = FrequencySketch(64 * 1024)  # 16,384 counters a row, the default sample size
    for i in range(10_000):
        sketch.record(key(i))
    assert sketch.resets == 0
    assert sum(sketch.estimate(key(i)) >= 2 for i in range(10_000)) < 100  # under 1 %
    assert sum(sketch.estimate(key(i)) >= 1 for i in range(10_000, 20_000)) < 100


def test_rejects_a_sketch_too_small_or_too_large():
    with pytest.raises(ValueError, match="sketch memory must be >= 64 and <= 1073741824 bytes, got 63"):
        FrequencySketch(63)
    with pytest.raises(ValueError, match="got 1073741825"):
        FrequencySketch((1 << 30) + 1)
    with pytest.raises(ValueError, match="sample_size must be >= 1"):
        FrequencySketch(64, sample_size=0)

"""Pinning across a stack: the manager's pin, the per-request pin parameter, prefixes from token ids."""

import logging
import threading

import pytest

from tiering.core import CPUPrimaryTier, LRUCachePolicy, OffloadingSpec, ReqContext, TieringManager
from tiering.core.base import SecondaryTierManager
from tiering.core.capabilities import PinnableTier, can_pin
from tiering.core.keys import block_keys
from tiering.core.policies.pinning import PIN_PARAM, RequestPins, pin_in_tiers, prefix_keys, request_pin_ttl

BLOCK = 1024


class PinRecorder(SecondaryTierManager):
    """Records pins (a pure unit test of the callers; the tiers' own pins are tested with their media)."""

    def __init__(self, spec, view, name="rec", answer=True):
        super().__init__(spec, view, name)
        self.pins = []
        self.answer = answer
        self.pinned = threading.Event()

    def pin(self, keys, ttl_s):
        if self.answer is None:
            raise RuntimeError("medium down")
        self.pins.append((list(keys), ttl_s))
        self.pinned.set()
        return self.answer

    def unpin(self, keys):
        pass

    @property
    def pinning(self):
        return True

    def lookup(self, key, ctx):
        return False

    def submit_store(self, job):
        pass

    def submit_load(self, job):
        pass

    def get_finished(self):
        return []


@pytest.fixture
def tiers():
    spec = OffloadingSpec({"cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK})
    primary = CPUPrimaryTier(4, BLOCK, LRUCachePolicy(4))
    made = [PinRecorder(spec, primary.kv_view, "a"), PinRecorder(spec, primary.kv_view, "b", answer=False)]
    return primary, made


def test_manager_pins_in_every_tier_and_says_which_took_it(tiers, caplog):
    primary, (a, b) = tiers
    manager = TieringManager(primary, [a, b])
    keys = prefix_keys(list(range(64)), 16)
    assert manager.pin(keys, 3600) == [True, False]
    assert a.pins == [(keys, 3600)] and b.pins == [(keys, 3600)]
    b.answer = None
    with caplog.at_level(logging.ERROR):
        assert pin_in_tiers([a, b], keys, 60) == [True, False]  # a tier that raises is a refusal, logged
    assert "secondary tier 1 (b): pin raised" in caplog.text
    with pytest.raises(ValueError, match="ttl_s must be > 0"):
        manager.pin(keys, -1)


def test_the_example_tier_cannot_pin():
    ExampleSecondaryTierManager = pytest.importorskip("tiering.example").ExampleSecondaryTierManager

    spec = OffloadingSpec({"cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK})
    primary = CPUPrimaryTier(4, BLOCK, LRUCachePolicy(4))
    tier = ExampleSecondaryTierManager(spec, primary.kv_view, "example")
    assert not isinstance(tier, PinnableTier) and not can_pin(tier)
    assert pin_in_tiers([tier], block_keys(list(range(16)), 16), 60) == [False]


def test_prefix_keys_are_the_block_keys_of_the_full_blocks():
    tokens = list(range(40))
    assert prefix_keys(tokens, 16) == block_keys(tokens, 16) and len(prefix_keys(tokens, 16)) == 2
    with pytest.raises(ValueError, match="make no full block"):
        prefix_keys(tokens[:10], 16)


@pytest.mark.parametrize(("value", "seconds"), [(90, 90.0), (1.5, 1.5), ("1h", 3600.0), ("30m", 1800.0)])
def test_request_pin_ttl_reads_seconds_or_a_duration(value, seconds):
    assert request_pin_ttl(ReqContext("r", {PIN_PARAM: value})) == seconds


@pytest.mark.parametrize("value", [0, -5, "soon", True, [1]])
def test_a_bad_request_pin_is_ignored_with_a_warning(value, caplog):
    with caplog.at_level(logging.WARNING):
        assert request_pin_ttl(ReqContext("r7", {PIN_PARAM: value})) is None
    assert f"request r7: {PIN_PARAM}=" in caplog.text


def test_request_pins_are_taken_off_the_callers_thread_only_when_asked(tiers):
    _, (a, _b) = tiers
    queue = RequestPins()
    keys = prefix_keys(list(range(32)), 16)
    queue.submit([a], keys, ReqContext("plain"))
    queue.submit([a], keys, ReqContext("pinned", {PIN_PARAM: "2h"}))
    assert a.pinned.wait(10)
    queue.close()
    assert a.pins == [(keys, 7200.0)]
    assert queue._thread is None

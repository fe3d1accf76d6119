import pytest

from tiering.core import ARCCachePolicy, CPUPrimaryTier, LRUCachePolicy
from tiering.core.base import block_view
from tiering.core.primary import allocate_host_buffer, as_block_view
from tiering.testing import make_key


def primary(n=4, policy=LRUCachePolicy):
    return CPUPrimaryTier(n, 1024, policy(n))


def store(tier, keys):
    alloc = tier.allocate(keys)
    tier.complete_write(alloc.keys, True)
    return alloc


def test_host_buffer_shape_and_slots_are_disjoint():
    view = allocate_host_buffer(3, 8)
    assert view.shape == (3, 8) and view.strides == (8, 1) and not view.readonly
    block_view(view, 1)[:] = b"\x01" * 8
    assert view.tobytes() == bytes(8) + b"\x01" * 8 + bytes(8)
    with pytest.raises(IndexError):
        block_view(view, 3)
    with pytest.raises(ValueError, match="expected 2 x 8"):
        as_block_view(memoryview(bytearray(15)), 2, 8)


def test_lru_evicts_least_recently_used_unpinned():
    tier = primary()
    keys = [make_key(i) for i in range(5)]
    store(tier, keys[:4])
    tier.touch([keys[0]])
    alloc = store(tier, [keys[4]])
    assert alloc.evicted == [keys[1]]
    assert not tier.lookup(keys[1]) and tier.lookup(keys[0]) and tier.lookup(keys[4])
    assert tier.evictions == 1


def test_pinned_blocks_are_never_evicted_or_reused():
    tier = primary(2)
    a, b, c = (make_key(i) for i in range(3))
    store(tier, [a, b])
    slots = tier.pin([a, b])
    assert tier.num_pinned == 2
    alloc = tier.allocate([c])
    assert alloc.rejected == [c] and alloc.keys == []
    tier.unpin([a])
    alloc = tier.allocate([c])
    assert alloc.evicted == [a] and alloc.block_ids == [slots[0]]
    assert tier.pins(b) == 1 and tier.num_pinned == 2  # b, and c being written
    tier.complete_write([c], False)
    tier.unpin([b])
    assert tier.num_pinned == 0


def test_C09_all_slots_pinned_by_loads_store_batch_reports_rejections():
    tier = primary(16)
    old = [make_key(i, b"old") for i in range(16)]
    store(tier, old)
    tier.pin(old)
    new = [make_key(i, b"new") for i in range(32)]
    alloc = tier.allocate(new)  # no exception
    assert alloc.keys == [] and alloc.rejected == new
    assert tier.num_resident == 16 and all(tier.lookup(k) for k in old)
    tier.unpin(old)
    alloc = tier.allocate(new)
    assert len(alloc.keys) == 16 and alloc.rejected == new[16:]
    assert sorted(alloc.evicted) == sorted(old)
    tier.complete_write(alloc.keys, True)
    assert all(tier.lookup(k) for k in new[:16])


def test_failed_write_frees_the_slot():
    tier = primary(1)
    a, b = make_key(1), make_key(2)
    alloc = tier.allocate([a])
    assert not tier.lookup(a) and a in tier
    tier.complete_write([a], False)
    assert a not in tier
    assert tier.allocate([b]).block_ids == alloc.block_ids


def test_present_keys_are_touched_not_reallocated():
    tier = primary(2)
    a, b, c = (make_key(i) for i in range(3))
    store(tier, [a, b])
    alloc = tier.allocate([a])
    assert alloc.present == [a] and alloc.keys == []
    assert store(tier, [c]).evicted == [b]


def test_pin_of_absent_key_raises():
    with pytest.raises(KeyError, match="not resident"):
        primary().pin([make_key(9)])


def test_arc_keeps_frequent_blocks_under_a_scan():
    # A frequently used working set survives a one-pass scan under ARC, not under LRU.
    hot = [make_key(i, b"hot") for i in range(4)]
    scan = [make_key(i, b"scan") for i in range(8)]
    survivors = {}
    for policy in (LRUCachePolicy, ARCCachePolicy):
        tier = primary(8, policy)
        store(tier, hot)
        for _ in range(3):
            tier.touch(hot)
        for key in scan:
            store(tier, [key])
        survivors[policy.__name__] = sum(tier.lookup(k) for k in hot)
    assert survivors == {"LRUCachePolicy": 0, "ARCCachePolicy": 4}


def test_arc_ghost_hit_moves_target():
    policy = ARCCachePolicy(3)
    a, b, c = (make_key(i) for i in range(3))
    policy.insert(a)
    policy.insert(b)
    assert policy.evict(lambda k: True) == a
    assert a in policy.b1
    policy.insert(c)
    assert policy.evict(lambda k: True, incoming=a) == b
    policy.insert(a)  # ghost hit in B1: favour recency
    assert policy.p == 1.0 and a in policy.t2

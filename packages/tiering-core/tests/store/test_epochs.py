from tiering.core.base import OffloadKey
from tiering.core.store.epochs import RemovalEpochs


def k(i: int) -> OffloadKey:
    return OffloadKey(i.to_bytes(8, "little"))


def test_a_removal_after_the_ticket_is_seen_and_one_before_is_not():
    epochs = RemovalEpochs()
    epochs.removed(k(1))
    ticket = epochs.take()
    assert epochs.removed_since(k(1), ticket) is False
    epochs.removed(k(2))
    assert epochs.removed_since(k(2), ticket) is True
    assert epochs.removed_since(k(3), ticket) is False
    assert epochs.tick() == ticket + 2


def test_records_are_dropped_when_the_last_ticket_is_released():
    epochs = RemovalEpochs()
    first, second = epochs.take(), epochs.take()
    epochs.removed(k(1))
    epochs.release(first, resident=0)
    assert len(epochs) == 1  # ``second`` is still live
    epochs.release(second, resident=0)
    assert len(epochs) == 0


def test_records_older_than_every_live_ticket_are_pruned_past_the_bound():
    epochs = RemovalEpochs()
    old = epochs.take()
    for i in range(5000):
        epochs.removed(k(i))
    live = epochs.take()
    epochs.removed(k(99999))
    epochs.release(old, resident=0)  # 5001 records > 4096: prune those at or before ``live``
    assert len(epochs) == 1
    assert epochs.removed_since(k(99999), live) is True

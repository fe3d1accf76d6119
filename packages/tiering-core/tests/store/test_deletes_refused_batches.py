"""The block store's delete path when a medium stops taking batch deletes while it runs (case C21).

Pure unit tests of :class:`tiering.core.store.deletes.Deletes` on a fake medium and a fake index ledger: the
s3 suite covers the same on a real server (``test_c21_a_batch_refused_after_start_up_...``).
"""

import threading
import time

import pytest

from tiering.core.base import OffloadKey
from tiering.core.store import Medium
from tiering.core.store.deletes import Deletes
from tiering.core.store.index import Victim
from tiering.core.store.stats import Counters
from tiering.testing.harness import wait_until


class RefusingMedium(Medium):
    """Takes no batch delete: the first batch it sees switches it to one key per request (answered None)."""

    label = "refusing store"
    stored_block_bytes = 1
    delete_threads = 4
    delete_batch = 1000

    def __init__(self):
        self.lock, self.running, self.most, self.holding = threading.Lock(), 0, 0, 0
        self.gate = threading.Event()  # keys starting with b"hold" wait for it (keeps the delete threads busy)

    def remove_many(self, keys):
        if len(keys) > 1 and self.delete_batch > 1:
            self.delete_batch = 1
            return [None] * len(keys)  # refused as a batch: nothing deleted
        return [self.remove(key) for key in keys]

    def remove(self, key):
        if key.startswith(b"hold"):
            with self.lock:
                self.holding += 1
            return self.gate.wait(30)
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.05)
        with self.lock:
            self.running -= 1
        return True

    def write_many(self, keys, block_ids, slot, stopping):
        raise NotImplementedError

    def read_many(self, keys, block_ids, slot):
        raise NotImplementedError

    def size(self, key):
        raise NotImplementedError

    def scan(self, stopping):
        raise NotImplementedError


class Ledger:
    """What the delete path reports to the index."""

    def __init__(self):
        self.outcomes, self.lock = [], threading.Lock()

    def deleted_many(self, outcomes):
        with self.lock:
            self.outcomes += list(outcomes)

    def retry_deletes(self):
        return ()


def victims(prefix, n):
    return [Victim(OffloadKey(prefix + bytes([i])), 1) for i in range(n)]


def settle(ledger, n):
    deadline = time.monotonic() + 10
    while len(ledger.outcomes) < n:
        assert time.monotonic() < deadline, f"{len(ledger.outcomes)} of {n} deletes reported"
        time.sleep(0.01)


def test_c21_keys_of_a_refused_batch_are_sent_again_singly_not_counted_failed():
    medium, ledger = RefusingMedium(), Ledger()
    deletes = Deletes(medium, ledger, Counters(("bad_blocks_removed",)), lambda keys: None)
    try:
        deletes.delete(victims(b"v", 8), "eviction")  # idle threads take batches of two: each refused
        settle(ledger, 8)
        assert sorted(ledger.outcomes) == [(v.key, True) for v in victims(b"v", 8)]  # every one deleted, none failed
        assert medium.most >= 2  # sent again in parallel
    finally:
        deletes.close()


def test_c21_single_deletes_spread_over_the_threads_also_while_they_are_busy():
    medium, ledger = RefusingMedium(), Ledger()
    deletes = Deletes(medium, ledger, Counters(("bad_blocks_removed",)), lambda keys: None)
    try:
        deletes.delete(victims(b"v", 2), "eviction")  # the medium refuses batches from now on
        settle(ledger, 2)
        medium.most = 0
        deletes.delete(victims(b"hold", 4), "eviction")
        wait_until(lambda: medium.holding == 4)  # all four delete threads busy
        deletes.delete(victims(b"w", 8), "eviction")  # queued meanwhile: one unit each, not one unit of eight
        medium.gate.set()
        settle(ledger, 14)
        assert all(ok for _, ok in ledger.outcomes)
        assert medium.most >= 2  # the eight single deletes overlapped once the threads were free
    finally:
        medium.gate.set()
        deletes.close()


class RaisingMedium(RefusingMedium):
    """Inline deletes in batches; removing a key that starts with b"bad" raises."""

    delete_threads = 0
    delete_batch = 100

    def __init__(self, batch_raises):
        super().__init__()
        self.batch_raises = batch_raises
        self.removed = []

    def remove_many(self, keys):
        if self.batch_raises and len(keys) > 1 and any(k.startswith(b"bad") for k in keys):
            raise OSError("the batch request failed")  # a batch medium: one raising key fails its whole request
        return Medium.remove_many(self, keys)  # the default: remove() per key

    def remove(self, key):
        if key.startswith(b"bad"):
            raise OSError(f"remove of {key.hex()} failed")
        self.removed.append(key)
        return True


@pytest.mark.parametrize("batch_raises", [False, True], ids=["per-key-remove-raises", "batch-call-raises"])
def test_c30_a_raising_remove_fails_only_its_own_key_in_a_batch_delete(batch_raises):
    medium, ledger = RaisingMedium(batch_raises), Ledger()
    deletes = Deletes(medium, ledger, Counters(("bad_blocks_removed",)), lambda keys: None)
    good, bad = victims(b"ok", 6), victims(b"bad", 1)
    try:
        deletes.delete([*good[:3], *bad, *good[3:]], "eviction")
        settle(ledger, 7)
        assert dict(ledger.outcomes) == {**{v.key: True for v in good}, bad[0].key: False}
        assert sorted(medium.removed) == sorted(v.key for v in good)
    finally:
        deletes.close()

from tiering.core.base import OffloadKey
from tiering.core.store.index_types import Victim
from tiering.core.store.ledger import DeleteLedger


def k(i: int) -> OffloadKey:
    return OffloadKey(i.to_bytes(4, "big"))


def test_a_failed_delete_keeps_its_bytes_until_a_retry_succeeds():
    ledger = DeleteLedger()
    assert ledger.hand_out(k(1), 100) == Victim(k(1), 100)
    ledger.hand_out(k(2), 50)
    assert (k(1) in ledger, ledger.is_pending(k(1)), ledger.bytes) == (True, True, 150)
    ledger.report(k(1), ok=False)
    ledger.report(k(2), ok=True)
    assert (k(1) in ledger, ledger.is_pending(k(1)), k(2) in ledger) == (True, False, False)
    assert (ledger.pending_bytes, ledger.failed_bytes, ledger.failed_deletes) == (0, 100, 1)
    assert ledger.retry() == (Victim(k(1), 100),)
    assert (ledger.pending_bytes, ledger.failed_bytes) == (100, 0)
    ledger.report(k(1), ok=True)
    assert (k(1) in ledger, ledger.bytes, ledger.failed_deletes) == (False, 0, 1)


def test_an_outcome_for_a_key_not_handed_out_is_ignored():
    ledger = DeleteLedger()
    ledger.report(k(9), ok=False)
    assert (k(9) in ledger, ledger.bytes, ledger.failed_deletes) == (False, 0, 0)


def test_a_rescan_settles_failed_deletes_whose_block_is_gone():
    ledger = DeleteLedger()
    for i in (1, 2, 3):
        ledger.hand_out(k(i), 10)
        ledger.report(k(i), ok=False)
    assert ledger.settle_absent({k(2)}) == (k(1), k(3))
    assert (k(2) in ledger, k(1) in ledger, ledger.failed_bytes) == (True, False, 10)

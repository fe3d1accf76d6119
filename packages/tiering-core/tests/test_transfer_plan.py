"""The torch-free part of the transfer path: layouts, copy planning, job checks, the driver; and core without torch.

Nothing here imports torch, so these tests run in every environment (unit-core
has no torch); the copies themselves are tested in test_transfer.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tiering.core import JobResult, ReqContext, TieringOffloadingSpec
from tiering.core.keys import block_keys
from tiering.core.runtime.driver import OffloadingDriver
from tiering.core.transfer import detect_layout, plan_copies, slot_layout
from tiering.core.transfer.layout import check_layout
from tiering.core.transfer.plan import MAX_SLICE_RUNS, check_job, runs, staging_blocks


# -- layouts -----------------------------------------------------------------------
def test_detect_and_check_layout():
    assert detect_layout((2, 13, 16, 8, 128)) == "kv_first"
    assert detect_layout((13, 2, 16, 8, 128)) == "blocks_first"
    with pytest.raises(ValueError, match="5-D"):
        detect_layout((2, 4, 4))
    with pytest.raises(ValueError, match="ambiguous"):
        detect_layout((2, 2, 4, 2, 8))
    with pytest.raises(ValueError, match="neither"):
        detect_layout((3, 4, 4, 2, 8))
    assert check_layout((2, 2, 4, 2, 8), "blocks_first") == "blocks_first"
    with pytest.raises(ValueError, match="does not fit layout 'blocks_first'"):
        check_layout((2, 4, 4, 2, 8), "blocks_first")
    with pytest.raises(ValueError, match="unknown KV layout 'nhd'"):
        check_layout((2, 4, 4, 2, 8), "nhd")


def test_slot_layout_names_the_geometry():
    assert (
        slot_layout(32, 16, 8, 128, "bfloat16")
        == "layer-major/kv/nhd;layers=32;block_size=16;heads=8;head_size=128;dtype=bfloat16"
    )


# -- planning ----------------------------------------------------------------------
def test_runs():
    assert runs([3, 4, 5, 9]) == [(0, 3, 3), (3, 9, 1)]
    assert runs([7]) == [(0, 7, 1)]
    assert runs([]) == []
    assert runs([5, 4]) == [(0, 5, 1), (1, 4, 1)]  # descending is not a run


def test_plan_coalesces_runs():
    plan = plan_copies([5, 6, 7, 8], [10, 11, 12, 13])
    assert plan.runs == [(0, 5, 10, 4)]
    assert plan.slot_runs == [(0, 5, 4)]
    assert not plan.scattered
    plan = plan_copies([8, 5, 7, 6], [13, 10, 12, 11])  # order does not matter
    assert plan.runs == [(0, 5, 10, 4)]
    plan = plan_copies([0, 1, 2, 9], [4, 3, 5, 6])
    assert plan.slots == [0, 1, 2, 9] and plan.blocks == [4, 3, 5, 6]
    assert plan.runs == [(0, 0, 4, 1), (1, 1, 3, 1), (2, 2, 5, 1), (3, 9, 6, 1)]
    assert plan.slot_runs == [(0, 0, 3), (3, 9, 1)]
    empty = plan_copies([], [])
    assert empty.runs == [] and empty.slot_runs == [] and empty.split(4) == []
    with pytest.raises(ValueError):
        plan_copies([1, 2], [3])


def test_plan_scattered_beyond_max_slice_runs():
    n = MAX_SLICE_RUNS + 1
    assert plan_copies(list(range(n)), [2 * i for i in range(n)]).scattered
    assert not plan_copies(list(range(n - 1)), [2 * i for i in range(n - 1)]).scattered


def test_split_replans_each_chunk():
    plan = plan_copies([9, 0, 1, 2, 3, 4], [1, 10, 11, 12, 30, 31])
    chunks = plan.split(4)
    assert [c.slots for c in chunks] == [[0, 1, 2, 3], [4, 9]]
    assert chunks[0].runs == [(0, 0, 10, 3), (3, 3, 30, 1)]
    assert chunks[1].runs == [(0, 4, 31, 1), (1, 9, 1, 1)]
    assert chunks[1].slot_runs == [(0, 4, 1), (1, 9, 1)]
    assert [c.slots for c in plan.split(100)] == [plan.slots]
    with pytest.raises(ValueError, match="max_blocks must be >= 1"):
        plan.split(0)


def test_staging_blocks():
    assert staging_blocks(64 * 1024 * 1024, 2 * 1024 * 1024) == 32
    assert staging_blocks(100, 4096) == 1  # at least one block
    assert staging_blocks(3 * 4096 + 1, 4096) == 3


def test_check_job_names_the_job_and_the_id():
    check_job(1, [0, 12], [0, 4], 13, 5, set())
    check_job(1, [], [], 13, 5, set())  # an empty job is valid
    for blocks, slots, in_flight, msg in (
        ([1], [0], {7}, "transfer job 7 is already in flight"),
        ([1, 2], [0], (), "transfer job 7: 2 device blocks but 1 slots"),
        ([13], [0], (), r"transfer job 7: device block id 13 outside \[0, 13\)"),
        ([0], [5], (), r"transfer job 7: slot id 5 outside \[0, 5\)"),
        ([-1], [0], (), "device block id -1 outside"),
        ([True], [0], (), "device block id True outside"),
        ([1.0], [0], (), "device block id 1.0 outside"),
        ([1, 1], [0, 1], (), "repeated device block ids"),
        ([1, 2], [3, 3], (), "repeated slot ids"),
    ):
        with pytest.raises(ValueError, match=msg):
            check_job(7, blocks, slots, 13, 5, in_flight)


# -- the driver, over a pure-Python copier (the real handler is tested with torch) ---------
class BytesCopier:
    """A synchronous stand-in for TransferHandler: device blocks are bytearrays, slots the primary's kv_view."""

    def __init__(self, primary, num_device_blocks: int, fail: bool = False) -> None:
        self.primary = primary
        self.num_slots = primary.num_blocks
        self.device = [bytearray(primary.block_bytes) for _ in range(num_device_blocks)]
        self.fail = fail
        self.done: list[JobResult] = []

    def submit_store(self, job_id, block_ids, slot_ids):
        check_job(job_id, block_ids, slot_ids, len(self.device), self.num_slots, [r.job_id for r in self.done])
        if not self.fail:
            for b, s in zip(block_ids, slot_ids, strict=True):
                self.primary.kv_view[s : s + 1].cast("B")[:] = self.device[b]
        self.done.append(JobResult(job_id, not self.fail))

    def submit_load(self, job_id, slot_ids, block_ids):
        check_job(job_id, block_ids, slot_ids, len(self.device), self.num_slots, [r.job_id for r in self.done])
        for b, s in zip(block_ids, slot_ids, strict=True):
            self.device[b][:] = self.primary.kv_view[s : s + 1].tobytes()
        self.done.append(JobResult(job_id, True))

    def get_finished(self):
        out, self.done = self.done, []
        return out


def _stack(fail: bool = False):
    spec = TieringOffloadingSpec({"cpu_bytes_to_use": 4 * 1024, "block_bytes": 1024})
    manager = spec.get_manager()
    return manager, BytesCopier(manager.primary, 8, fail=fail)


def test_driver_round_trip_without_torch():
    manager, copier = _stack()
    driver = OffloadingDriver(manager, copier)
    keys = block_keys(list(range(48)), 16)
    for i, b in enumerate([5, 2, 7]):
        copier.device[b][:] = bytes([i + 1]) * 1024
    assert driver.store(keys, [5, 2, 7], ReqContext("a")) == keys
    done = driver.wait(timeout=10)
    assert [(s.keys, s.success) for s in done.stores] == [(keys, True)]
    assert manager.lookup(keys, ReqContext("b")) == 3
    driver.load(keys, [0, 1, 3], ReqContext("b"))
    done = driver.wait(timeout=10)
    [load] = done.loads
    assert load.keys == keys and load.block_ids == [0, 1, 3] and load.requested == 3
    assert [bytes(copier.device[b][:1]) for b in (0, 1, 3)] == [b"\x01", b"\x02", b"\x03"]
    assert manager.primary.num_pinned == 0 and not driver.has_pending_work()


def test_driver_failed_store_frees_the_slots_without_torch():
    manager, copier = _stack(fail=True)
    driver = OffloadingDriver(manager, copier)
    keys = block_keys(list(range(32)), 16)
    driver.store(keys, [0, 1], ReqContext("a"))
    done = driver.wait(timeout=10)
    assert [(s.keys, s.success) for s in done.stores] == [(keys, False)]
    assert manager.primary.num_resident == 0 and manager.primary.num_pinned == 0


def test_driver_rejects_a_copier_of_another_size():
    manager, _ = _stack()
    other = TieringOffloadingSpec({"cpu_bytes_to_use": 8 * 1024, "block_bytes": 1024}).get_manager()
    with pytest.raises(ValueError, match="handler has 8 slots, primary tier 4"):
        OffloadingDriver(manager, BytesCopier(other.primary, 8))


# -- core without torch --------------------------------------------------------------
def test_core_and_transfer_planning_work_without_torch():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # makes `import torch` raise ImportError
        import tiering.core
        from tiering.core import ReqContext, TieringOffloadingSpec
        from tiering.core.keys import block_keys
        spec = TieringOffloadingSpec({"cpu_bytes_to_use": 4096, "block_bytes": 1024})
        m = spec.get_manager()
        keys = block_keys(list(range(32)), 16)
        ctx = ReqContext("a")
        alloc = m.prepare_store(keys, ctx)
        m.complete_store(alloc.keys, ctx)
        m.get_finished()
        assert m.lookup(keys, ReqContext("b")) == 2
        import tiering.core.transfer
        from tiering.core.runtime.driver import OffloadingDriver
        from tiering.core.transfer import plan_copies, detect_layout
        from tiering.core.transfer.plan import CopyPlan
        assert plan_copies([1, 2], [5, 6]).runs == [(0, 1, 5, 2)]
        for stmt in ("from tiering.core.transfer import TransferHandler",
                     "from tiering.core.transfer import allocate_host_buffer",
                     "import tiering.core.transfer.handler",
                     "tiering.core.transfer.kv_geometry"):
            try:
                exec(stmt)
            except ImportError as exc:
                assert "pip install 'tiering-core[torch]'" in str(exc), (stmt, exc)
            else:
                raise AssertionError(stmt + " worked without torch")
        try:
            tiering.core.transfer.no_such_name
        except AttributeError as exc:
            assert "no_such_name" in str(exc)
        assert "torch" not in [k for k, v in sys.modules.items() if v is not None]
        print("OK")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "OK"

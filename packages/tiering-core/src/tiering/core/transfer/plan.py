"""Copy planning of the transfer path, without torch: which slots and device blocks move, in which runs.

A transfer job moves ``n`` device blocks to (store) or from (load) ``n``
primary slots. Planning sorts the pairs by slot and finds the maximal runs
that can move in one copy; the copy itself (:mod:`tiering.core.transfer.handler`)
then issues one strided copy per run and layer, or one gather per layer when
the blocks are too scattered (:attr:`CopyPlan.scattered`). Everything here is
plain integers, so it is tested without torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

DEFAULT_STAGING_BYTES = 64 * 1024 * 1024
"""Default size of the CUDA staging buffer (bytes; rounded down to whole blocks, at least one)."""

MAX_SLICE_RUNS = 4
"""A staged copy with more runs than this gathers/scatters each layer with one indexed copy instead."""

MIN_STRIDED_RUN = 8
"""A direct (host-resident) copy moves a run of at least this many blocks with one strided torch copy per layer;
shorter runs move with ``memmove``, whose call costs about a tenth of a torch op's dispatch."""


def runs(values: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive integers, in order.

    Returns:
        ``(index, first value, length)`` per run; e.g. ``runs([3, 4, 5, 9])``
        is ``[(0, 3, 3), (3, 9, 1)]``.
    """
    out: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            out.append((start, values[start], i - start))
            start = i
    return out


@dataclasses.dataclass(frozen=True)
class CopyPlan:
    """The copies of one transfer job (built by :func:`plan_copies`).

    Attributes:
        slots: primary slots, sorted ascending.
        blocks: the device block of each entry of ``slots``.
        runs: ``(index, slot, block, length)``: maximal runs where slots and
            device blocks are both consecutive (one strided copy each);
            ``index`` is the run's position in :attr:`slots`.
        slot_runs: ``(index, slot, length)``: maximal runs of consecutive
            slots (the host-side copies of the staged path).
    """

    slots: list[int]
    blocks: list[int]
    runs: list[tuple[int, int, int, int]]
    slot_runs: list[tuple[int, int, int]]

    @property
    def scattered(self) -> bool:
        """Whether a staged copy should gather/scatter by index (more than :data:`MAX_SLICE_RUNS` runs)."""
        return len(self.runs) > MAX_SLICE_RUNS

    def split(self, max_blocks: int) -> list[CopyPlan]:
        """This plan in chunks of at most ``max_blocks`` slots (the staging buffer's capacity), each re-planned.

        Raises:
            ValueError: ``max_blocks`` < 1.
        """
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        return [
            plan_copies(self.slots[lo : lo + max_blocks], self.blocks[lo : lo + max_blocks])
            for lo in range(0, len(self.slots), max_blocks)
        ]


def plan_copies(slot_ids: Sequence[int], block_ids: Sequence[int]) -> CopyPlan:
    """Sort (slot, device block) pairs by slot and find the runs to copy in one piece.

    Args:
        slot_ids: primary slots, one per block, no repeats.
        block_ids: device blocks, same length.

    Returns:
        A :class:`CopyPlan`.

    Raises:
        ValueError: the two lists differ in length.
    """
    pairs = sorted(zip(slot_ids, block_ids, strict=True))
    slots = [s for s, _ in pairs]
    blocks = [b for _, b in pairs]
    both: list[tuple[int, int, int, int]] = []
    start = 0
    for i in range(1, len(pairs) + 1):
        if i == len(pairs) or slots[i] != slots[i - 1] + 1 or blocks[i] != blocks[i - 1] + 1:
            both.append((start, slots[start], blocks[start], i - start))
            start = i
    return CopyPlan(slots, blocks, both, runs(slots))


def staging_blocks(staging_bytes: int, block_bytes: int) -> int:
    """Whole blocks that fit in a staging buffer of ``staging_bytes`` bytes, at least one."""
    return max(1, staging_bytes // block_bytes)


def check_job(
    job_id: int,
    block_ids: Sequence[int],
    slot_ids: Sequence[int],
    num_device_blocks: int,
    num_slots: int,
    in_flight: Collection[int],
) -> None:
    """Validate a transfer job before anything is copied.

    Args:
        job_id: the caller's job id.
        block_ids: device blocks, each in ``[0, num_device_blocks)``.
        slot_ids: primary slots, each in ``[0, num_slots)``.
        num_device_blocks: device blocks per layer.
        num_slots: primary slots.
        in_flight: job ids submitted and not yet reported.

    Raises:
        ValueError: ``job_id`` is in flight, the lengths differ, an id repeats,
            is not an int, or is out of range; the message names the job and the id.
    """
    if job_id in in_flight:
        raise ValueError(f"transfer job {job_id} is already in flight")
    if len(block_ids) != len(slot_ids):
        raise ValueError(f"transfer job {job_id}: {len(block_ids)} device blocks but {len(slot_ids)} slots")
    for name, ids, bound in (("device block", block_ids, num_device_blocks), ("slot", slot_ids, num_slots)):
        if len(set(ids)) != len(ids):
            raise ValueError(f"transfer job {job_id}: repeated {name} ids")
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < bound:
                raise ValueError(f"transfer job {job_id}: {name} id {i!r} outside [0, {bound})")


__all__ = [
    "DEFAULT_STAGING_BYTES",
    "MAX_SLICE_RUNS",
    "MIN_STRIDED_RUN",
    "CopyPlan",
    "check_job",
    "plan_copies",
    "runs",
    "staging_blocks",
]

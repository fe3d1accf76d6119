"""Shares: the blocks of one or more jobs that an I/O thread moves in one go.

A tier's I/O pool hands a thread a share of ``(job state, block index)``
tasks, possibly from several jobs (cross-job shares); these helpers record
the share's outcomes with one lock round per job, fail what never ran, and
split a job's blocks into shares for the workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tiering.core.base import JobResult
from tiering.core.store.jobs import JobState


def record_tasks(outcomes: Iterable[tuple[JobState, int, bool, str]]) -> list[JobResult]:
    """Record ``(job state, block index, ok, cause)`` outcomes of several jobs: one lock round per job.

    Returns:
        The results of the jobs this call completed.
    """
    grouped: dict[JobState, list[tuple[int, bool, str]]] = {}  # a JobState hashes by identity
    for state, index, ok, cause in outcomes:
        if (rows := grouped.get(state)) is None:
            rows = grouped[state] = []
        rows.append((index, ok, cause))
    results = [state.record(rows) for state, rows in grouped.items()]
    return [r for r in results if r is not None]


def fail_tasks(tasks: Iterable[tuple[JobState, int]], cause: str) -> list[JobResult]:
    """Fail the ``(job state, block index)`` tasks that have no outcome yet (an I/O pool's ``on_error``)."""
    grouped: dict[JobState, list[int]] = {}
    for state, index in tasks:
        if (indices := grouped.get(state)) is None:
            indices = grouped[state] = []
        indices.append(index)
    results = [state.fail_unrecorded(indices, cause) for state, indices in grouped.items()]
    return [r for r in results if r is not None]


def split_batches(indices: Sequence[int], parts: int, max_batch: int) -> list[list[int]]:
    """Split block indices into at most ``parts`` even batches of at most ``max_batch`` each.

    A job's blocks are spread over the workers this way (as vLLM's fs thread
    pool ``_batch_tasks`` does), so each worker takes its share at once.

    Raises:
        ValueError: ``parts`` or ``max_batch`` < 1.
    """
    if parts < 1 or max_batch < 1:
        raise ValueError(f"parts and max_batch must be >= 1, got {parts} and {max_batch}")
    n = len(indices)
    if n == 0:
        return []
    size = max(1, min(max_batch, -(-n // parts)))
    return [list(indices[i : i + size]) for i in range(0, n, size)]

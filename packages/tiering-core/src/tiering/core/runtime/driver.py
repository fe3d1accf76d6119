"""The offloading driver: device <-> primary copies and the tiering manager's promotions, as one job flow.

:class:`OffloadingDriver` connects a :class:`~tiering.core.transfer.TransferHandler`
to a :class:`~tiering.core.runtime.manager.TieringManager`: stores go device -> primary ->
secondary tiers, loads secondary -> primary -> device. This module needs no
torch itself (only the handler it is given does).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tiering.core.base import JobResult, OffloadKey, ReqContext
from tiering.core.runtime.manager import TieringManager

if TYPE_CHECKING:
    from tiering.core.transfer.handler import TransferHandler

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class StoreDone:
    """A finished device -> primary store (the cascade to secondary tiers has started).

    Attributes:
        req_context: the request.
        keys: the blocks copied into the primary tier by this store.
        success: False when the device -> host copy failed (nothing was stored).
    """

    req_context: ReqContext
    keys: list[OffloadKey]
    success: bool


@dataclasses.dataclass
class LoadDone:
    """A finished load into the device KV cache.

    Attributes:
        req_context: the request.
        keys: the blocks now in the device cache: a prefix of the keys given
            to :meth:`OffloadingDriver.load` (the rest are misses to recompute).
        block_ids: the device block of each entry of ``keys``.
        sources: per key, :data:`tiering.core.runtime.manager.PRIMARY` or the index of
            the secondary tier it was promoted from.
        requested: how many keys were asked for.
    """

    req_context: ReqContext
    keys: list[OffloadKey]
    block_ids: list[int]
    sources: list[int]
    requested: int


@dataclasses.dataclass
class Finished:
    """What one :meth:`OffloadingDriver.poll` found finished."""

    stores: list[StoreDone] = dataclasses.field(default_factory=list)
    loads: list[LoadDone] = dataclasses.field(default_factory=list)

    def extend(self, other: Finished) -> None:
        """Append ``other``'s entries."""
        self.stores.extend(other.stores)
        self.loads.extend(other.loads)


@dataclasses.dataclass
class _StoreJob:
    req_context: ReqContext
    keys: list[OffloadKey]


@dataclasses.dataclass
class _LoadJob:
    req_context: ReqContext
    device_blocks: list[int]
    done: LoadDone | None = None


class OffloadingDriver:
    """Drives a :class:`TransferHandler` with a :class:`~tiering.core.runtime.manager.TieringManager`.

    - :meth:`store`: ``manager.prepare_store`` gives pinned slots, the handler
      copies device -> host, and on completion ``manager.complete_store``
      marks them ready and cascades them to every secondary tier (which keeps
      them pinned until it reports).
    - :meth:`load`: ``manager.prepare_load`` pins resident blocks and promotes
      the others secondary -> primary; when the manager reports the
      :class:`~tiering.core.runtime.manager.LoadResult`, the handler copies host ->
      device and only then ``manager.complete_load`` releases the pins.

    The driver owns ``manager.get_finished()``: call :meth:`poll` instead.
    All methods run on one thread (the scheduler's or the worker's).

    Args:
        manager: the tiering manager (its primary tier is the handler's).
        handler: the transfer handler.

    Raises:
        ValueError: ``handler`` and ``manager`` do not share the primary tier geometry.
    """

    def __init__(self, manager: TieringManager, handler: TransferHandler) -> None:
        if handler.num_slots != manager.primary.num_blocks:
            raise ValueError(f"handler has {handler.num_slots} slots, primary tier {manager.primary.num_blocks}")
        self.manager = manager
        self.handler = handler
        self._next_job = 0
        self._stores: dict[int, _StoreJob] = {}
        self._loads: dict[int, _LoadJob] = {}
        self._awaiting: dict[str, _LoadJob] = {}

    def _job_id(self) -> int:
        self._next_job += 1
        return self._next_job

    def store(self, keys: Sequence[OffloadKey], block_ids: Sequence[int], req_context: ReqContext) -> list[OffloadKey]:
        """Start offloading device blocks ``block_ids[i]`` under ``keys[i]``.

        Keys already in the primary tier are only touched; keys that find
        every slot pinned are skipped.

        Returns:
            The keys whose copy was started (reported by :meth:`poll` as a :class:`StoreDone`).

        Raises:
            ValueError: ``keys`` and ``block_ids`` differ in length or a device block id is invalid.
        """
        if len(keys) != len(block_ids):
            raise ValueError(f"{len(keys)} keys but {len(block_ids)} device blocks")
        device_block = dict(zip(keys, block_ids, strict=True))
        alloc = self.manager.prepare_store(keys, req_context)
        if not alloc.keys:
            return []
        job_id = self._job_id()
        try:
            self.handler.submit_store(job_id, [device_block[k] for k in alloc.keys], alloc.block_ids)
        except ValueError:
            self.manager.complete_store(alloc.keys, req_context, success=False)
            raise
        self._stores[job_id] = _StoreJob(req_context, list(alloc.keys))
        return list(alloc.keys)

    def load(self, keys: Sequence[OffloadKey], block_ids: Sequence[int], req_context: ReqContext) -> None:
        """Start restoring ``keys`` (a run found by ``manager.lookup``) into device blocks ``block_ids``.

        :meth:`poll` reports one :class:`LoadDone` for the request.

        Raises:
            ValueError: lengths differ, or a load for the request is already in progress.
        """
        if len(keys) != len(block_ids):
            raise ValueError(f"{len(keys)} keys but {len(block_ids)} device blocks")
        req_id = req_context.req_id
        if req_id in self._awaiting:
            raise ValueError(f"request {req_id!r} already has a load in progress")
        self.manager.prepare_load(keys, req_context)
        self._awaiting[req_id] = _LoadJob(req_context, list(block_ids))

    def poll(self) -> Finished:
        """Advance every job without blocking and return what finished."""
        out = Finished()
        for result in self.handler.get_finished():
            self._on_copy_done(result, out)
        for load in self.manager.get_finished():
            job = self._awaiting.pop(load.req_context.req_id, None)
            if job is None:
                logger.error("load of request %r was not started by this driver; released", load.req_context.req_id)
                self.manager.complete_load(load.req_context)
                continue
            blocks = job.device_blocks[: len(load.keys)]
            job.done = LoadDone(load.req_context, list(load.keys), blocks, list(load.sources), load.requested)
            if not load.keys:
                self.manager.complete_load(load.req_context)
                out.loads.append(job.done)
                continue
            job_id = self._job_id()
            self._loads[job_id] = job
            try:
                self.handler.submit_load(job_id, load.block_ids, blocks)
            except ValueError:
                logger.exception("load of request %r rejected by the transfer handler", load.req_context.req_id)
                del self._loads[job_id]
                self.manager.complete_load(load.req_context)
                job.done.keys, job.done.block_ids, job.done.sources = [], [], []
                out.loads.append(job.done)
        for result in self.handler.get_finished():
            self._on_copy_done(result, out)
        return out

    def _on_copy_done(self, result: JobResult, out: Finished) -> None:
        store = self._stores.pop(result.job_id, None)
        if store is not None:
            self.manager.complete_store(store.keys, store.req_context, success=result.success)
            out.stores.append(StoreDone(store.req_context, store.keys, result.success))
            return
        load = self._loads.pop(result.job_id)
        self.manager.complete_load(load.req_context)
        assert load.done is not None
        if not result.success:
            load.done.keys, load.done.block_ids, load.done.sources = [], [], []
        out.loads.append(load.done)

    def has_pending_work(self) -> bool:
        """Whether a copy, a promotion or a cascade is still in flight."""
        return bool(self._stores or self._loads or self._awaiting) or self.manager.has_pending_work()

    def wait(self, timeout: float | None = None, interval: float = 0.0005) -> Finished:
        """Poll until nothing is in flight (scripts, tests, shutdown).

        Args:
            timeout: seconds before giving up; None waits forever.
            interval: seconds to sleep between polls.

        Returns:
            Everything the polls found finished.

        Raises:
            TimeoutError: work is still in flight after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        out = self.poll()
        while self.has_pending_work():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"transfers still in flight after {timeout} s")
            time.sleep(interval)
            out.extend(self.poll())
        return out


__all__ = ["Finished", "LoadDone", "OffloadingDriver", "StoreDone"]

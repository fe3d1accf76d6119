"""Drive vLLM's own ``TieringOffloadingManager`` on CPU the way its scheduler does.

Used by the binding's tests and ``scripts/bench_vs_vllm.py``. vLLM's
scheduler side (``TieringOffloadingSpec(config).get_manager()``: the /dev/shm
primary region, LRU, cascade, lookup, promotion) runs without a GPU; the
GPU<->CPU copies of its workers do not, so :class:`SchedulerDriver` writes a
stored block's bytes straight into the primary view (where the worker's DMA
would put them) and reads a loaded block's bytes from it.

Every manager call holds ``manager.lock``, as vLLM's connector does.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from tiering.core.vllm.compat import (
    HAS_MANAGER_LOCK,
    LookupResult,
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
    ReqContext,
    ScheduleEndContext,
    TieringOffloadingSpec,
    VLLMSecondaryTierFactory,
    manager_lock,
)

Key = bytes


def offloading_config(
    extra_config: Mapping[str, Any],
    *,
    worker_kv_bytes_per_block: int,
    engine_id: str,
    model: str = "test/model",
    dtype: str = "bfloat16",
    tokens_per_block: int = 16,
    blocks_per_chunk: int = 1,
    world_size: int = 1,
    rank: int = 0,
    replicated_layout: bool = False,
    enable_kv_cache_events: bool = False,
) -> Any:
    """Build vLLM's ``OffloadingConfig`` as its connector would for a single-group model.

    For tests, benchmarks and running vLLM's scheduler side standalone (the
    engine builds this itself when serving).

    Args:
        extra_config: ``kv_connector_extra_config``.
        worker_kv_bytes_per_block: KV bytes one worker stores per GPU block.
        engine_id: names the /dev/shm region; unique per live manager.
        model: the model name vLLM reports.
        dtype: the KV-cache dtype name vLLM reports.
        tokens_per_block: tokens per GPU block.
        blocks_per_chunk: GPU blocks per offloaded chunk.
        world_size: tensor-parallel workers (each has a slot in every row).
        rank: this worker's rank.
        replicated_layout: vLLM's replicated layout (one copy of the KV per
            row, the same on every rank, as for MLA).
        enable_kv_cache_events: vLLM's global KV-event switch.
    """
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=tokens_per_block, layer_names=("layers",), group_id=0),),
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        enable_kv_cache_events=enable_kv_cache_events,
        extra_config=dict(extra_config),
        engine_id=engine_id,
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=tokens_per_block, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=rank,
            world_size=world_size,
            tp_size=world_size,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
        replicated_layout=replicated_layout,
    )


def tiering_offloading_spec(config: Any) -> Any:
    """Build vLLM's own ``TieringOffloadingSpec(config)``; ``.get_manager()`` builds its scheduler side."""
    return TieringOffloadingSpec(config)


def vllm_tier_factory() -> Any:
    """Return vLLM's own ``SecondaryTierFactory`` class."""
    return VLLMSecondaryTierFactory


def make_key(index: int, seed: bytes = b"tiering") -> Key:
    """A deterministic vLLM ``OffloadKey``: a 32-byte block hash plus group index 0 (4 bytes)."""
    import hashlib

    return hashlib.sha256(seed + index.to_bytes(8, "big")).digest() + (0).to_bytes(4, "big")


def payload(key: Key, size: int) -> bytes:
    """``size`` deterministic bytes derived from ``key`` (distinct per key)."""
    import hashlib

    seed = hashlib.sha256(key).digest()
    reps = -(-size // len(seed))
    return (seed * reps)[:size]


@contextmanager
def vllm_manager(
    extra_config: Mapping[str, Any],
    *,
    worker_kv_bytes_per_block: int,
    **config_kwargs: Any,
) -> Iterator[tuple[Any, Any, SchedulerDriver]]:
    """Build vLLM's ``TieringOffloadingSpec`` and its manager; shut both down on exit.

    Yields:
        ``(spec, manager, driver)``: vLLM's spec, its ``TieringOffloadingManager``
        and a :class:`SchedulerDriver` over it (closed before the manager shuts down).
    """
    config = offloading_config(
        extra_config,
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        engine_id=f"tiering-{uuid.uuid4().hex[:12]}",
        **config_kwargs,
    )
    spec = tiering_offloading_spec(config)
    manager = spec.get_manager()
    driver = SchedulerDriver(manager)
    try:
        yield spec, manager, driver
    finally:
        driver.close()
        manager.shutdown()


@dataclasses.dataclass
class LookupOutcome:
    """How the lookups of a set of requests resolved.

    Attributes:
        hits: per request, the number of leading keys found (HIT).
        rounds: scheduler steps until every request resolved.
        seconds: wall time of the lookup calls and step ends (scheduler time).
        probe_rounds: rounds until no lookup answered RETRY any more (every
            key's presence known; promotions may still be in flight).
        probe_seconds: scheduler time of those rounds.
    """

    hits: list[int]
    rounds: int
    seconds: float
    probe_rounds: int = 0
    probe_seconds: float = 0.0


class SchedulerDriver:
    """Plays vLLM's scheduler and workers against a ``TieringOffloadingManager``.

    Args:
        manager: vLLM's ``TieringOffloadingManager`` (from :func:`vllm_manager`).
        step_sleep_s: pause between scheduler steps while waiting for I/O.
    """

    def __init__(self, manager: Any, step_sleep_s: float = 0.0005) -> None:
        self.manager = manager
        self.view = manager.primary_tier.get_kv_memoryview()
        self.row_bytes = int(self.view.strides[0])
        self.flat: memoryview = self.view.cast("B")
        self.step_sleep_s = step_sleep_s
        self._req = 0

    def close(self) -> None:
        """Release the driver's view of the primary region (before the manager shuts down)."""
        self.flat.release()

    def new_context(self, prefix: str = "req", kv_transfer_params: dict[str, Any] | None = None) -> Any:
        """A fresh vLLM ``ReqContext`` with ``kv_transfer_params`` (``{"tenant": "a"}``), known to the manager."""
        self._req += 1
        ctx = ReqContext(req_id=f"{prefix}-{self._req}", kv_transfer_params=kv_transfer_params)
        with manager_lock(self.manager):
            self.manager.on_new_request(ctx)
        return ctx

    def row(self, chunk_id: int) -> memoryview:
        """Primary row ``chunk_id`` as a flat writable memoryview."""
        start = int(chunk_id) * self.row_bytes
        return self.flat[start : start + self.row_bytes]

    def step(self, new_req_ids: Sequence[str] = ()) -> None:
        """End one scheduler step (``on_schedule_end``: poll jobs, flush promotions)."""
        with manager_lock(self.manager):
            self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=list(new_req_ids), preempted_req_ids=[]))

    def wait_idle(self, timeout_s: float = 60.0) -> int:
        """Step until the manager has no pending work; returns the number of steps.

        Raises:
            TimeoutError: work still pending after ``timeout_s`` (a job never reported).
        """
        deadline = time.monotonic() + timeout_s
        steps = 0
        while True:
            with manager_lock(self.manager):
                pending = self.manager.has_pending_work()
            if not pending:
                return steps
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM manager still has pending work after {timeout_s} s")
            self.step()
            steps += 1
            time.sleep(self.step_sleep_s)

    def store(
        self,
        requests: Sequence[Sequence[Key]],
        data: Callable[[Key], bytes],
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Store each request's keys GPU -> primary (bytes written in place of the DMA) -> cascade.

        One ``prepare_store``/``complete_store`` per request, so each request
        becomes one cascade job per secondary tier, as one scheduler step
        offloading that request's new chunks. Does not wait for the cascades.
        Every request carries ``kv_transfer_params``.

        Returns:
            The requests' contexts (finish them with :meth:`finish`).

        Raises:
            RuntimeError: the primary tier could not take the keys.
        """
        contexts = []
        for keys in requests:
            ctx = self.new_context("store", kv_transfer_params)
            with manager_lock(self.manager):
                out = self.manager.prepare_store(list(keys), ctx)
            if out is None:
                raise RuntimeError("primary tier full: prepare_store returned None")
            for key, chunk_id in zip(out.keys_to_store, out.store_spec.chunk_ids, strict=True):
                self.row(chunk_id)[:] = data(key)
            with manager_lock(self.manager):
                self.manager.complete_store(out.keys_to_store, ctx, True)
            contexts.append(ctx)
        return contexts

    def finish(self, contexts: Sequence[Any]) -> None:
        """``on_request_finished`` for each context."""
        with manager_lock(self.manager):
            for ctx in contexts:
                self.manager.on_request_finished(ctx)

    def lookup(
        self,
        requests: Sequence[Sequence[Key]],
        contexts: Sequence[Any],
        *,
        max_rounds: int = 100_000,
        timeout_s: float = 120.0,
    ) -> LookupOutcome:
        """Resolve every request's prefix the way the scheduler does: one pass per step.

        Each round looks every unresolved request's keys up in order, stopping
        at the first MISS; a request is resolved when all its keys are HIT or a
        MISS ends its prefix (RETRY and HIT_PENDING mean: ask next step).

        Raises:
            TimeoutError: not resolved within ``max_rounds`` / ``timeout_s``.
        """
        hits = [-1] * len(requests)
        rounds, seconds = 0, 0.0
        probe_rounds, probe_seconds = 0, 0.0
        deadline = time.monotonic() + timeout_s
        while any(h < 0 for h in hits):
            if rounds >= max_rounds or time.monotonic() > deadline:
                raise TimeoutError(f"lookups unresolved after {rounds} rounds")
            rounds += 1
            t0 = time.perf_counter()
            any_retry = False
            with manager_lock(self.manager):
                for i, (keys, ctx) in enumerate(zip(requests, contexts, strict=True)):
                    if hits[i] >= 0:
                        continue
                    found, waiting = 0, False
                    for key in keys:
                        result = self.manager.lookup(key, ctx)
                        if result is LookupResult.HIT:
                            found += 1
                            continue
                        if result is LookupResult.MISS:
                            break
                        waiting = True
                        any_retry = any_retry or result is LookupResult.RETRY
                    if not waiting:
                        hits[i] = found
            seconds += time.perf_counter() - t0
            if not any_retry and not probe_rounds:
                probe_rounds, probe_seconds = rounds, seconds
            if any(h < 0 for h in hits):
                t0 = time.perf_counter()
                self.step()
                seconds += time.perf_counter() - t0
                time.sleep(self.step_sleep_s)
        return LookupOutcome(hits, rounds, seconds, probe_rounds, probe_seconds)

    def read(self, keys: Sequence[Key], ctx: Any) -> list[bytes]:
        """Load HIT keys primary -> "GPU": ``prepare_load``, copy the rows out, ``complete_load``."""
        with manager_lock(self.manager):
            spec = self.manager.prepare_load(list(keys), ctx)
        rows = [self.row(chunk_id).tobytes() for chunk_id in spec.chunk_ids]
        with manager_lock(self.manager):
            self.manager.complete_load(list(keys), ctx)
        return rows

    def evict_all(self) -> None:
        """Empty the primary tier (vLLM's ``reset_cache``: drains every tier first) and zero it."""
        with manager_lock(self.manager):
            self.manager.reset_cache()
            if HAS_MANAGER_LOCK:  # vLLM >= 0.33
                self.manager.on_reset_flushed()
        zeros = bytes(self.row_bytes)
        for start in range(0, len(self.flat), self.row_bytes):
            self.flat[start : start + self.row_bytes] = zeros

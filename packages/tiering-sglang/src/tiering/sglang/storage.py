"""``TieringHiCacheStorage``: tiering's secondary tiers as SGLang's HiCache storage backend (L3).

SGLang (0.5.23) builds it from ``--hicache-storage-backend dynamic`` as
``TieringHiCacheStorage(storage_config, kwargs)``, then calls
``register_mem_pool_host(host_pool)``; the tiers are built then, once the
page geometry is known (:mod:`tiering.sglang.config` for the keys).

SGLang calls, each blocking, with up to 128 pages, from several threads:

- ``batch_exists(keys) -> int``: the leading run of pages some tier holds;
- ``batch_get_v1(keys, host_indices) -> list[bool]`` /
  ``batch_set_v1(...)`` (``interface_v1``: 1): pages move between the
  host pool's page buffers (``get_page_buffer_meta``) and the tiers through
  the staging buffer; a page whose bytes the tier cannot verify is False;
- ``get`` / ``set`` / ``batch_get`` / ``batch_set`` / ``exists``: flat page
  tensors, as SGLang's file backend takes them (without ``interface_v1``),
  or Mooncake's addresses and byte counts, up to a page each, under either
  setting (:mod:`tiering.sglang.targets`).

``clear()`` removes every page of this backend's namespace from every tier
and starts the tiers afresh; ``get_stats()`` gives SGLang's
``StorageMetrics`` (with ``enable_storage_metrics``).

Every answer SGLang expects as a list of bools is one, never None, even when
a tier raises (a TypeError on SGLang's storage thread would stop its L3 tier
without a word); no call raises, whatever it is given: a misuse (a stacked
tensor, a list of lists) is a failure (False, or None where SGLang reads
None as "nothing loaded") with one logged error. With MLA (KV replicated
across TP ranks) every rank shares one namespace: SGLang lets only its
storage writer (rank 0) back pages up, and a page some tier holds already
is never written again, whichever rank asks. A local root removed from
outside is noticed by the next call (:mod:`tiering.sglang.stack`).
Models with extra host pools (Mamba, SWA, indexer: SGLang's
``register_mem_host_pool_v2``) are refused at start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo
from tiering.core.base import OffloadKey
from tiering.core.inspection import inspector_for
from tiering.core.runtime.tiering_spec import TieringOffloadingSpec
from tiering.sglang.calls import CallGate, CallMetrics
from tiering.sglang.config import BackendConfig, Ranks, parse_extra_config, spec_config
from tiering.sglang.pages import PageGeometry, Staging, page_key
from tiering.sglang.stack import TierStack
from tiering.sglang.targets import answer_count, flat_pages, is_int

logger = logging.getLogger(__name__)

KV_POOL = "kv"
"""SGLang's name of the KV pool (``PoolName.KV``), the one pool this backend stores."""


class TieringHiCacheStorage(HiCacheStorage):  # type: ignore[misc]
    """An SGLang ``HiCacheStorage`` over tiering's secondary tiers (see the module doc).

    Args:
        storage_config: SGLang's ``HiCacheStorageConfig`` (ranks, MLA, model
            name, and ``extra_config``: the keys of :mod:`tiering.sglang.config`).
        kwargs: SGLang's extra keyword arguments of the dynamic factory (unused).

    Raises:
        ValueError: a bad extra config (the message names the key), or a
            setting this backend does not serve: decode context parallelism
            (``dcp_size`` > 1), split heads (``tp_lcm_size``).
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None) -> None:
        self.config: BackendConfig = parse_extra_config(storage_config.extra_config)
        if storage_config.dcp_size > 1:
            raise ValueError("tiering HiCache backend: decode context parallelism (dcp_size > 1) is not supported")
        if storage_config.should_split_heads:
            raise ValueError("tiering HiCache backend: split heads (tp_lcm_size) are not supported; remove tp_lcm_size")
        self.storage_config = storage_config
        self.ranks = Ranks(
            tp_rank=storage_config.tp_rank,
            tp_size=storage_config.tp_size,
            pp_rank=storage_config.pp_rank,
            pp_size=storage_config.pp_size,
            cp_rank=storage_config.attn_cp_rank,
            cp_size=storage_config.attn_cp_size,
            is_mla=storage_config.is_mla_model,
        )
        self.stack: TierStack | None = None
        self.spec: TieringOffloadingSpec | None = None
        self.geometry: PageGeometry | None = None
        self.page_size = 0
        self.refused: str | None = None
        self._gate = CallGate()
        self._metrics = CallMetrics() if storage_config.enable_storage_metrics else None

    # -- set-up -----------------------------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Take the host pool's page geometry and build the tiers over a staging buffer of its pages.

        Raises:
            ValueError: the pool has no KV buffer of its own, or its page meta
                is inconsistent; errors of building a tier propagate (named ``secondary_tiers[N]``).
        """
        super().register_mem_pool_host(mem_pool_host)
        if getattr(mem_pool_host, "kv_buffer", None) is None:
            raise ValueError(f"tiering HiCache backend: host pool {type(mem_pool_host).__name__} has no KV buffer")
        self.page_size = int(mem_pool_host.page_size)
        _, sizes = mem_pool_host.get_page_buffer_meta(torch.arange(self.page_size, dtype=torch.int64))
        self.geometry = PageGeometry.from_meta(sizes, 1)
        # SGLang's own host pools name their dtype; a pool honouring only the page contract has its buffer's.
        dtype = getattr(mem_pool_host, "dtype", None) or mem_pool_host.kv_buffer.dtype
        spec = TieringOffloadingSpec(
            spec_config(
                self.config,
                self.ranks,
                model=self.storage_config.model_name,
                dtype=str(dtype).removeprefix("torch."),
                layout=str(mem_pool_host.layout),
                page_size=self.page_size,
                page_bytes=self.geometry.page_bytes,
            )
        )
        self.spec = spec
        self.stack = self._build_stack(spec)
        logger.info(
            "tiering HiCache backend: %d tier(s) (%s), pages of %d bytes, %d staging slots, namespace %s (%s)",
            len(self.stack.tiers),
            ", ".join(t.tier_type for t in self.stack.tiers),
            self.geometry.page_bytes,
            self.stack.staging.slots,
            spec.namespace.digest,
            spec.namespace.kv_layout,
        )

    def _build_stack(self, spec: TieringOffloadingSpec) -> TierStack:
        """The tiers of ``spec`` over a new staging buffer of its pages."""
        assert self.geometry is not None
        staging = Staging(spec.num_primary_blocks, self.geometry.page_bytes)
        return TierStack(spec.create_secondary_tiers(staging.view), staging, self.config.timeout_s)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Accept SGLang's KV pool again; refuse any extra pool (hybrid models), which this backend would store half of.

        Raises:
            ValueError: a pool other than the KV pool registered at start; the
                backend then answers every call as a miss / failure.
        """
        if str(host_pool_name) == KV_POOL and host_pool is getattr(self, "mem_pool_host", None):
            super().register_mem_host_pool_v2(host_pool, host_pool_name)
            return
        self.refused = (
            f"tiering HiCache backend: extra host pool {str(host_pool_name)!r} ({type(host_pool).__name__}) "
            "of a hybrid model is not supported; use a plain KV-cache model or another storage backend"
        )
        raise ValueError(self.refused)

    def _ready(self, what: str, interface_v1: bool) -> TierStack | None:
        """The tier stack when calls of this interface may run, else None (logged)."""
        if self.refused is not None:
            logger.error("%s refused: %s", what, self.refused)
            return None
        if self.stack is None:
            logger.error("%s before register_mem_pool_host; answered as a failure", what)
            return None
        if interface_v1 != self.config.interface_v1:
            # One byte order per namespace: flat pages and page buffers order a layer_first page differently.
            logger.error("%s called but the extra config sets interface_v1=%d", what, int(self.config.interface_v1))
            return None
        return self.stack

    # -- zero-copy interface ----------------------------------------------------------------------
    def batch_exists(self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """The number of leading ``keys`` some tier holds (0 on any error)."""
        with self._gate.call():
            stack = self.stack if self.refused is None else None
            try:
                if stack is None or len(keys) == 0:
                    return 0
                return stack.leading_run([page_key(k) for k in keys])
            except Exception:
                logger.exception("tiering batch_exists failed; answered 0")
                return 0

    def exists(self, key: str) -> bool:
        """Whether some tier holds ``key``."""
        return self.batch_exists([key]) == 1

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: HiCacheStorageExtraInfo | None = None
    ) -> list[bool]:
        """Load ``keys`` into the host pool pages at ``host_indices`` (``page_size`` token indices per key).

        Returns:
            Per key, True when its page was read and verified into the host pool.
        """
        with self._gate.call():
            stack = self._ready("batch_get_v1", True)
            if stack is None:
                return [False] * answer_count(keys)
            return self._pages(stack, keys, host_indices, load=True)

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: HiCacheStorageExtraInfo | None = None
    ) -> list[bool]:
        """Store the host pool pages at ``host_indices`` under ``keys``.

        Returns:
            Per key, True when some tier holds the page afterwards (a page held already is not
            written again: with MLA every rank shares the pages, whichever rank wrote them).
        """
        with self._gate.call():
            stack = self._ready("batch_set_v1", True)
            if stack is None:
                return [False] * answer_count(keys)
            return self._pages(stack, keys, host_indices, load=False)

    def _pages(self, stack: TierStack, keys: list[str], host_indices: torch.Tensor, *, load: bool) -> list[bool]:
        """Move the pages at ``host_indices`` between the host pool and the tiers; per key whether it moved."""
        assert self.geometry is not None
        try:
            if len(host_indices) != len(keys) * self.page_size:
                raise ValueError(f"{len(host_indices)} host indices for {len(keys)} pages of {self.page_size} tokens")
            pointers, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
            pages = self.geometry.segments(pointers, sizes, len(keys))
            return self._run(stack, [page_key(k) for k in keys], pages, load)
        except Exception:
            logger.exception("tiering %s of %d pages failed", "load" if load else "store", answer_count(keys))
            return [False] * answer_count(keys)

    def _run(
        self, stack: TierStack, keys: Sequence[OffloadKey], pages: list[list[tuple[int, int]]], load: bool
    ) -> list[bool]:
        """:meth:`_chunk` over chunks of at most all staging slots (recorded for :meth:`get_stats`)."""
        ok: list[bool] = []
        chunk = stack.staging.slots
        started = time.perf_counter()
        for start in range(0, len(keys), chunk):
            ok.extend(self._chunk(stack, keys[start : start + chunk], pages[start : start + chunk], load))
        if self._metrics is not None and self.geometry is not None:
            moved = sum(ok) * self.geometry.page_bytes
            self._metrics.record(load=load, pages=len(keys), moved_bytes=moved, seconds=time.perf_counter() - started)
        return ok

    def _chunk(
        self, stack: TierStack, keys: Sequence[OffloadKey], pages: list[list[tuple[int, int]]], load: bool
    ) -> list[bool]:
        slots = stack.staging.acquire(len(keys), stack.timeout_s)
        owned = True
        try:
            if load:
                loaded, owned = stack.load(keys, slots)
                return [
                    good and owned and stack.staging.scatter(slot, segments)
                    for slot, segments, good in zip(slots, pages, loaded, strict=True)
                ]
            for slot, segments in zip(slots, pages, strict=True):
                stack.staging.gather(slot, segments)
            stored, owned = stack.store(keys, slots)
            return stored
        finally:
            if owned:
                stack.staging.release(slots)

    # -- flat-page interface ----------------------------------------------------------------------
    def _flat(
        self, what: str, load: bool, keys: Any, tensors: Any = None, locations: Any = None, sizes: Any = None
    ) -> list[bool] | None:
        """Move flat pages (page tensors, or addresses and sizes) to or from the tiers.

        Returns:
            Per key whether it moved; None for a call SGLang's interfaces do not allow
            (:func:`~tiering.sglang.targets.flat_pages`; one error logged).
        """
        with self._gate.call():
            stack, geometry = self.stack, self.geometry
            if self.refused is not None or stack is None or geometry is None:
                self._ready(what, self.config.interface_v1)  # logs why
                return [False] * answer_count(keys)
            try:
                call = flat_pages(what, keys, tensors, locations, sizes, geometry.page_bytes)
            except ValueError as exc:
                logger.error("tiering %s refused: %s", what, exc)
                return None
            # Addresses carry bytes the backend does not interpret: either interface takes them.
            if self._ready(what, self.config.interface_v1 if call.addresses else False) is None:
                return [False] * len(call.keys)
            try:
                return self._run(stack, [page_key(k) for k in call.keys], [[page] for page in call.pages], load)
            except Exception:
                logger.exception("tiering %s of %d pages failed", what, len(call.keys))
                return [False] * len(call.keys)

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """Read ``key`` into ``target_location``: a page tensor, or an address of ``target_sizes`` bytes.

        Returns:
            For a tensor target, the tensor, or None when the page is absent or
            unverified; for an address target, True or False.
        """
        if is_int(target_location):
            ok = self._flat("get", True, [key], locations=[target_location], sizes=[target_sizes])
            return bool(ok and ok[0])
        ok = self._flat("get", True, [key], tensors=[target_location])
        return target_location if ok and ok[0] else None

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> Any:
        """:meth:`get` for each key: a list of tensors (None where absent), or for address targets the leading run.

        None for a call SGLang's interfaces do not allow (a stacked tensor, a list of lists; logged).
        """
        first = target_locations[0] if isinstance(target_locations, (list, tuple)) and target_locations else None
        if target_sizes is not None or is_int(first):
            ok = self._flat("batch_get", True, keys, locations=target_locations, sizes=target_sizes)
            return None if ok is None else next((i for i, good in enumerate(ok) if not good), len(ok))
        ok = self._flat("batch_get", True, keys, tensors=target_locations)
        return None if ok is None else [loc if good else None for loc, good in zip(target_locations, ok, strict=True)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        """Store ``value`` (a flat page tensor), or the ``target_sizes`` bytes at address ``target_location``."""
        if value is None and is_int(target_location):
            return self.batch_set([key], None, [target_location], [target_sizes])
        return self.batch_set([key], [value])

    def batch_set(
        self, keys: list[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        """Store flat pages (tensors, or addresses and sizes) under ``keys``; True when some tier holds every one.

        False, with one logged error, for a call SGLang's interfaces do not allow.
        """
        if values is None and target_locations is not None:
            ok = self._flat("batch_set", False, keys, locations=target_locations, sizes=target_sizes)
        else:
            if isinstance(values, (list, tuple)):  # a page made contiguous is a copy, held until the call ends
                values = [v.contiguous() if isinstance(v, torch.Tensor) else v for v in values]
            ok = self._flat("batch_set", False, keys, tensors=values)
        return ok is not None and all(ok)

    # -- lifecycle --------------------------------------------------------------------------------
    def clear(self) -> bool:
        """Remove every page of this backend's namespace from every tier, then start the tiers afresh.

        SGLang calls it to flush its storage tier; calls running finish
        first, new ones wait. Other namespaces (models, ranks, engines)
        stay. With MLA only rank 0 removes pages (the ranks share its
        namespace); every rank restarts its tiers, so none answers from a
        stale index. A tier without an inspector keeps nothing across a
        restart: the restart empties it.

        Returns:
            True when every tier's namespace was removed and the tiers
            restarted; False (logged) otherwise, or before
            ``register_mem_pool_host``, after ``close``, or for a refused hybrid model.
        """
        if self.spec is None or self.refused is not None:
            logger.error(
                "tiering HiCache backend: clear before register_mem_pool_host, after close or on a refused model"
            )
            return False
        with self._gate.exclusive():
            stack, self.stack = self.stack, None
            if stack is not None:
                stack.shutdown()
            ok, removed = True, 0
            for index, entry in enumerate(self.config.tiering["secondary_tiers"] if self.ranks.writer else ()):
                try:
                    inspector = inspector_for(entry, index)
                    removed += inspector.remove_namespace(self.spec.namespace.digest) if inspector else 0
                except Exception:
                    logger.exception("tiering HiCache backend: clearing secondary_tiers[%d] failed", index)
                    ok = False
            try:
                self.stack = self._build_stack(self.spec)
            except Exception:
                logger.exception("tiering HiCache backend: restarting the tiers after clear failed; calls now fail")
                return False
        logger.info("tiering HiCache backend: cleared %d page(s) of namespace %s", removed, self.spec.namespace.digest)
        return ok

    def get_stats(self) -> Any:
        """SGLang's ``StorageMetrics`` of the calls since the last one (see :meth:`CallMetrics.take`).

        None without ``enable_storage_metrics`` (SGLang then never asks).
        """
        return self._metrics.take() if self._metrics is not None else None

    def close(self) -> None:
        """Shut the tiers down (SGLang calls this when it detaches the backend)."""
        with self._gate.exclusive():
            stack, self.stack, self.spec = self.stack, None, None  # no clear brings the tiers back
        if stack is not None:
            stack.shutdown()


__all__ = ["TieringHiCacheStorage"]

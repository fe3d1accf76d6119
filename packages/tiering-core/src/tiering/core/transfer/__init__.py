"""The transfer path: KV blocks between an engine's device KV cache and the primary tier's host buffer.

The package is split so that what needs no torch never imports it:

=========================================  =====  ==================================================
module                                     torch  owns
=========================================  =====  ==================================================
:mod:`~tiering.core.transfer.layout`       no     device layouts, the slot byte layout (``kv_layout``)
:mod:`~tiering.core.transfer.plan`         no     copy planning: sorting, coalesced runs, chunks, id checks
:mod:`~tiering.core.transfer.geometry`     yes    :class:`KVCacheGeometry` of per-layer KV tensors
:mod:`~tiering.core.transfer.host`         yes    the pinned host buffer (:func:`allocate_host_buffer`)
:mod:`~tiering.core.transfer.handler`      yes    :class:`TransferHandler`: the copies themselves
=========================================  =====  ==================================================

``import tiering.core.transfer`` and the torch-free names work without torch;
the torch names (:class:`TransferHandler`, :class:`KVCacheGeometry`,
:class:`HostBuffer`, :func:`kv_geometry`, :func:`allocate_host_buffer`,
:func:`host_tensor`) import their module on first use, and without torch
raise ImportError naming the extra to install (``pip install 'tiering-core[torch]'``).
The driver that ties the copies to the standalone manager is the runtime's
(:mod:`tiering.core.runtime.driver`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tiering.core.transfer.layout import SLOT_LAYOUT, KVLayout, detect_layout, slot_layout
from tiering.core.transfer.plan import DEFAULT_STAGING_BYTES, CopyPlan, plan_copies

if TYPE_CHECKING:
    from tiering.core.transfer.geometry import KVCacheGeometry, kv_geometry
    from tiering.core.transfer.handler import TransferHandler
    from tiering.core.transfer.host import HostBuffer, allocate_host_buffer, host_tensor

_HOST = frozenset({"HostBuffer", "allocate_host_buffer", "host_tensor"})
_GEOMETRY = frozenset({"KVCacheGeometry", "kv_geometry"})


def __getattr__(name: str) -> Any:
    """Import a torch name's module on first use (PEP 562).

    Raises:
        ImportError: torch is not installed (the message names the extra).
        AttributeError: ``name`` is not a name of this package.
    """
    if name in _HOST:
        from tiering.core.transfer import host

        value = getattr(host, name)
    elif name in _GEOMETRY:
        from tiering.core.transfer import geometry

        value = getattr(geometry, name)
    elif name == "TransferHandler":
        from tiering.core.transfer import handler

        value = handler.TransferHandler
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "DEFAULT_STAGING_BYTES",
    "SLOT_LAYOUT",
    "CopyPlan",
    "HostBuffer",
    "KVCacheGeometry",
    "KVLayout",
    "TransferHandler",
    "allocate_host_buffer",
    "detect_layout",
    "host_tensor",
    "kv_geometry",
    "plan_copies",
    "slot_layout",
]

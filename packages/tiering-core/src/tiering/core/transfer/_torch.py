"""The one place the transfer path imports torch, so its absence gives one install hint.

Modules that need torch import it as ``from tiering.core.transfer._torch import torch``;
the torch-free modules (:mod:`~tiering.core.transfer.layout`,
:mod:`~tiering.core.transfer.plan`, :mod:`~tiering.core.runtime.driver`) never do.
"""

from __future__ import annotations

TORCH_HINT = "tiering.core.transfer needs torch; install it with: pip install 'tiering-core[torch]'"
"""The message of the ImportError raised when torch is missing."""

try:
    import torch as torch
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(TORCH_HINT) from exc

__all__ = ["TORCH_HINT", "torch"]

"""Old import paths of modules that moved: each keeps working for one release, with a DeprecationWarning.

A shim module at the old path calls :func:`alias` with its own ``__name__``;
the module object at the new path then stands in for it (``sys.modules`` of
the old name points at the new module, so there is one module and one set of
classes, never two copies). When the new path belongs to a distribution that
is not installed, the ImportError names the distribution to install.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType


def alias(old: str, new: str, distribution: str) -> ModuleType:
    """Import ``new`` and register it under ``old`` too, warning once that ``old`` is deprecated.

    Args:
        old: the deprecated dotted module name (the shim's ``__name__``).
        new: the dotted module name the code lives at now.
        distribution: the distribution that provides ``new`` (``"tiering-sglang"``).

    Returns:
        The module at ``new``.

    Raises:
        ImportError: ``new`` cannot be imported (its distribution is missing: the message names it).
    """
    warnings.warn(
        f"{old} moved to {new} (distribution {distribution}); the old path is removed in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    try:
        module = importlib.import_module(new)
    except ModuleNotFoundError as exc:
        raise ImportError(f"{old} moved to {new}: pip install {distribution}") from exc
    sys.modules[old] = module
    return module

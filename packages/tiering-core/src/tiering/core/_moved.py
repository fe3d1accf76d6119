"""Old import paths of modules that moved: each keeps working for one release, with a DeprecationWarning.

A shim module at the old path calls :func:`alias` with its own ``__name__``;
the module object at the new path then stands in for it (``sys.modules`` of
the old name points at the new module, so there is one module and one set of
classes, never two copies). A shim package calls :func:`forward` instead: it
stays a package of its own (so its shim submodules, not the new package's
files, answer ``import old.sub``) and hands every other name to the new
package. When the new path belongs to a distribution that is not installed,
the ImportError names the distribution to install.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any


def _warn_and_import(old: str, new: str, distribution: str) -> ModuleType:
    warnings.warn(
        f"{old} moved to {new} (distribution {distribution}); the old path is removed in the next release",
        DeprecationWarning,
        stacklevel=4,
    )
    try:
        return importlib.import_module(new)
    except ModuleNotFoundError as exc:
        if exc.name is None or not new.startswith(exc.name):
            raise  # the new module is there; something it imports (the engine itself) is not
        raise ImportError(f"{old} moved to {new}: pip install {distribution}") from exc


def forward(old: str, new: str, distribution: str) -> Callable[[str], Any]:
    """Warn that package ``old`` moved, and return its module ``__getattr__``: names come from package ``new``.

    Raises:
        ImportError: ``new`` cannot be imported (its distribution is missing: the message names it).
    """
    module = _warn_and_import(old, new, distribution)

    def __getattr__(name: str) -> Any:
        return getattr(module, name)

    return __getattr__


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
    module = _warn_and_import(old, new, distribution)
    sys.modules[old] = module
    return module

"""Name -> class resolution, in one place: the registries of tiers, cache policies and specs.

Every class a config names is resolved here (as in vLLM's ``kv_offload``
factories and fsspec's ``registry``), by one :class:`Registry` mechanism with
three users:

- :data:`SecondaryTierFactory`: secondary tiers (``type`` / ``module_path``),
  entry-point group ``tiering.tiers``;
- :data:`CachePolicyFactory`: primary-tier eviction policies
  (``eviction_policy`` / ``cache_policy_module_path``), group ``tiering.cache_policies``;
- :data:`OffloadingSpecFactory`: specs (``spec_name`` / ``spec_module_path``),
  group ``tiering.specs``.

Resolution order: names registered in-process (:meth:`Registry.register`,
imported lazily on first use) -> installed entry points -> ``module_path``
from the config (import the module, take the attribute named by the name).
The resolved object must be a subclass of the registry's base class (a
``TypeError`` otherwise). What is surprising is logged once: loading code
by ``module_path`` at all, a name two installed distributions provide, an
entry point hidden by a registered name, and a ``module_path`` ignored
because the name resolves without it.

This module imports none of the classes it resolves, not even the base
classes: each is named by import path and imported on first resolution, so
any module (the spec included) can use the registries without an import
cycle. Building an instance from its config entry is :mod:`tiering.core.factory`'s job.

Loading code named by a config file is a trust boundary: whoever writes the
config runs code in the engine process.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import re
import threading
from collections.abc import Hashable, Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

if TYPE_CHECKING:
    from tiering.core.base import SecondaryTierManager
    from tiering.core.primary.policy import CachePolicy
    from tiering.core.spec import OffloadingSpec

logger = logging.getLogger(__name__)

T = TypeVar("T")

OUT_OF_TREE_WARNING = (
    "Loading classes by module_path from the config is an experimental API: "
    "the loaded code runs inside this process with its full privileges."
)
_warned: set[Hashable] = set()
_warn_lock = threading.Lock()


def warn_once(key: Hashable, message: str, *args: Any) -> None:
    """Log ``message % args`` as a warning the first time ``key`` is seen in this process, never again."""
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    logger.warning(message, *args)


def closest_name(word: str, choices: Iterable[str]) -> str | None:
    """The choice a misspelled ``word`` most likely meant: same letters in another case first, else ``difflib``'s.

    ``"LRU"`` -> ``"lru"``, ``"secondary_tier"`` -> ``"secondary_tiers"``; None when nothing is close.
    """
    names = list(choices)
    folded = [n for n in names if n.casefold() == word.casefold()]
    if folded:
        return folded[0]
    by_fold = {n.casefold(): n for n in names}
    match = difflib.get_close_matches(word.casefold(), list(by_fold), 1)
    return by_fold[match[0]] if match else None


def import_module_path(module_path: str, kind: str, key: str = "module_path") -> Any:
    """Import ``module_path``; the error names the config key and the path.

    Args:
        module_path: the dotted module name.
        kind: what is loaded, for messages (``"secondary tier"``).
        key: where the name comes from, for messages (``"spec_module_path"``).

    Raises:
        ImportError: the module (or one it imports) cannot be imported; when
            the module itself is not found, the message says that its
            directory must be on the import path (``PYTHONPATH``).
    """
    try:
        return importlib.import_module(module_path)
    except ImportError as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name and module_path.startswith(exc.name):
            hint = (
                f"; the directory holding {exc.name!r} must be on Python's import path: set PYTHONPATH to it "
                "(e.g. PYTHONPATH=. when it is in the current directory; the config file's directory is not searched)"
            )
        raise ImportError(f"cannot import {kind} {key} {module_path!r}: {exc}{hint}") from exc


_DISTRIBUTION_SUFFIX = re.compile(r"[a-z0-9][a-z0-9-]*")


def _provider(ep: EntryPoint) -> str:
    return f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "an unknown distribution"


class Registry(Generic[T]):
    """A name -> class registry with lazy imports, entry points and ``module_path``.

    Args:
        kind: what is registered, for messages (``"secondary tier"``).
        base: the class every resolved class must subclass, or its import
            path ``"module:Class"`` (imported on the first resolution).
        group: the entry-point group of installed providers.
        name_key: the config key holding the name (for messages).
        path_key: the config key holding the out-of-tree module path.
        distribution: the naming convention of the distributions that
            provide first-party names, e.g. ``"tiering-{name}"``: an unknown
            name without a close match gets the ``pip install`` line to try
            (core knows no backend by name; the convention names them all).
    """

    def __init__(
        self,
        kind: str,
        base: type[Any] | str,
        group: str,
        name_key: str,
        path_key: str,
        distribution: str | None = None,
    ) -> None:
        self.kind = kind
        self._base = base
        self.group = group
        self.name_key = name_key
        self.path_key = path_key
        self.distribution = distribution
        self._lazy: dict[str, tuple[str, str]] = {}
        self._loaded: dict[str, type[T]] = {}
        self._lock = threading.Lock()

    @property
    def base(self) -> type[Any]:
        """The base class (imported now when it was given by import path)."""
        if isinstance(self._base, str):
            module, _, attr = self._base.partition(":")
            self._base = cast("type[Any]", getattr(importlib.import_module(module), attr))
        return self._base

    def register(self, name: str, module_path: str, class_name: str) -> None:
        """Register ``module_path.class_name`` under ``name``; nothing is imported now.

        Raises:
            ValueError: ``name`` is already registered.
        """
        with self._lock:
            if name in self._lazy:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._lazy[name][0]})")
            self._lazy[name] = (module_path, class_name)

    def entry_points(self) -> dict[str, EntryPoint]:
        """Installed entry points of :attr:`group`, by name.

        When two distributions provide one name, the first found is used and
        a warning (once) names both.
        """
        found: dict[str, EntryPoint] = {}
        for ep in entry_points(group=self.group):
            first = found.setdefault(ep.name, ep)
            if first is not ep and first.value != ep.value:
                warn_once(
                    (self.group, ep.name, "duplicate"),
                    "%s %r is provided by two installed distributions: %s (%r, used) and %s (%r, ignored)",
                    self.kind,
                    ep.name,
                    _provider(first),
                    first.value,
                    _provider(ep),
                    ep.value,
                )
        return found

    def known_names(self) -> list[str]:
        """Names resolvable without ``module_path``: registered and installed."""
        return sorted(set(self._lazy) | set(self.entry_points()))

    def provider(self, name: str) -> str | None:
        """``"<distribution> <version>"`` of the package providing ``name``, when installed."""
        ep = self.entry_points().get(name)
        if ep is None or ep.dist is None:
            return None
        return _provider(ep)

    def _check(self, obj: Any, name: str, origin: str) -> type[T]:
        # A real TypeError: an assert would vanish under ``python -O``.
        base = self.base
        if not (isinstance(obj, type) and issubclass(obj, base)):
            raise TypeError(
                f"{self.kind} {name!r} from {origin} is {obj!r}, "
                f"which is not a subclass of {base.__module__}.{base.__qualname__}"
            )
        return cast("type[T]", obj)

    def _load(self, name: str) -> type[T] | None:
        """The class registered or installed under ``name`` (cached), None when neither knows it."""
        if name in self._loaded:
            return self._loaded[name]
        ep = self.entry_points().get(name)
        if name in self._lazy:
            mod, attr = self._lazy[name]
            if ep is not None and ep.value != f"{mod}:{attr}":
                warn_once(
                    (self.group, name, "shadowed"),
                    "%s %r is registered in-process as %s:%s; the installed entry point %r of %s is not used",
                    self.kind,
                    name,
                    mod,
                    attr,
                    ep.value,
                    _provider(ep),
                )
            cls = self._check(getattr(import_module_path(mod, self.kind, "registered module"), attr), name, mod)
        elif ep is not None:
            try:
                obj = ep.load()
            except ImportError as exc:
                raise ImportError(f"cannot load {self.kind} {name!r} from entry point {ep.value!r}: {exc}") from exc
            cls = self._check(obj, name, f"entry point {ep.value!r}")
        else:
            return None
        self._loaded[name] = cls
        return cls

    def get_class(self, name: str, module_path: str | None = None) -> type[T]:
        """Resolve ``name`` to a class (see the module doc for the order).

        A ``module_path`` given with a name that is registered or installed
        is not imported; a warning (once) says so.

        Raises:
            ValueError: ``name`` is unknown and no ``module_path`` is given;
                the message lists the known names and the package to install.
            ImportError: the registered module, entry point or
                ``module_path`` cannot be imported; the message names it.
            AttributeError: ``module_path`` has no attribute ``name``.
            TypeError: the resolved object is not a subclass of :attr:`base`.
        """
        cls = self._load(name)
        if cls is not None:
            if module_path is not None:
                warn_once(
                    (self.group, name, module_path),
                    "%s %r resolves to %s; %s %r is not imported (give the out-of-tree class another name)",
                    self.kind,
                    name,
                    self.source(name),
                    self.path_key,
                    module_path,
                )
            return cls
        if module_path is None:
            raise ValueError(self._unknown_message(name))
        warn_once("module_path", OUT_OF_TREE_WARNING)
        logger.info("loading %s %r from module_path %r", self.kind, name, module_path)
        module = import_module_path(module_path, self.kind, self.path_key)
        if not hasattr(module, name):
            raise AttributeError(
                f"{self.kind} module_path {module_path!r} has no attribute {name!r} "
                f"(the {self.name_key!r} value names the class)"
            )
        return self._check(getattr(module, name), name, module_path)

    def source(self, name: str, module_path: str | None = None) -> str:
        """Where ``name`` resolves from, for messages: ``"spec_module_path 'my_specs'"``, an entry point, a module.

        Follows the resolution order of :meth:`get_class` without importing anything.
        """
        if name in self._lazy:
            return f"module {self._lazy[name][0]!r}"
        if (ep := self.entry_points().get(name)) is not None:
            return f"entry point {ep.value!r}"
        return f"{self.path_key} {module_path!r}"

    def suggestion(self, name: str) -> str | None:
        """The known name closest to a misspelled ``name`` (:func:`closest_name`), or None."""
        return closest_name(name, self.known_names())

    def _unknown_message(self, name: str) -> str:
        known = ", ".join(map(repr, self.known_names())) or "none"
        close = self.suggestion(name)
        hint = f" (did you mean {close!r}?)" if close else ""
        message = f"unknown {self.kind} {self.name_key} {name!r}{hint}; known: {known}."
        if self.distribution and not close and _DISTRIBUTION_SUFFIX.fullmatch(name) and not name.startswith("tiering"):
            dist = self.distribution.format(name=name)
            message += (
                f" If {name!r} is a {self.kind} of the tiering project, install its distribution: "
                f"pip install {dist} (from a clone of the repository: pip install ./packages/{dist})."
            )
        if name.startswith("tiering_"):
            plain = name.removeprefix("tiering_")
            message += (
                f" {name!r} is the vLLM binding's name of tier {plain!r}: inside vLLM it goes with"
                f' "module_path": "tiering.core.vllm.tiers"; standalone, write "type": {plain!r}.'
            )
        return (
            message + f" An out-of-tree class loads with {self.path_key!r}: the module to import, "
            f"whose attribute named {name!r} is the class."
        )


SecondaryTierFactory: Registry[SecondaryTierManager] = Registry(
    "secondary tier",
    "tiering.core.base:SecondaryTierManager",
    group="tiering.tiers",
    name_key="type",
    path_key="module_path",
    distribution="tiering-{name}",
)
"""Secondary tiers: ``type`` / ``module_path``, entry-point group ``tiering.tiers``."""

CachePolicyFactory: Registry[CachePolicy] = Registry(
    "cache policy",
    "tiering.core.primary.policy:CachePolicy",
    group="tiering.cache_policies",
    name_key="eviction_policy",
    path_key="cache_policy_module_path",
)
"""Primary-tier eviction policies: ``eviction_policy`` / ``cache_policy_module_path``."""
CachePolicyFactory.register("lru", "tiering.core.primary.policy", "LRUCachePolicy")
CachePolicyFactory.register("arc", "tiering.core.primary.policy", "ARCCachePolicy")

OffloadingSpecFactory: Registry[OffloadingSpec] = Registry(
    "offloading spec",
    "tiering.core.spec:OffloadingSpec",
    group="tiering.specs",
    name_key="spec_name",
    path_key="spec_module_path",
)
"""Offloading specs: ``spec_name`` / ``spec_module_path``, entry-point group ``tiering.specs``."""
OffloadingSpecFactory.register("TieringOffloadingSpec", "tiering.core.runtime.tiering_spec", "TieringOffloadingSpec")
OffloadingSpecFactory.register("OffloadingSpec", "tiering.core.spec", "OffloadingSpec")

FIRST_PARTY_SPECS = frozenset({"TieringOffloadingSpec", "OffloadingSpec"})
"""The specs tiering-core registers (their errors name their keys already)."""


def register_tier(name: str, module_path: str, class_name: str) -> None:
    """Register a secondary tier class by import path, imported on first use.

    Raises:
        ValueError: ``name`` is already registered.
    """
    SecondaryTierFactory.register(name, module_path, class_name)


__all__ = [
    "FIRST_PARTY_SPECS",
    "OUT_OF_TREE_WARNING",
    "CachePolicyFactory",
    "OffloadingSpecFactory",
    "Registry",
    "SecondaryTierFactory",
    "closest_name",
    "import_module_path",
    "register_tier",
    "warn_once",
]

"""Factories: resolve a configured name to a class, build tiers from config.

One :class:`Registry` mechanism serves three users, as in vLLM's
``kv_offload`` factories and fsspec's ``registry``:

- :data:`SecondaryTierFactory`: secondary tiers (``type`` / ``module_path``),
  entry-point group ``tiering.tiers``;
- :data:`CachePolicyFactory`: primary-tier eviction policies
  (``eviction_policy`` / ``cache_policy_module_path``), group ``tiering.cache_policies``;
- :data:`OffloadingSpecFactory`: specs (``spec_name`` / ``spec_module_path``),
  group ``tiering.specs``.

Resolution order: names registered in-process (:meth:`Registry.register`,
imported lazily on first use) -> installed entry points -> ``module_path``
from the config (import the module, take the attribute named by the name).

Loading code named by a config file is a trust boundary: whoever writes the
config runs code in the engine process.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from tiering.core.base import SecondaryTierManager
from tiering.core.primary.policy import CachePolicy

if TYPE_CHECKING:
    from tiering.core.spec import OffloadingSpec

logger = logging.getLogger(__name__)

T = TypeVar("T")

OUT_OF_TREE_WARNING = (
    "Loading classes by module_path from the config is an experimental API: "
    "the loaded code runs inside this process with its full privileges."
)
_warned_out_of_tree = False
_warn_lock = threading.Lock()


def _warn_out_of_tree(kind: str, name: str, module_path: str) -> None:
    global _warned_out_of_tree
    with _warn_lock:
        if not _warned_out_of_tree:
            _warned_out_of_tree = True
            logger.warning(OUT_OF_TREE_WARNING)
    logger.info("loading %s %r from module_path %r", kind, name, module_path)


def import_module_path(module_path: str, kind: str) -> Any:
    """Import ``module_path``; the error names the path.

    Raises:
        ImportError: the module (or one it imports) cannot be imported.
    """
    try:
        return importlib.import_module(module_path)
    except ImportError as exc:
        raise ImportError(f"cannot import {kind} module_path {module_path!r}: {exc}") from exc


class Registry(Generic[T]):
    """A name -> class registry with lazy imports, entry points and ``module_path``.

    Args:
        kind: what is registered, for messages (``"secondary tier"``).
        base: the class every resolved class must subclass.
        group: the entry-point group of installed providers.
        name_key: the config key holding the name (for messages).
        path_key: the config key holding the out-of-tree module path.
        install_hints: name -> distribution that provides it, for the error
            when it is not installed.
    """

    def __init__(
        self,
        kind: str,
        base: type[Any],
        group: str,
        name_key: str,
        path_key: str,
        install_hints: Mapping[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.base = base
        self.group = group
        self.name_key = name_key
        self.path_key = path_key
        self.install_hints = dict(install_hints or {})
        self._lazy: dict[str, tuple[str, str]] = {}
        self._loaded: dict[str, type[T]] = {}
        self._lock = threading.Lock()

    def register(self, name: str, module_path: str, class_name: str) -> None:
        """Register ``module_path.class_name`` under ``name``; nothing is imported now.

        Raises:
            ValueError: ``name`` is already registered.
        """
        with self._lock:
            if name in self._lazy:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._lazy[name][0]})")
            self._lazy[name] = (module_path, class_name)

    def entry_points(self) -> dict[str, Any]:
        """Installed entry points of :attr:`group`, by name (first distribution wins)."""
        found: dict[str, Any] = {}
        for ep in entry_points(group=self.group):
            found.setdefault(ep.name, ep)
        return found

    def known_names(self) -> list[str]:
        """Names resolvable without ``module_path``: registered and installed."""
        return sorted(set(self._lazy) | set(self.entry_points()))

    def provider(self, name: str) -> str | None:
        """``"<distribution> <version>"`` of the package providing ``name``, when installed."""
        ep = self.entry_points().get(name)
        if ep is None or ep.dist is None:
            return None
        return f"{ep.dist.name} {ep.dist.version}"

    def _check(self, obj: Any, name: str, origin: str) -> type[T]:
        # A real TypeError: an assert would vanish under ``python -O``.
        if not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise TypeError(
                f"{self.kind} {name!r} from {origin} is {obj!r}, "
                f"which is not a subclass of {self.base.__module__}.{self.base.__qualname__}"
            )
        return cast("type[T]", obj)

    def get_class(self, name: str, module_path: str | None = None) -> type[T]:
        """Resolve ``name`` to a class.

        Raises:
            ValueError: ``name`` is unknown and no ``module_path`` is given;
                the message lists the known names and the package to install.
            ImportError: the registered module, entry point or
                ``module_path`` cannot be imported; the message names it.
            AttributeError: ``module_path`` has no attribute ``name``.
            TypeError: the resolved object is not a subclass of :attr:`base`.
        """
        if name in self._loaded:
            return self._loaded[name]
        if name in self._lazy:
            mod, attr = self._lazy[name]
            cls = self._check(getattr(import_module_path(mod, self.kind), attr), name, mod)
        elif (ep := self.entry_points().get(name)) is not None:
            try:
                obj = ep.load()
            except ImportError as exc:
                raise ImportError(f"cannot load {self.kind} {name!r} from entry point {ep.value!r}: {exc}") from exc
            cls = self._check(obj, name, f"entry point {ep.value!r}")
        elif module_path is not None:
            _warn_out_of_tree(self.kind, name, module_path)
            module = import_module_path(module_path, self.kind)
            if not hasattr(module, name):
                raise AttributeError(
                    f"{self.kind} module_path {module_path!r} has no attribute {name!r} "
                    f"(the {self.name_key!r} value names the class)"
                )
            return self._check(getattr(module, name), name, module_path)
        else:
            raise ValueError(self._unknown_message(name))
        self._loaded[name] = cls
        return cls

    def _unknown_message(self, name: str) -> str:
        known = ", ".join(map(repr, self.known_names())) or "none"
        message = f"unknown {self.kind} {self.name_key} {name!r}; known: {known}."
        if name in self.install_hints:
            message += (
                f" It is provided by the {self.install_hints[name]!r} package: pip install {self.install_hints[name]}."
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
    SecondaryTierManager,
    group="tiering.tiers",
    name_key="type",
    path_key="module_path",
    install_hints={"example": "tiering-example", "fs": "tiering-fs", "s3": "tiering-s3"},
)

CachePolicyFactory: Registry[CachePolicy] = Registry(
    "cache policy",
    CachePolicy,
    group="tiering.cache_policies",
    name_key="eviction_policy",
    path_key="cache_policy_module_path",
)
CachePolicyFactory.register("lru", "tiering.core.primary.policy", "LRUCachePolicy")
CachePolicyFactory.register("arc", "tiering.core.primary.policy", "ARCCachePolicy")


def _spec_base() -> type:
    from tiering.core.spec import OffloadingSpec

    return OffloadingSpec


class _SpecRegistry(Registry[Any]):
    """The spec registry; its base class is imported lazily (spec imports this module)."""

    def _check(self, obj: Any, name: str, origin: str) -> type[Any]:
        self.base = _spec_base()
        return super()._check(obj, name, origin)


OffloadingSpecFactory: Registry[Any] = _SpecRegistry(
    "offloading spec", object, group="tiering.specs", name_key="spec_name", path_key="spec_module_path"
)
OffloadingSpecFactory.register("TieringOffloadingSpec", "tiering.core.spec", "TieringOffloadingSpec")
OffloadingSpecFactory.register("OffloadingSpec", "tiering.core.spec", "OffloadingSpec")


def register_tier(name: str, module_path: str, class_name: str) -> None:
    """Register a secondary tier class by import path, imported on first use.

    Raises:
        ValueError: ``name`` is already registered.
    """
    SecondaryTierFactory.register(name, module_path, class_name)


def create_spec(extra_config: Mapping[str, Any], engine_config: Any = None) -> OffloadingSpec:
    """Build the spec named by ``spec_name`` (default ``TieringOffloadingSpec``)."""
    name = extra_config.get("spec_name", "TieringOffloadingSpec")
    cls = OffloadingSpecFactory.get_class(name, extra_config.get("spec_module_path"))
    spec: OffloadingSpec = cls(extra_config, engine_config)
    return spec


def check_tier_keys(cls: type, tier_config: Mapping[str, Any], label: str) -> None:
    """Raise ``TypeError`` naming the tier and key when ``cls`` does not accept a config key."""
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    reserved = {"offloading_spec", "primary_kv_view", "tier_type"}
    accepted = sorted(
        n for n, p in params.items() if n not in reserved and p.kind is not inspect.Parameter.VAR_POSITIONAL
    )
    for key in tier_config:
        if key not in accepted:
            raise TypeError(
                f"{label}: unknown key {key!r} for {cls.__module__}.{cls.__qualname__}; "
                f"accepted keys: {', '.join(accepted) or 'none'}"
            )


def create_secondary_tier(
    tier_config: Mapping[str, Any],
    primary_kv_view: memoryview,
    offloading_spec: OffloadingSpec,
    *,
    index: int = 0,
) -> SecondaryTierManager:
    """Build one secondary tier from its config entry.

    ``type`` and ``module_path`` select the class and are never passed to
    the constructor; every other key is a constructor keyword.

    Args:
        tier_config: one entry of ``secondary_tiers``.
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` view.
        offloading_spec: the stack's spec.
        index: the entry's position in ``secondary_tiers`` (for messages).

    Raises:
        ValueError: ``type`` is missing (the message names the index) or unknown.
        ImportError, AttributeError, TypeError: see :meth:`Registry.get_class`;
            TypeError also for an unknown constructor key (naming tier and key).
        TypeError, ValueError: a bad value, from the tier's constructor; the
            message is prefixed with ``secondary_tiers[<index>]`` so that of
            two tiers of one type the faulty entry is known. Other errors of
            the constructor (``OSError`` for an unusable root...) propagate
            unchanged.
    """
    cls, tier_type, kwargs = resolve_tier(tier_config, index)
    try:
        return cls(offloading_spec, primary_kv_view, tier_type, **kwargs)
    except (TypeError, ValueError) as exc:
        if type(exc) not in (TypeError, ValueError):
            raise  # a subclass may not take a plain message
        raise type(exc)(f"secondary_tiers[{index}]: {exc}") from exc


def resolve_tier(
    tier_config: Mapping[str, Any], index: int = 0
) -> tuple[type[SecondaryTierManager], str, dict[str, Any]]:
    """Resolve one ``secondary_tiers`` entry without building the tier.

    Returns:
        ``(class, tier_type, constructor keywords)``: ``type`` and
        ``module_path`` removed, every other key checked against the class.

    Raises:
        ValueError, ImportError, AttributeError, TypeError: as
            :func:`create_secondary_tier`.
    """
    if not isinstance(tier_config, Mapping):
        raise ValueError(f"secondary_tiers[{index}] must be an object, got {tier_config!r}")
    kwargs = dict(tier_config)
    tier_type = kwargs.pop("type", None)
    module_path = kwargs.pop("module_path", None)
    if not isinstance(tier_type, str) or not tier_type:
        raise ValueError(f'secondary_tiers[{index}] has no \'type\' (got {tier_type!r}); e.g. "type": "fs"')
    cls = SecondaryTierFactory.get_class(tier_type, module_path)
    check_tier_keys(cls, kwargs, f"secondary_tiers[{index}] (type {tier_type!r})")
    return cls, tier_type, kwargs

"""Build specs, secondary tiers and cache policies from their config entries.

Names are resolved to classes by :mod:`tiering.core.registry` (registered
names, entry points, ``module_path``, the type guard); this module checks an
entry against the class (its config schema, its constructor's signature) and
calls the constructor:

- :func:`create_secondary_tier` / :func:`resolve_tier`: one ``secondary_tiers`` entry;
- :func:`create_cache_policy`: the primary tier's ``eviction_policy``;
- :func:`create_spec`: the spec named by ``spec_name``.

Every error of building one names its config keys: ``secondary_tiers[N]`` (and
the key, where known) for a tier, ``eviction_policy`` /
``cache_policy_module_path`` for a policy, ``spec_name`` / ``spec_module_path``
for a spec, with the constructor signature the factory calls when the class
does not fit it; no credential of the entry reaches a message
(:mod:`tiering.core.redact`). This module needs the spec only as a type.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tiering.core.base import TIER_PARAMETERS
from tiering.core.construct import check_callable, config_key_of, construct, label_error
from tiering.core.redact import Redactor, redact_config
from tiering.core.registry import (
    FIRST_PARTY_SPECS,
    OUT_OF_TREE_WARNING,
    CachePolicyFactory,
    OffloadingSpecFactory,
    Registry,
    SecondaryTierFactory,
    import_module_path,
    register_tier,
)
from tiering.core.schema import TierConfigError

if TYPE_CHECKING:
    from tiering.core.base import SecondaryTierManager
    from tiering.core.primary.policy import CachePolicy
    from tiering.core.spec import OffloadingSpec

TIER_SIGNATURE = "(offloading_spec: OffloadingSpec, primary_kv_view: memoryview, tier_type: str, **tier_keys)"
"""How the factory calls a secondary tier's constructor."""

CACHE_POLICY_SIGNATURE = "(capacity: int)"
"""How the factory calls a cache policy's constructor (``capacity``: primary slots, blocks)."""

SPEC_SIGNATURE = "(extra_config: Mapping[str, Any], engine_config: Any = None)"
"""How :func:`create_spec` calls a spec's constructor (the shape of :class:`~tiering.core.spec.OffloadingSpec`)."""


def check_tier_keys(cls: type, tier_config: Mapping[str, Any], label: str) -> None:
    """Raise ``TypeError`` naming the tier and key when ``cls`` does not accept a config key."""
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = sorted(
        n for n, p in params.items() if n not in TIER_PARAMETERS and p.kind is not inspect.Parameter.VAR_POSITIONAL
    )
    for key in tier_config:
        if key not in accepted:
            raise TypeError(
                f"{label}: unknown key {key!r} for {cls.__module__}.{cls.__qualname__}; "
                f"accepted keys: {', '.join(sorted({*accepted, *POLICY_KEYS}))}"
            )


def check_tier_constructor(
    cls: type[SecondaryTierManager],
    tier_type: str,
    kwargs: Mapping[str, Any],
    offloading_spec: OffloadingSpec,
    *,
    index: int = 0,
) -> None:
    """Whether the factory could construct ``cls`` for entry ``secondary_tiers[index]``, by inspection only.

    Nothing is constructed or opened (``tiering check`` without ``--probe``):
    the constructor's signature must accept the call :func:`create_secondary_tier`
    makes (:data:`TIER_SIGNATURE` with the entry's keys) and the class must not be abstract.

    Args:
        cls: the entry's class, as :func:`resolve_tier` returns it.
        tier_type: the entry's ``type``.
        kwargs: the entry's constructor keywords (``type`` and ``module_path`` removed).
        offloading_spec: the stack's spec.
        index: the entry's position in ``secondary_tiers`` (for messages).

    Raises:
        TypeError: the class is abstract or its constructor cannot take the call; names
            ``secondary_tiers[<index>]``, the class, its signature and :data:`TIER_SIGNATURE`.
    """
    check_callable(
        cls,
        (offloading_spec, memoryview(b""), tier_type),
        kwargs,
        label=f"secondary_tiers[{index}] (type {tier_type!r})",
        expected=TIER_SIGNATURE,
        redact=Redactor(dict(kwargs), secret_keys=_schema_secret_keys(cls)),
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
        ValueError: ``type`` is missing (the message names the index) or
            unknown (with a "did you mean" suggestion).
        ImportError, AttributeError, TypeError: see :meth:`Registry.get_class`;
            TypeError also for an unknown constructor key (naming tier and
            key) and for a class whose constructor does not take
            :data:`TIER_SIGNATURE`.
        TierConfigError: a value the tier's ``config_schema`` rejects (or its
            constructor raised one), labelled ``secondary_tiers[<index>].<key>``.
        Exception: whatever the tier's constructor raises (``ValueError`` for
            a bad value, ``OSError`` for an unusable root or bucket...), same
            type, attributes and traceback, its message prefixed with
            ``secondary_tiers[<index>]`` (plus ``.<key>`` where
            :func:`~tiering.core.construct.config_key_of` tells the key) and
            redacted.
    """
    cls, tier_type, kwargs = resolve_tier(tier_config, index)
    redact = Redactor(tier_config, secret_keys=_schema_secret_keys(cls))
    label = f"secondary_tiers[{index}]"
    try:
        return construct(
            cls,
            (offloading_spec, primary_kv_view, tier_type),
            kwargs,
            label=f"{label} (type {tier_type!r})",
            expected=TIER_SIGNATURE,
            redact=redact,
            label_raised=False,
        )
    except Exception as exc:
        labelled = tier_error(exc, tier_config, index)
        if labelled is exc:
            raise
        raise labelled from exc


def tier_error(exc: Exception, tier_config: Mapping[str, Any], index: int) -> Exception:
    """``exc``, raised while opening entry ``secondary_tiers[index]``, labelled with the entry (and key) and redacted.

    A :class:`~tiering.core.schema.TierConfigError` without an entry
    becomes the same error labelled ``secondary_tiers[<index>].<key>`` (a new
    exception); any other error keeps its type and gets the prefix
    ``secondary_tiers[<index>]`` (plus ``.<key>`` when its path or a quoted
    value tells the key, see :func:`~tiering.core.construct.config_key_of`)
    in place. Used by the factory and by ``tiering check --probe``.

    Returns:
        The exception to raise (``exc`` itself unless a new one was needed).
    """
    label = f"secondary_tiers[{index}]"
    if isinstance(exc, TierConfigError):
        return exc.with_entry(label) if exc.entry is None else exc
    try:
        cls = resolve_tier(tier_config, index)[0]
        secrets = _schema_secret_keys(cls)
    except Exception:  # only the secret key names are wanted here
        secrets = frozenset()
    redact = Redactor(tier_config, secret_keys=secrets)
    if label in str(exc):
        return label_error(exc, label, redact)  # only redacted: it names its entry already
    options = {k: v for k, v in tier_config.items() if k not in ("type", "module_path")}
    key = config_key_of(options, exc)
    return label_error(exc, f"{label}.{key}" if key else label, redact)


def resolve_tier(
    tier_config: Mapping[str, Any], index: int = 0
) -> tuple[type[SecondaryTierManager], str, dict[str, Any]]:
    """Resolve one ``secondary_tiers`` entry without building the tier.

    Returns:
        ``(class, tier_type, constructor keywords)``: ``type`` and
        ``module_path`` removed, every other key checked against the class
        (sizes the schema declares, such as ``"capacity_bytes": "4GiB"``, as integers of bytes); the
        admission keys (:mod:`tiering.core.policies.admission`) are checked and left out.

    The entry is checked against the tier's ``config_schema`` when it declares
    one (no side effects: ``tiering check`` relies on it), else its keys
    against the constructor's parameters.

    Raises:
        ValueError, ImportError, AttributeError, TypeError: as
            :func:`create_secondary_tier`; each names ``secondary_tiers[<index>]``.
        TierConfigError: the schema rejects the entry (``secondary_tiers[<index>].<key>: ...``).
    """
    if not isinstance(tier_config, Mapping):
        raise ValueError(f"secondary_tiers[{index}] must be an object, got {redact_config(tier_config)!r}")
    kwargs = dict(tier_config)
    tier_type = kwargs.pop("type", None)
    module_path = kwargs.pop("module_path", None)
    if not isinstance(tier_type, str) or not tier_type:
        raise ValueError(f'secondary_tiers[{index}] has no \'type\' (got {tier_type!r}); e.g. "type": "fs"')
    try:
        cls = SecondaryTierFactory.get_class(tier_type, module_path)
    except (ValueError, ImportError, AttributeError, TypeError) as exc:
        raise label_error(exc, f"secondary_tiers[{index}]", Redactor(tier_config))  # noqa: B904 - relabelled in place
    label = f"secondary_tiers[{index}] (type {tier_type!r})"
    # An abstract class, or a constructor that cannot take the factory's
    # positional arguments, is the fault to report before any key: its
    # parameters are not config keys, so an unknown-key message would point
    # the wrong way.
    check_callable(
        cls,
        (None, None, tier_type),
        {},
        label=label,
        expected=TIER_SIGNATURE,
        redact=Redactor(tier_config),
        partial=True,
    )
    # Policy keys (admission) are applied around the tier: checked here, never given to the tier.
    if POLICY_KEYS & kwargs.keys():
        kwargs = entry_policies().split_entry(tier_type, kwargs, f"secondary_tiers[{index}]")
    if cls.config_schema is not None:
        cls.config_schema.validate(kwargs, entry=f"secondary_tiers[{index}]", also_accepted=POLICY_KEYS)
        # The tier is given integers of bytes even where the config wrote "4GiB".
        kwargs = cls.config_schema.parse_sizes(kwargs, entry=f"secondary_tiers[{index}]")
    else:
        check_tier_keys(cls, kwargs, label)
    return cls, tier_type, kwargs


POLICY_KEYS = frozenset({"admission", "admission_sketch_bytes"})
"""The keys of a tier entry that a policy applies around the tier (declared by :data:`ENTRY_POLICIES`'s schema;
a test keeps the two equal): an entry with none of them never loads the policy."""

ENTRY_POLICIES = "tiering.core.policies.admission"
"""The module of the policy keys a tier entry may carry besides its tier's own (``admission``, ...).

Named, not imported: the kernel never imports a feature. The module offers
``split_entry(tier_type, keys, entry) -> the tier's keys`` (checks the policy keys,
leaves them out) and ``refuse_admission(keys, entry, runner)`` (for engines whose
own manager decides what is written)."""


def entry_policies() -> Any:
    """The module named by :data:`ENTRY_POLICIES`, imported on first use (the factory's one policy hook)."""
    return importlib.import_module(ENTRY_POLICIES)


def _schema_secret_keys(cls: type[SecondaryTierManager]) -> frozenset[str]:
    return cls.config_schema.secret_keys if cls.config_schema is not None else frozenset()


def redact_offloading_config(config: Any) -> Any:
    """A copy of an offloading config with every credential redacted, tier schemas' secret keys included.

    The generic rules of :func:`tiering.core.redact.redact_config` apply
    everywhere; each ``secondary_tiers`` entry whose ``type`` resolves to an
    installed (registered or entry-point) tier also hides the keys that tier's
    :attr:`~tiering.core.base.SecondaryTierManager.config_schema` declares
    secret. No ``module_path`` code is imported for this. Use it for every
    report that shows a config (``tiering bench --json``, ``tiering check``).
    """
    if not isinstance(config, Mapping) or not isinstance(config.get("secondary_tiers"), list):
        return redact_config(config)
    out = redact_config({k: v for k, v in config.items() if k != "secondary_tiers"})
    entries = []
    for entry in config["secondary_tiers"]:
        secret: frozenset[str] = frozenset()
        if isinstance(entry, Mapping) and isinstance(entry.get("type"), str):
            # a type unknown here keeps the generic rules only
            with contextlib.suppress(ValueError, ImportError, AttributeError, TypeError):
                secret = _schema_secret_keys(SecondaryTierFactory.get_class(entry["type"]))
        entries.append(redact_config(entry, secret))
    out["secondary_tiers"] = entries
    return out


def create_cache_policy(name: str, module_path: str | None, capacity: int) -> CachePolicy:
    """Resolve and build the primary tier's eviction policy.

    Args:
        name: the ``eviction_policy`` value (``"lru"``, ``"arc"`` or a custom class name).
        module_path: the ``cache_policy_module_path`` value, for a custom policy.
        capacity: primary slots (blocks).

    Raises:
        ValueError, ImportError, AttributeError, TypeError: as
            :meth:`Registry.get_class`; TypeError also when the class does not
            take :data:`CACHE_POLICY_SIGNATURE` or is abstract. These and any
            error of the policy's constructor name ``eviction_policy`` (and
            ``cache_policy_module_path``).
    """
    label = f"eviction_policy {name!r}"
    if module_path is not None:
        label += f" (cache_policy_module_path {module_path!r})"
    redact = Redactor()
    try:
        cls = CachePolicyFactory.get_class(name, module_path)
    except (ImportError, AttributeError, TypeError) as exc:
        raise label_error(exc, label, redact)  # noqa: B904 - relabelled in place
    return construct(cls, (capacity,), {}, label=label, expected=CACHE_POLICY_SIGNATURE, redact=redact)


def create_spec(extra_config: Mapping[str, Any], engine_config: Any = None) -> OffloadingSpec:
    """Build the spec named by ``spec_name`` (default ``TieringOffloadingSpec``).

    Args:
        extra_config: the offloading config (vLLM's ``kv_connector_extra_config`` shape).
        engine_config: the engine's own config object, handed to the spec.

    Raises:
        ValueError: ``spec_name`` is unknown (with a "did you mean" suggestion
            and the known names), or a config value is bad.
        ImportError, AttributeError: ``spec_module_path`` cannot be imported or
            has no such class; the message names the key.
        TypeError: the class is not an :class:`~tiering.core.spec.OffloadingSpec`,
            or its constructor does not take :data:`SPEC_SIGNATURE`; the
            message names ``spec_name``, ``spec_module_path``, the class's
            signature and the expected one.
        Exception: whatever an out-of-tree spec's constructor raises, same
            type, its message prefixed with ``spec_name ... (spec_module_path ...)``.
            Every message is redacted (:mod:`tiering.core.redact`).
    """
    name = extra_config.get("spec_name", "TieringOffloadingSpec")
    module_path = extra_config.get("spec_module_path")
    redact = Redactor(extra_config)
    label = f"spec_name {name!r}"
    if name not in FIRST_PARTY_SPECS:
        label += f" ({OffloadingSpecFactory.source(name, module_path)})"
    try:
        cls = OffloadingSpecFactory.get_class(name, module_path)
    except (ImportError, AttributeError, TypeError) as exc:
        raise label_error(exc, label, redact)  # noqa: B904 - relabelled in place
    return construct(
        cls,
        (extra_config, engine_config),
        {},
        label=label,
        expected=SPEC_SIGNATURE,
        redact=redact,
        label_raised=name not in FIRST_PARTY_SPECS,
    )


__all__ = [
    "CACHE_POLICY_SIGNATURE",
    "OUT_OF_TREE_WARNING",
    "SPEC_SIGNATURE",
    "TIER_SIGNATURE",
    "CachePolicyFactory",
    "OffloadingSpecFactory",
    "Registry",
    "SecondaryTierFactory",
    "check_tier_constructor",
    "check_tier_keys",
    "create_cache_policy",
    "create_secondary_tier",
    "create_spec",
    "import_module_path",
    "redact_offloading_config",
    "register_tier",
    "resolve_tier",
    "tier_error",
]

"""A tier's config keys declared once: dataclass defaults taken from its schema, and a drift check.

A tier's :class:`~tiering.core.schema.ConfigSchema` is the one
declaration of its keys (name, type, default, range, secret). Two other
places name the keys: the dataclass holding a checked entry, and the tier's
constructor (the factory calls it with the entry's keys as keywords).

- :func:`schema_defaults` gives a dataclass's fields the schema's defaults
  at import, and refuses a field that is not a key (or a key without a field),
  so the dataclass cannot declare a default of its own;
- :func:`declaration_drift` lists where a constructor's keyword defaults (or a
  dataclass's fields) differ from the schema, names and defaults; each
  backend's tests assert it is empty;
- :func:`check_one_block` refuses a byte bound that cannot hold one stored
  block (``capacity_bytes``, ``max_pinned_bytes``, a tenant's ``quota_bytes``),
  where the block size is known: ``tiering check`` and a tier's construction.

The default of a required key, wherever one must be written, is None: the
"not given" marker that validation reports as missing.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from tiering.core.base import TIER_PARAMETERS
from tiering.core.schema import ConfigKey, ConfigSchema, InvalidValueError
from tiering.core.units import size_or_none

T = TypeVar("T")

_NO_DEFAULT = object()


def declared_default(key: ConfigKey) -> Any:
    """The value a field or keyword takes when an entry omits ``key``: its default, None for a required key."""
    return None if key.required else key.default


def schema_defaults(schema: ConfigSchema, *, subset: bool = False) -> Callable[[type[T]], type[T]]:
    """A class decorator, placed below ``@dataclasses.dataclass``: each annotated field gets the schema's default.

    Fields are declared with a type only (``n_read_threads: int``), or with
    ``dataclasses.field(...)`` without a default (``repr=False``); the
    default is :func:`declared_default` of the key of the same name (a
    mutable one is copied for each instance).

    Args:
        schema: the tier's schema.
        subset: the dataclass holds only some of the keys (else every key must have a field).

    Raises:
        TypeError: (at import) a field is not a key of the schema, a key has
            no field (without ``subset``), or a field declares a default of its own.
    """

    def apply(cls: type[T]) -> type[T]:
        where = f"{cls.__module__}.{cls.__qualname__}"
        names = list(inspect.get_annotations(cls))
        unknown = [n for n in names if n not in schema.keys]
        missing = [] if subset else [n for n in schema.keys if n not in names]
        if unknown or missing:
            raise TypeError(
                f"{where}: fields not in tier {schema.tier!r}'s schema: {', '.join(unknown) or 'none'}; "
                f"keys without a field: {', '.join(missing) or 'none'}"
            )
        for name in names:
            default = declared_default(schema.keys[name])
            declared = cls.__dict__.get(name, _NO_DEFAULT)
            field = declared if isinstance(declared, dataclasses.Field) else dataclasses.field()
            own = declared is not _NO_DEFAULT and not isinstance(declared, dataclasses.Field)
            if own or field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING:
                raise TypeError(
                    f"{where}.{name}: declares a default of its own; "
                    f"the default is tier {schema.tier!r}'s schema's ({default!r})"
                )
            if isinstance(default, (dict, list, set)):
                field.default_factory = functools.partial(copy.deepcopy, default)
            else:
                field.default = default
            setattr(cls, name, field)
        return cls

    return apply


def declaration_drift(schema: ConfigSchema, target: Callable[..., Any], *, subset: bool = False) -> list[str]:
    """Where ``target``'s keywords differ from ``schema``: names and defaults, one line each (empty: none).

    Args:
        schema: the tier's schema.
        target: a dataclass (its fields) or a tier class / callable (its
            keyword parameters, less :data:`TIER_PARAMETERS`). A constructor
            taking ``**keys`` is checked for the keys it names only.
        subset: ``target`` takes only some of the keys.

    Returns:
        Lines such as ``"n_read_threads: default 4 here, 8 in the schema"``,
        ``"parameter 'rooot' is not a key"``, ``"key 'fsync' has no parameter"``.
    """
    if dataclasses.is_dataclass(target):
        declared = {f.name: _field_default(f) for f in dataclasses.fields(target)}
        open_ended = False
    else:
        params = inspect.signature(target).parameters.values()
        open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        declared = {
            p.name: _NO_DEFAULT if p.default is inspect.Parameter.empty else p.default
            for p in params
            if p.name not in TIER_PARAMETERS
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        }
    problems = [f"parameter {name!r} is not a key" for name in declared if name not in schema.keys]
    if not (subset or open_ended):
        problems += [f"key {name!r} has no parameter" for name in schema.keys if name not in declared]
    for name, value in declared.items():
        key = schema.keys.get(name)
        if key is None:
            continue
        want = declared_default(key)
        if value is _NO_DEFAULT and key.required:
            continue  # a required keyword without a default says the same as the schema
        if value is _NO_DEFAULT or not _same(value, want):
            shown = "none" if value is _NO_DEFAULT else repr(value)
            problems.append(f"{name}: default {shown} here, {want!r} in the schema")
    return problems


def tenant_quotas(tenants: Any) -> Iterator[tuple[str, int]]:
    """``(key path, bytes)`` of each ``quota_bytes`` a ``tenants`` value writes (``"default.quota_bytes"``...).

    Only quotas written as integers or sizes are given; a malformed value is the schema's ``tenants`` check's to
    refuse, so it is skipped here.
    """
    if not isinstance(tenants, Mapping):
        return
    overrides = tenants.get("overrides")
    limits = [("default", tenants.get("default"))]
    limits += [(f"overrides.{name}", v) for name, v in overrides.items()] if isinstance(overrides, Mapping) else []
    for where, value in limits:
        quota = size_or_none(value.get("quota_bytes")) if isinstance(value, Mapping) else None
        if quota is not None:  # a malformed one is named by the tenants' own check
            yield f"{where}.quota_bytes", quota


def check_one_block(tier: str, entry: Mapping[str, Any], stored_block_bytes: int, label: str | None = None) -> None:
    """Refuse a byte bound of ``entry`` too small for one stored block; nothing else is looked at.

    Checked: ``capacity_bytes``, ``max_pinned_bytes`` (0 is pinning off) and each tenant's ``quota_bytes``
    (0 is a tenant that stores nothing), integers or sizes with a unit.

    Args:
        tier: the tier type, for messages.
        entry: the entry's keys (as given or as the schema normalized them).
        stored_block_bytes: bytes one stored block occupies (payload plus header).
        label: the entry label for messages (``"secondary_tiers[0]"``).

    Raises:
        InvalidValueError: names the key (``tenants.overrides.acme.quota_bytes``) and the stored block's size.
    """
    bounds: list[tuple[str, Any]] = [(k, entry.get(k)) for k in ("capacity_bytes", "max_pinned_bytes")]
    bounds += [(f"tenants.{where}", quota) for where, quota in tenant_quotas(entry.get("tenants"))]
    for key, value in bounds:
        value = size_or_none(value)
        zero_is_off = key != "capacity_bytes"
        if value is None or (zero_is_off and value == 0):  # the schema names a malformed size
            continue
        if value < stored_block_bytes:
            raise InvalidValueError(
                tier,
                key,
                f"{key.rsplit('.', 1)[-1]} {value} is smaller than one stored block ({stored_block_bytes} bytes)",
                label,
            )


def _field_default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return _NO_DEFAULT


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same kind (``True`` is not ``1``; ``600`` is ``600.0``)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


__all__ = [
    "TIER_PARAMETERS",
    "check_one_block",
    "declaration_drift",
    "declared_default",
    "schema_defaults",
    "tenant_quotas",
]

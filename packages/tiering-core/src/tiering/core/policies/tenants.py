"""Tenants: who a request belongs to, and the block keys that keep tenants apart.

A request's tenant is :attr:`tiering.core.base.ReqContext.tenant` (``""``:
the default tenant). It is the only place a request's tenant is kept: the
engine bindings fill it (vLLM: ``kv_transfer_params["tenant"]``, see
:func:`tenant_from_params`; LMCache: the objects' ``cache_salt``), the
standalone API and ``tiering bench --tenants N`` set it directly.

Isolation is in the key. Before any tier (the primary tier included) sees a
key of tenant ``t``, :func:`scope_key` turns it into its one stored form,
``MARK + tenant_tag(t) + key`` (:mod:`tiering.core.policies.tenancy`; the tag
is 16 bytes of BLAKE2b of the tenant's name): the same engine key of two
tenants names two different blocks, so one tenant's lookup can never find
another's block, even when the engine gave identical prompts the same
prefix hash. Tiers never re-key: the tenant of a stored block is read back
from its name (per-tenant quotas and TTL, usage after a restart), and pins,
results and events all carry this one form. The default tenant keeps the
engine's key unchanged, so blocks stored before tenants existed stay
readable; a default-tenant key that begins like a stored form (``MARK``) is
escaped under a tag no tenant has, so no caller choosing its keys (the
Python API, ``tiering pin --keys``, LMCache's keys) can name another
tenant's block. The tag is 16 bytes because a request names its own tenant: a
caller must not be able to search names for one whose tag is another
tenant's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tiering.core.base import OffloadKey
from tiering.core.policies.tenancy import MARK, scope_key
from tiering.core.policies.tenant_auth import TenantAuth

if TYPE_CHECKING:
    from tiering.core.primary.tier import Allocation

__all__ = [
    "DEFAULT_TENANT",
    "MAX_TENANT_CHARS",
    "TENANT_PARAM",
    "caller_allocation",
    "check_tenant",
    "scope_key",
    "scope_keys",
    "tenant_from_params",
]

DEFAULT_TENANT = ""
"""The tenant of a request that names none: its keys are the engine's, unchanged."""

TENANT_PARAM = "tenant"
"""The entry of vLLM's ``kv_transfer_params`` that names the request's tenant."""

MAX_TENANT_CHARS = 1024
"""The longest tenant a request may name (vLLM's limit for ``cache_salt``)."""


def scope_keys(tenant: str, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
    """:func:`scope_key` of each of ``keys``, in order (a new list; ``keys`` itself for the default tenant)."""
    if not tenant and not any(key.startswith(MARK) for key in keys):
        return list(keys)  # the engine's keys as they are (one shaped like a stored form is escaped)
    return [scope_key(tenant, key) for key in keys]


def check_tenant(value: Any, where: str) -> str:
    """``value`` as a tenant name, or a clear error naming ``where`` it came from.

    Raises:
        ValueError: ``value`` is not a str, or longer than :data:`MAX_TENANT_CHARS`.
    """
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a string, got {type(value).__name__} {str(value)[:80]!r}")
    if len(value) > MAX_TENANT_CHARS:
        raise ValueError(f"{where} is {len(value)} characters long, at most {MAX_TENANT_CHARS} are allowed")
    return value


def tenant_from_params(params: Mapping[str, Any] | None, auth: TenantAuth | None = None) -> str:
    """The tenant a vLLM request names in its ``kv_transfer_params`` (``{"tenant": "acme"}``).

    vLLM hands offloading tiers only the request id and ``kv_transfer_params``
    (its ``cache_salt`` goes into the block hashes, not to the tiers), so the
    tenant travels in ``kv_transfer_params``: the OpenAI server's request
    field of that name, or ``SamplingParams(extra_args={"kv_transfer_params": ...})``.

    With ``auth`` enforcing a ``tenant_secret`` (:mod:`tiering.core.policies.tenant_auth`) the entry must be
    ``name:signature``; the name is returned.

    Returns:
        The tenant; :data:`DEFAULT_TENANT` when ``params`` is None or has no
        ``"tenant"`` entry (or it is None).

    Raises:
        ValueError: the entry is not a string or is too long (see :func:`check_tenant`).
        TenantRefusedError: (a ``ValueError``) ``auth`` refuses the entry: unsigned or wrongly signed.
    """
    if not params:
        return DEFAULT_TENANT
    value = params.get(TENANT_PARAM)
    if value is None:
        return DEFAULT_TENANT
    where = f"kv_transfer_params[{TENANT_PARAM!r}]"
    value = check_tenant(value, where)
    if auth is None or not auth.enforced:
        return value
    try:
        return auth.resolve(value)
    except ValueError as exc:
        raise type(exc)(f"{where}: {exc}") from None


def caller_allocation(
    tenant: str, alloc: Allocation, scoped: Sequence[OffloadKey], keys: Sequence[OffloadKey]
) -> Allocation:
    """``alloc``, made for the ``scoped`` keys, naming the caller's ``keys`` instead.

    The caller hands the allocation's keys back to ``complete_store``, which
    scopes them again, so they must be the caller's. ``evicted`` keeps the
    stored names: the evicted blocks may be another tenant's.

    Args:
        tenant: the request's tenant (the default tenant returns ``alloc`` as it is).
        alloc: the primary tier's allocation for ``scoped``.
        scoped: :func:`scope_keys` of ``keys``.
        keys: the caller's keys.
    """
    if not tenant and list(scoped) == list(keys):
        return alloc
    names = dict(zip(scoped, keys, strict=True))
    return dataclasses.replace(
        alloc,
        keys=[names[k] for k in alloc.keys],
        present=[names[k] for k in alloc.present],
        rejected=[names[k] for k in alloc.rejected],
    )

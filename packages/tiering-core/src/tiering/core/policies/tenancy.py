"""The tenant key form (mark + tag + key), and per-tenant byte quotas and TTL kept in a tier's capacity index.

Config (a tier entry's ``tenants`` key, off when absent)::

    "tenants": {"default": {"quota_bytes": "2GiB", "ttl_s": 3600},
                "overrides": {"acme": {"quota_bytes": "10GiB"}, "batch": {"ttl_s": 600}}}

``default`` applies to every tenant without an override (the default tenant
``""`` included); an override's missing fields are the default's. A null or
absent ``quota_bytes`` / ``ttl_s`` means none.

**Where the tenant lives.** Every key a tier sees is already in its one
stored form: the request boundary (:mod:`tiering.core.policies.tenants`) turns the
engine key ``k`` of tenant ``t`` (``ReqContext.tenant``, not ``""``) into
``MARK + tenant_tag(t) + k`` (:func:`scope_key`; the tag is 16 bytes of
personalised BLAKE2b of the tenant's name). The tenant is thus part
of every medium's name for the block (fs file name, s3 object name, redis
key) with no layout change: the index attributes each block to
:func:`tag_of` its key, so a start-up scan or rescan reads each block's tenant
back from its name and per-tenant usage is restored across a restart. Tiers
never re-key. Blocks of the default tenant keep their plain key.

The tag is 16 bytes because a request may name its own tenant (vLLM's
``kv_transfer_params["tenant"]`` is the caller's): with a short tag a
caller could search tenant names for one whose tag equals a victim
tenant's and read its blocks; 2**128 names stay out of reach.

**Age.** The TTL counts from the block's store (not its last hit), so it is
a fixed deadline that every medium keeps across restarts: fs file mtime,
s3 ``LastModified``, redis ``SET EX``. A block found by a lookup probe
(not by a scan) counts its age from that moment. An expired block is a miss
at lookup and is handed out to be deleted (``expirations``); the scans'
:meth:`~tiering.core.store.index.CapacityIndex.evict_to_cap` removes the
expired blocks nobody asked for.

**Quota.** A tenant's bytes are its resident blocks plus its writes in
flight. A store that would take a tenant past its quota first evicts that
tenant's own least recently used blocks (``quota_evictions``), never
another tenant's; when its writes in flight alone fill the quota, the store
fails as ``no_space``. The tier cap still holds over all tenants as before.
On the medium a tenant may hold more than its quota only by victims whose
delete is still in flight; a writer deletes its own victims before it
publishes its blocks, so the overshoot is other writers' victims for a moment.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import threading
from collections.abc import Mapping
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.format import MAX_KEY_BYTES
from tiering.core.schema import ConfigKey
from tiering.core.units import parse_duration, size_value

MARK = b"\xf7tn\x1e"
"""First bytes of a tenant's key (engine keys are hashes: one starts so by chance once in 2**32)."""

TAG_BYTES = 16
"""Bytes of a tenant's tag: too many for a caller to search for a name whose tag is another tenant's."""

PREFIX_BYTES = len(MARK) + TAG_BYTES
"""Bytes the mark and tag add to a key."""

DEFAULT_TAG = b""
"""The tag of the default tenant ``""`` (untagged keys)."""

MAX_NOTED_NAMES = 4096
"""Most tenant names a policy learns from requests (the oldest are forgotten: stats then name their tags)."""


@functools.lru_cache(maxsize=4096)
def tenant_tag(tenant: str) -> bytes:
    """The 16-byte tag of ``tenant`` (BLAKE2b-128 of its UTF-8, personalised); ``b""`` for the default tenant."""
    if not tenant:
        return DEFAULT_TAG
    return hashlib.blake2b(tenant.encode(), digest_size=TAG_BYTES, person=b"tiering-tenant").digest()


DEFAULT_ESCAPE_TAG = hashlib.blake2b(b"", digest_size=TAG_BYTES, person=b"tiering-default").digest()
"""The tag under which a default-tenant key that begins with :data:`MARK` is stored (never a tenant's tag:
another personalisation), so no key a caller chooses can name another tenant's stored block."""


def scope_key(tenant: str, key: OffloadKey) -> OffloadKey:
    """The one stored form of tenant ``tenant``'s block that the engine named ``key``.

    Args:
        tenant: the request's tenant; ``""`` (the default tenant) returns ``key`` unchanged, unless it
            begins with :data:`MARK` (a key shaped like a tenant's stored form, which an engine's hash
            does once in 2**32): that one is stored as ``MARK + DEFAULT_ESCAPE_TAG + key``, so a
            default-tenant caller can never name another tenant's block.
        key: the engine's key (bytes).

    Returns:
        ``MARK + tenant_tag(tenant) + key``; a key too long for that to fit
        :data:`~tiering.core.format.MAX_KEY_BYTES` is replaced by its BLAKE2b
        digest of the room left (44 bytes). The mark and tag have fixed
        lengths, so no other pair of a tenant and a key gives the same bytes
        (short of a BLAKE2b collision).
    """
    if not tenant:
        if not key.startswith(MARK):
            return key
        tag = DEFAULT_ESCAPE_TAG
    else:
        tag = tenant_tag(tenant)
    if len(key) + PREFIX_BYTES > MAX_KEY_BYTES:
        key = OffloadKey(hashlib.blake2b(key, digest_size=MAX_KEY_BYTES - PREFIX_BYTES).digest())
    return OffloadKey(MARK + tag + key)


def tag_of(key: bytes) -> bytes:
    """The tenant tag of a stored key; ``b""`` for a default tenant's key (untagged, or escaped)."""
    if key[: len(MARK)] != MARK or len(key) < PREFIX_BYTES:
        return DEFAULT_TAG
    tag = key[len(MARK) : PREFIX_BYTES]
    return DEFAULT_TAG if tag == DEFAULT_ESCAPE_TAG else tag


@dataclasses.dataclass(frozen=True)
class TenantLimits:
    """One tenant's limits.

    Attributes:
        quota_bytes: most bytes its blocks may take in the tier (headers included); None: no quota.
        ttl_s: seconds a block stays servable after its store; None: no TTL.
    """

    quota_bytes: int | None = None
    ttl_s: float | None = None


_LIMIT_KEYS = ("quota_bytes", "ttl_s")


def _limits(value: Any, where: str, base: TenantLimits) -> TenantLimits:
    """Parse one ``{"quota_bytes", "ttl_s"}`` object; raises ValueError naming ``where`` and the field."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object with quota_bytes and/or ttl_s")
    unknown = sorted(set(value) - set(_LIMIT_KEYS))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]} is not a key (accepted: quota_bytes, ttl_s)")
    quota, ttl = base.quota_bytes, base.ttl_s
    if "quota_bytes" in value:
        quota = value["quota_bytes"]
        if quota is not None:
            quota = size_value(quota, f"{where}.quota_bytes")
    if "ttl_s" in value:
        ttl = value["ttl_s"]
        if isinstance(ttl, str):  # a duration with a unit ("1h"), as every duration tiering reads
            try:
                ttl = parse_duration(ttl)
            except ValueError:
                raise ValueError(f"{where}.ttl_s must be seconds or a duration such as '1h' (is {ttl!r})") from None
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0
        ):
            raise ValueError(f"{where}.ttl_s must be a number of seconds > 0 or null (is {ttl!r})")
    return TenantLimits(quota, None if ttl is None else float(ttl))


class TenantPolicy:
    """The ``tenants`` config of one tier: limits per tenant tag.

    Args:
        default: limits of every tenant without an override.
        overrides: tenant name -> its limits.
    """

    def __init__(self, default: TenantLimits, overrides: Mapping[str, TenantLimits] | None = None) -> None:
        self.default = default
        self._by_tag = {tenant_tag(name): limits for name, limits in (overrides or {}).items()}
        self._names: dict[bytes, str] = {tenant_tag(name): name for name in overrides or {}}
        self._names[DEFAULT_TAG] = ""
        self._noted: dict[bytes, str] = {}  # tag -> name of tenants seen in requests (bounded)
        self._noting = threading.Lock()

    @classmethod
    def from_config(cls, value: Mapping[str, Any] | None) -> TenantPolicy | None:
        """The policy of a ``tenants`` value; None when it is None (tenancy off).

        Raises:
            ValueError: a malformed value; the message names the field (``overrides.acme.ttl_s``).
        """
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ValueError("must be an object with 'default' and/or 'overrides'")
        unknown = sorted(set(value) - {"default", "overrides"})
        if unknown:
            raise ValueError(f"{unknown[0]} is not a key (accepted: default, overrides)")
        default = _limits(value.get("default", {}), "default", TenantLimits())
        overrides = value.get("overrides", {})
        if not isinstance(overrides, Mapping) or not all(isinstance(k, str) and k for k in overrides):
            raise ValueError("overrides must map non-empty tenant names to objects")
        return cls(default, {name: _limits(v, f"overrides.{name}", default) for name, v in overrides.items()})

    def without_quotas(self) -> TenantPolicy:
        """The same TTLs without quotas (for an index when quotas are kept elsewhere, e.g. fleet-wide)."""
        out = TenantPolicy(dataclasses.replace(self.default, quota_bytes=None))
        out._by_tag = {tag: dataclasses.replace(limits, quota_bytes=None) for tag, limits in self._by_tag.items()}
        out._names, out._noted, out._noting = self._names, self._noted, self._noting
        return out

    def ttl_seconds(self, key: bytes, fallback: int | None) -> int | None:
        """Whole seconds (rounded up) of the TTL of ``key``'s tenant, at most ``fallback`` (None: no TTL)."""
        ttl = self.limits(tag_of(key)).ttl_s
        if ttl is None:
            return fallback
        return math.ceil(ttl) if fallback is None else min(fallback, math.ceil(ttl))

    def limits(self, tag: bytes) -> TenantLimits:
        """The limits of the tenant with tag ``tag``."""
        return self._by_tag.get(tag, self.default)

    def name(self, tag: bytes) -> str:
        """The tenant's name when this policy saw it (config or :meth:`note`), else ``tag:<hex>``."""
        name = self._names.get(tag)
        if name is None:
            name = self._noted.get(tag)
        return f"tag:{tag.hex()}" if name is None else name

    def note(self, tenant: str) -> None:
        """Remember ``tenant``'s name for :meth:`name`: a tier saw a request of it (stored keys carry only its tag).

        The last :data:`MAX_NOTED_NAMES` names noted are kept; a forgotten one is named by its tag again.
        """
        tag = tenant_tag(tenant)
        if tag in self._names or tag in self._noted:
            return
        with self._noting:
            if len(self._noted) >= MAX_NOTED_NAMES:
                del self._noted[next(iter(self._noted))]
            self._noted[tag] = tenant


def note_tenant(policy: TenantPolicy | None, tenant: str) -> None:
    """``policy.note(tenant)``; nothing when the tier has no ``tenants`` config (``policy`` None)."""
    if policy is not None:
        policy.note(tenant)


def check_tenants(value: Any) -> str | None:
    """Why a ``tenants`` value is malformed, or None (the config schema's check; no side effects)."""
    try:
        TenantPolicy.from_config(value)
    except ValueError as exc:
        return str(exc)
    return None


TENANTS_KEY = ConfigKey(
    "tenants",
    (dict,),
    nullable=True,
    check=check_tenants,
    doc='per-tenant limits: {"default": {"quota_bytes": "2GiB", "ttl_s": 3600}, "overrides": {"<tenant>": {...}}}',
)
"""The ``tenants`` key every persistent tier declares in its schema."""

"""Per-tenant byte quotas and TTL for the persistent tiers (fs, s3, redis), kept in their capacity index.

Config (a tier entry's ``tenants`` key, off when absent)::

    "tenants": {"default": {"quota_bytes": "2GiB", "ttl_s": 3600},
                "overrides": {"acme": {"quota_bytes": "10GiB"}, "batch": {"ttl_s": 600}}}

``default`` applies to every tenant without an override (the default tenant
``""`` included); an override's missing fields are the default's. A null or
absent ``quota_bytes`` / ``ttl_s`` means none.

**Where the tenant lives.** With ``tenants`` set, a tier stores a block of
tenant ``t`` (``ReqContext.tenant``, not ``""``) under the key
``MARK + tag(t) + key`` (:func:`tenant_tag`: 8 bytes of BLAKE2b of the
tenant's name), so the tenant is part of every medium's name for the block
(fs file name, s3 object name, redis key) with no layout change: a start-up
scan or rescan reads each block's tenant back from its name, and per-tenant
usage is restored across a restart. Blocks of the default tenant keep their
plain key. A lookup stays one index probe (one concatenation more). Results
and events carry the tagged key, except the ``successful_keys`` of a failed
load, which the tier hands back untagged (:func:`untag_result`).

**Age.** The TTL counts from the block's store (not its last hit), so it is
a fixed deadline that every medium keeps across restarts: fs file mtime,
s3 ``LastModified``, redis ``SET EX``. A block found by a lookup probe
(not by a scan) counts its age from that moment. An expired block is a miss
at lookup and is handed out to be deleted (``expirations``); the scans'
:meth:`~tiering.core.toolkit.index.CapacityIndex.evict_to_cap` removes the
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
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext
from tiering.core.format import MAX_KEY_BYTES
from tiering.core.toolkit.config import ConfigKey
from tiering.core.units import parse_size

MARK = b"\xf7tn\x1e"
"""First bytes of a tenant-tagged key (engine keys are hashes: one starts so by chance once in 2**32)."""

TAG_BYTES = 8
"""Bytes of a tenant's tag."""

PREFIX_BYTES = len(MARK) + TAG_BYTES
"""Bytes a tag adds to a key."""

DEFAULT_TAG = b""
"""The tag of the default tenant ``""`` (untagged keys)."""


def tenant_tag(tenant: str) -> bytes:
    """The 8-byte tag of ``tenant`` (BLAKE2b, personalised); ``b""`` for the default tenant ``""``."""
    if not tenant:
        return DEFAULT_TAG
    return hashlib.blake2b(tenant.encode(), digest_size=TAG_BYTES, person=b"tiering-tenant").digest()


def tag_of(key: bytes) -> bytes:
    """The tenant tag of a stored key; ``b""`` for an untagged (default tenant) key."""
    return key[len(MARK) : PREFIX_BYTES] if key[: len(MARK)] == MARK and len(key) > PREFIX_BYTES else DEFAULT_TAG


def untag(key: OffloadKey) -> OffloadKey:
    """The engine's key of a stored key (the key itself when untagged)."""
    return OffloadKey(key[PREFIX_BYTES:]) if tag_of(key) else key


def untag_result(result: JobResult) -> JobResult:
    """``result`` with its ``successful_keys`` untagged (the engine knows only its own keys)."""
    keys = result.successful_keys
    if not keys or not any(k[: len(MARK)] == MARK for k in keys):
        return result
    return dataclasses.replace(result, successful_keys=[untag(k) for k in keys])


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
        if isinstance(quota, str):
            try:
                quota = parse_size(quota)
            except ValueError:
                raise ValueError(f"{where}.quota_bytes must be bytes or a size such as '2GiB' (is {quota!r})") from None
        if quota is not None and (isinstance(quota, bool) or not isinstance(quota, int) or quota < 0):
            raise ValueError(f"{where}.quota_bytes must be an integer >= 0 or a size such as '2GiB' (is {quota!r})")
    if "ttl_s" in value:
        ttl = value["ttl_s"]
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0
        ):
            raise ValueError(f"{where}.ttl_s must be a number of seconds > 0 or null (is {ttl!r})")
    return TenantLimits(quota, None if ttl is None else float(ttl))


class TenantPolicy:
    """The ``tenants`` config of one tier: limits per tenant tag, and the keys blocks are stored under.

    Args:
        default: limits of every tenant without an override.
        overrides: tenant name -> its limits.
    """

    def __init__(self, default: TenantLimits, overrides: Mapping[str, TenantLimits] | None = None) -> None:
        self.default = default
        self._by_tag = {tenant_tag(name): limits for name, limits in (overrides or {}).items()}
        self._names: dict[bytes, str] = {tenant_tag(name): name for name in overrides or {}}
        self._names[DEFAULT_TAG] = ""
        self._prefixes: dict[str, bytes] = {}

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
        out._names, out._prefixes = self._names, self._prefixes
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
        """The tenant's name when this process saw it (config or requests), else ``tag:<hex>``."""
        return self._names.get(tag) or f"tag:{tag.hex()}"

    def key(self, key: OffloadKey, req_context: ReqContext) -> OffloadKey:
        """The key ``key`` of ``req_context``'s tenant is stored under (see the module doc).

        An engine key too long to carry a tag within ``MAX_KEY_BYTES`` is replaced by its BLAKE2b digest
        (that block's ``successful_keys`` then never match: a failed load of it recomputes).
        """
        tenant = req_context.tenant
        if not tenant:
            return key
        prefix = self._prefixes.get(tenant)
        if prefix is None:
            tag = tenant_tag(tenant)
            self._names.setdefault(tag, tenant)
            prefix = self._prefixes.setdefault(tenant, MARK + tag)
        if len(key) + PREFIX_BYTES > MAX_KEY_BYTES:
            key = OffloadKey(hashlib.blake2b(key, digest_size=MAX_KEY_BYTES - PREFIX_BYTES).digest())
        return OffloadKey(prefix + key)

    def keys(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> list[OffloadKey]:
        """:meth:`key` of each of ``keys``."""
        return [self.key(k, req_context) for k in keys]

    def job(self, job: JobMetadata) -> JobMetadata:
        """``job`` with its keys as stored (the same job for the default tenant)."""
        if not job.req_context.tenant:
            return job
        return dataclasses.replace(job, keys=self.keys(job.keys, job.req_context))


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


class TenantKeying:
    """Mixin of a tier with a ``tenants`` policy: the keys a request's blocks are stored under.

    List it first in the tier's bases (``class MyTier(TenantKeying, JobReporting, SecondaryTierManager)``)
    and set ``self.tenants`` (None: off) in ``__init__``. It untags the ``successful_keys`` of the results
    ``get_finished`` hands the engine.
    """

    tenants: TenantPolicy | None = None

    def stored_key(self, key: OffloadKey, req_context: ReqContext) -> OffloadKey:
        """The key ``key`` of this request's tenant is stored under (``key`` itself with tenancy off)."""
        return key if self.tenants is None else self.tenants.key(key, req_context)

    def stored_keys(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> Sequence[OffloadKey]:
        """:meth:`stored_key` of each of ``keys``."""
        return keys if self.tenants is None or not req_context.tenant else self.tenants.keys(keys, req_context)

    def stored_job(self, job: JobMetadata) -> JobMetadata:
        """``job`` with its keys as stored."""
        return job if self.tenants is None else self.tenants.job(job)

    def get_finished(self) -> Iterable[JobResult]:
        """The base class's results, their ``successful_keys`` untagged."""
        results = super().get_finished()  # type: ignore[misc]
        return results if self.tenants is None else [untag_result(r) for r in results]

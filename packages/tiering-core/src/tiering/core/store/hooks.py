"""The policies the block store consults, declared in one place: pin records and tenancy.

The store (SDK) is built below the policies (features) and imports none of
them, except here: this module is its one declared door to them, and the
import contract ``the block store (SDK) reaches features only through its
declared hooks`` (root ``pyproject.toml``) allows no other. A tier without
pins or tenants pays nothing for them: a :class:`PinBook` with no bound
pins nothing, a :class:`TenantPolicy` without tenants scopes nothing.

- :class:`PinBook`, :class:`PinMedium`, :class:`PinningTier`: pin records kept with the blocks
  (:mod:`tiering.core.policies.pin_records`);
- :class:`TenantPolicy`, :func:`note_tenant`: per-tenant keys, quotas and TTLs
  (:mod:`tiering.core.policies.tenancy`);
- :class:`TenantBook`, :class:`TenantOrder`: the index's per-tenant account
  (:mod:`tiering.core.policies.tenant_book`).
"""

from tiering.core.policies.pin_records import PinBook, PinMedium, PinningTier
from tiering.core.policies.tenancy import TenantPolicy, note_tenant
from tiering.core.policies.tenant_book import TenantBook, TenantOrder

__all__ = [
    "PinBook",
    "PinMedium",
    "PinningTier",
    "TenantBook",
    "TenantOrder",
    "TenantPolicy",
    "note_tenant",
]

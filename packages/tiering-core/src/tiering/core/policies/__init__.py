"""Policies: which blocks a tier takes, keeps, serves and to whom (the features layer).

- tenants: :mod:`~tiering.core.policies.tenants` (the manager's per-request
  scoping), :mod:`~tiering.core.policies.tenancy` (a tier's per-tenant keys,
  quotas and TTLs), :mod:`~tiering.core.policies.tenant_book` (the index's
  per-tenant account);
- pins: :mod:`~tiering.core.policies.pinning` (pins by request and API),
  :mod:`~tiering.core.policies.pin_records` (pin records kept with the blocks);
- admission: :mod:`~tiering.core.policies.admission` (second sighting),
  :mod:`~tiering.core.policies.sketch` (its count-min sketch);
- cost model: :mod:`~tiering.core.policies.costmodel` (a load only when it beats recompute).

The block store reaches pins and tenancy only through the hooks it declares
(:mod:`tiering.core.store.hooks`); nothing in the kernel imports this package.
"""

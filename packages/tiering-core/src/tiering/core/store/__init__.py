"""The indexed block store: one implementation of a persistent tier's protocol; backends supply a medium.

- :mod:`~tiering.core.store.medium`: :class:`Medium`, the primitives a backend implements;
- :mod:`~tiering.core.store.tier`: :class:`IndexedTier`, the tier built around a medium;
- :mod:`~tiering.core.store.settings`: :class:`StoreSettings`, the store's knobs from the tier's config;
- :mod:`~tiering.core.store.stores` / :mod:`~tiering.core.store.loads`: store and load shares on the I/O pool;
- :mod:`~tiering.core.store.deletes`: the delete path (retries; the cap holds while deletes fail);
- :mod:`~tiering.core.store.scans`: the start-up scan, rescans and their reconciliation;
- the machinery they are built from, each usable alone by a tier that is not an
  :class:`IndexedTier` (see ``docs/content/toolkit.md``): :mod:`~tiering.core.store.jobs`
  (per-job outcomes, each job reported once), :mod:`~tiering.core.store.index` (the
  capacity-bounded LRU index with reservations and delete-confirmed eviction;
  :mod:`~tiering.core.store.ledger`, :mod:`~tiering.core.store.epochs`,
  :mod:`~tiering.core.store.index_state`, :mod:`~tiering.core.store.touches`),
  :mod:`~tiering.core.store.lookup_cache`, :mod:`~tiering.core.store.pool` (the I/O pool),
  :mod:`~tiering.core.store.shares`, :mod:`~tiering.core.store.stats`,
  :mod:`~tiering.core.store.jobs`, :mod:`~tiering.core.store.forks`;
- :mod:`~tiering.core.store.hooks`: the one door to the policies the store consults (pins, tenancy).

The names below are imported on first use (PEP 562): a tier importing
``tiering.core.store.index`` does not load the whole store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tiering.core import _lazy_exports

if TYPE_CHECKING:
    from tiering.core.store.medium import (
        LOAD_CAUSES,
        PRESENT,
        STORE_CAUSES,
        BlockNotReadyError,
        Medium,
        NotStartedError,
        ScanResult,
        WriteOutcome,
    )
    from tiering.core.store.settings import StoreSettings
    from tiering.core.store.tier import IndexedTier

_HOMES = {
    "tiering.core.store.medium": (
        "LOAD_CAUSES PRESENT STORE_CAUSES BlockNotReadyError Medium NotStartedError ScanResult WriteOutcome"
    ),
    "tiering.core.store.settings": "StoreSettings",
    "tiering.core.store.tier": "IndexedTier",
}
__all__ = [
    "BlockNotReadyError",
    "IndexedTier",
    "LOAD_CAUSES",
    "Medium",
    "NotStartedError",
    "PRESENT",
    "STORE_CAUSES",
    "ScanResult",
    "StoreSettings",
    "WriteOutcome",
]


__getattr__ = _lazy_exports(__name__, _HOMES)

"""The indexed block store: one implementation of a persistent tier's protocol; backends supply a medium.

- :mod:`~tiering.core.store.medium`: :class:`Medium`, the primitives a backend implements;
- :mod:`~tiering.core.store.tier`: :class:`IndexedTier`, the tier built around a medium;
- :mod:`~tiering.core.store.settings`: :class:`StoreSettings`, the store's knobs from the tier's config;
- :mod:`~tiering.core.store.stores` / :mod:`~tiering.core.store.loads`: store and load shares on the I/O pool;
- :mod:`~tiering.core.store.deletes`: the delete path (retries; the cap holds while deletes fail);
- :mod:`~tiering.core.store.scans`: the start-up scan, rescans and their reconciliation.
"""

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

__all__ = [
    "LOAD_CAUSES",
    "PRESENT",
    "STORE_CAUSES",
    "BlockNotReadyError",
    "IndexedTier",
    "Medium",
    "NotStartedError",
    "ScanResult",
    "StoreSettings",
    "WriteOutcome",
]

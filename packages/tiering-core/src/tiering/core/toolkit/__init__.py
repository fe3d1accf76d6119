"""Deprecated: the tier toolkit is part of the block store now; import from the modules named below.

``from tiering.core.toolkit import X`` keeps working for one release with a
DeprecationWarning: config schemas are in :mod:`tiering.core.schema`, KV
events in :mod:`tiering.core.events`, the index, jobs, lookup cache, I/O
pool, shares and stats in :mod:`tiering.core.store` (``store.index``,
``store.jobs``, ...).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_HOMES = {
    "tiering.core.schema": (
        "ConfigKey ConfigSchema EntryCheck InvalidTypeError InvalidValueError MissingKeyError TierConfigError "
        "UnknownKeyError"
    ),
    "tiering.core.events": "BlockRemoved BlockStored HeldKeys KVEvent KVEventLog TierCleared",
    "tiering.core.store.index": "Admit CapacityIndex KeyState ReconcileReport Reservation Victim",
    "tiering.core.store.jobs": "JobReporting JobState JobTracker",
    "tiering.core.store.lookup_cache": "LookupCache",
    "tiering.core.store.pool": "IOPool PoolShutdownError",
    "tiering.core.store.shares": "fail_tasks record_tasks split_batches",
    "tiering.core.store.stats": "STATS Counters Stat",
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"tiering.core.toolkit.{name} moved to {module}.{name}; the old path is removed in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(module), name)

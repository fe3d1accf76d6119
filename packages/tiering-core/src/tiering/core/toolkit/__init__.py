"""The tier toolkit: the machinery every secondary tier needs, written and tested once.

One module per concern (see ``docs/content/toolkit.md``):

- :mod:`~tiering.core.toolkit.jobs`: per-job block outcomes, each job reported exactly once;
- :mod:`~tiering.core.toolkit.index`: a capacity-bounded LRU index with reservations,
  delete-confirmed eviction (:mod:`~tiering.core.toolkit.deletes`), epochs
  (:mod:`~tiering.core.toolkit.epochs`) and reconciliation; its account and queries are
  :mod:`~tiering.core.toolkit.index_state`'s, touches queued without its lock
  (:mod:`~tiering.core.toolkit.touches`);
- :mod:`~tiering.core.toolkit.lookup_cache`: positive/negative lookup cache with batched
  background resolution for remote tiers;
- :mod:`~tiering.core.toolkit.pool`: an I/O worker pool with read and write queues;
- :mod:`~tiering.core.toolkit.config`: config schemas and one exception type per mistake;
- :mod:`~tiering.core.toolkit.stats`: the stats vocabulary;
- :mod:`~tiering.core.toolkit.events`: a bounded KV event log (the index records into it);
- :mod:`~tiering.core.toolkit.reporting`: the tier methods answered from the two above.

Nothing here imports torch, vLLM or any backend.
"""

from tiering.core.toolkit.config import (
    ConfigKey,
    ConfigSchema,
    EntryCheck,
    InvalidTypeError,
    InvalidValueError,
    MissingKeyError,
    TierConfigError,
    UnknownKeyError,
)
from tiering.core.toolkit.events import BlockRemoved, BlockStored, HeldKeys, KVEvent, KVEventLog, TierCleared
from tiering.core.toolkit.index import Admit, CapacityIndex, KeyState, ReconcileReport, Reservation, Victim
from tiering.core.toolkit.jobs import JobState, JobTracker
from tiering.core.toolkit.lookup_cache import LookupCache
from tiering.core.toolkit.pool import IOPool, PoolShutdownError
from tiering.core.toolkit.reporting import JobReporting
from tiering.core.toolkit.shares import fail_tasks, record_tasks, split_batches
from tiering.core.toolkit.stats import STATS, Counters, Stat

__all__ = [
    "STATS",
    "Admit",
    "BlockRemoved",
    "BlockStored",
    "CapacityIndex",
    "ConfigKey",
    "ConfigSchema",
    "Counters",
    "EntryCheck",
    "IOPool",
    "InvalidTypeError",
    "InvalidValueError",
    "JobReporting",
    "JobState",
    "JobTracker",
    "HeldKeys",
    "KVEvent",
    "KVEventLog",
    "KeyState",
    "LookupCache",
    "MissingKeyError",
    "PoolShutdownError",
    "ReconcileReport",
    "Reservation",
    "Stat",
    "TierCleared",
    "TierConfigError",
    "UnknownKeyError",
    "Victim",
    "fail_tasks",
    "record_tasks",
    "split_batches",
]

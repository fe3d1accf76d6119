"""The reference secondary tier: key -> bytes in a dict, jobs done synchronously.

It shows the smallest correct tier built on the block store's machinery (:mod:`tiering.core.store`):
declare the config keys once (:attr:`config_schema`), copy bytes out of / into
``primary_kv_view``, report every job exactly once from the next
``get_finished`` call through a :class:`~tiering.core.store.jobs.JobTracker`, fail
a load whose key is missing (never leave it unreported: the request would wait
for it forever) while keeping the blocks it did copy
(``successful_keys``), and publish KV events for what it stores.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from tiering.core.base import JobMetadata, OffloadKey, ReqContext, SecondaryTierManager, block_view
from tiering.core.events import KVEventLog
from tiering.core.schema import ConfigKey, ConfigSchema
from tiering.core.spec import OffloadingSpec
from tiering.core.store.jobs import JobReporting, JobTracker

logger = logging.getLogger(__name__)

EXAMPLE_SCHEMA = ConfigSchema(
    "example",
    [ConfigKey("custom_param", (int,), default=0, doc="an example tier-specific integer, logged at start-up")],
)
"""Every key of an ``example`` entry."""


class ExampleSecondaryTierManager(JobReporting, SecondaryTierManager):
    """An in-process, unbounded dict of block bytes.

    Config: ``{"type": "example", "custom_param": 0}``. The blocks live as
    long as the process (``medium`` ``"cpu"``, as vLLM's own example tier).

    Args:
        offloading_spec: the stack's spec (see :class:`~tiering.core.SecondaryTierManager`).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` view.
        tier_type: the name the factory resolved this tier by.
        custom_param: an example tier-specific integer key, logged at init.

    Raises:
        tiering.core.schema.InvalidTypeError: ``custom_param`` is not an int
            (a ``TypeError``).
    """

    medium: ClassVar[str] = "cpu"
    config_schema: ClassVar[ConfigSchema | None] = EXAMPLE_SCHEMA

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        custom_param: int = 0,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        self.custom_param: int = EXAMPLE_SCHEMA.check_value("custom_param", custom_param)
        self._blocks: dict[OffloadKey, bytes] = {}
        self.jobs = JobTracker()
        self.events = KVEventLog(self.medium, tier=self.tier_type)
        logger.info("example tier %r ready (custom_param=%d)", tier_type, custom_param)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        return key in self._blocks

    def submit_store(self, job: JobMetadata) -> None:
        state = self.jobs.start(job)
        new = [key for key in job.keys if key not in self._blocks]
        for key, block_id in zip(job.keys, job.block_ids, strict=True):
            self._blocks.setdefault(key, block_view(self.primary_kv_view, block_id).tobytes())
        self.events.record_stored(new)
        state.record((i, True, "") for i in range(len(job.keys)))

    def submit_load(self, job: JobMetadata) -> None:
        state = self.jobs.start(job)
        outcomes = []
        for i, (key, block_id) in enumerate(zip(job.keys, job.block_ids, strict=True)):
            data = self._blocks.get(key)
            if data is not None:
                block_view(self.primary_kv_view, block_id)[:] = data
            outcomes.append((i, data is not None, "" if data is not None else "missing"))
        state.record(outcomes)

    def stats(self) -> dict[str, int | float]:
        return {
            "resident_blocks": len(self._blocks),
            "resident_bytes": len(self._blocks) * self.block_bytes,
            **self.jobs.stats(),
        }

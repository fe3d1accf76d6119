"""The reference secondary tier: key -> bytes in a dict, jobs done synchronously.

It shows the smallest correct tier: copy bytes out of / into
``primary_kv_view``, report every job exactly once from the next
``get_finished`` call, and fail a load whose key is missing (never leave it
unreported: that hang is the bug vLLM's seed 000 fixed).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from tiering.core import JobMetadata, JobResult, OffloadingSpec, OffloadKey, ReqContext, SecondaryTierManager

logger = logging.getLogger(__name__)


class ExampleSecondaryTierManager(SecondaryTierManager):
    """An in-process, unbounded dict of block bytes.

    Config: ``{"type": "example", "custom_param": 0}``.

    Args:
        offloading_spec: the stack's spec (see :class:`~tiering.core.SecondaryTierManager`).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` view.
        tier_type: the name the factory resolved this tier by.
        custom_param: an example tier-specific integer key, logged at init.

    Raises:
        TypeError: ``custom_param`` is not an int.
    """

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        custom_param: int = 0,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        if isinstance(custom_param, bool) or not isinstance(custom_param, int):
            raise TypeError(f"tier {tier_type!r}: custom_param must be an int, got {custom_param!r}")
        self.custom_param = custom_param
        self._blocks: dict[OffloadKey, bytes] = {}
        self._finished: list[JobResult] = []
        logger.info("example tier %r ready (custom_param=%d)", tier_type, custom_param)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        return key in self._blocks

    def submit_store(self, job: JobMetadata) -> None:
        for key, block_id in zip(job.keys, job.block_ids, strict=True):
            if key not in self._blocks:
                self._blocks[key] = self.block(block_id).tobytes()
        self._finished.append(JobResult(job.job_id, True))

    def submit_load(self, job: JobMetadata) -> None:
        success = all(key in self._blocks for key in job.keys)
        if success:
            for key, block_id in zip(job.keys, job.block_ids, strict=True):
                self.block(block_id)[:] = self._blocks[key]
        self._finished.append(JobResult(job.job_id, success))

    def get_finished(self) -> Iterable[JobResult]:
        finished, self._finished = self._finished, []
        return finished

    def stats(self) -> dict[str, int | float]:
        return {"resident_blocks": len(self._blocks), "resident_bytes": len(self._blocks) * self.block_bytes}

"""A tier made slow on purpose: added latency and a bandwidth limit on the loads of any tier.

:class:`ThrottledTier` wraps a secondary tier and holds back the report of
each load job until ``latency_s + bytes / bytes_per_s`` after it was
submitted, the jobs sharing the bandwidth one after another (a link of that
speed). The wrapped tier does the work at once; only what the caller sees is
delayed, so the bytes served are the tier's own, verified as always. Stores,
lookups and everything else pass straight through. ``tiering bench
--throttle`` and the cost model's tests use it to stand for a remote tier
slower than recompute.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.capabilities import take_events
from tiering.core.events import KVEvent
from tiering.core.units import parse_size


class ThrottledTier(SecondaryTierManager):
    """``tier`` whose load jobs are reported no sooner than a link of ``bytes_per_s`` with ``latency_s`` allows.

    Args:
        tier: the tier to wrap (its ``tier_type``, spec and primary view are reused).
        latency_s: seconds added to every load job (>= 0).
        bytes_per_s: load bandwidth in bytes per second (> 0), None for unlimited.

    Raises:
        ValueError: a negative latency or a bandwidth <= 0.
    """

    def __init__(self, tier: SecondaryTierManager, latency_s: float, bytes_per_s: float | None = None) -> None:
        if latency_s < 0:
            raise ValueError(f"throttle latency must be >= 0 seconds, got {latency_s!r}")
        if bytes_per_s is not None and bytes_per_s <= 0:
            raise ValueError(f"throttle bandwidth must be > 0 bytes/s, got {bytes_per_s!r}")
        super().__init__(tier.offloading_spec, tier.primary_kv_view, tier.tier_type)
        self.inner = tier
        self.latency_s = latency_s
        self.bytes_per_s = bytes_per_s
        self._due: dict[int, float] = {}  # load job id -> monotonic time its report may be seen
        self._link_free = 0.0  # when the shared link has sent every byte of the jobs before
        self._held: list[tuple[float, JobResult]] = []
        self._closed = False  # after shutdown every result is reported at once

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """The wrapped tier's answer."""
        return self.inner.lookup(key, req_context)

    def submit_store(self, job: JobMetadata) -> None:
        """Passed through unthrottled."""
        self.inner.submit_store(job)

    def submit_load(self, job: JobMetadata) -> None:
        """Submit to the wrapped tier; its report is held until the throttled link would have carried it."""
        now = time.monotonic()
        transfer = len(job.keys) * self.block_bytes / self.bytes_per_s if self.bytes_per_s else 0.0
        self._link_free = max(self._link_free, now) + transfer
        self._due[job.job_id] = self._link_free + self.latency_s
        self.inner.submit_load(job)

    def get_finished(self) -> Iterable[JobResult]:
        """The wrapped tier's results whose time has come (stores at once, loads when due)."""
        now = float("inf") if self._closed else time.monotonic()
        for result in self.inner.get_finished():
            self._held.append((self._due.pop(result.job_id, now), result))
        ready = [r for due, r in self._held if due <= now]
        self._held = [(due, r) for due, r in self._held if due > now]
        return ready

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Passed through."""
        self.inner.touch(keys, req_context)

    def on_new_request(self, req_context: ReqContext) -> None:
        """Passed through."""
        self.inner.on_new_request(req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Passed through."""
        self.inner.on_request_finished(req_context)

    def has_pending_work(self) -> bool:
        """Whether the wrapped tier has work or a result is still held back."""
        return bool(self._held) or self.inner.has_pending_work()

    def stats(self) -> dict[str, int | float]:
        """The wrapped tier's."""
        return self.inner.stats()

    def take_events(self) -> list[KVEvent]:
        """The wrapped tier's."""
        return take_events(self.inner)

    def shutdown(self) -> None:
        """Shut the wrapped tier down; from then on results are no longer held back."""
        self.inner.shutdown()
        self._closed = True


def parse_throttle(text: str) -> tuple[float, float | None]:
    """``"LATENCY_S[,BANDWIDTH]"`` (e.g. ``"0.05,20MiB"``: 50 ms, 20 MiB per second) as ``(latency_s, bytes_per_s)``.

    Raises:
        ValueError: not of that form; the message gives an example.
    """
    latency, _, bandwidth = text.partition(",")
    try:
        latency_s = float(latency)
        bytes_per_s = float(parse_size(bandwidth.strip())) if bandwidth.strip() else None
    except ValueError:
        raise ValueError(
            f"throttle {text!r}: expected LATENCY_S[,BANDWIDTH_PER_S], e.g. 0.05,20MiB (50 ms, 20 MiB/s)"
        ) from None
    if latency_s < 0 or (bytes_per_s is not None and bytes_per_s <= 0):
        raise ValueError(f"throttle {text!r}: latency must be >= 0 and bandwidth > 0")
    return latency_s, bytes_per_s

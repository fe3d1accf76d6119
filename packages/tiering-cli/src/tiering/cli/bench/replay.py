"""Replay a workload through a tier stack and report what it did.

The replay plays the engine's part: per request it looks up the block keys,
loads the leading run that some tier holds (promoting from secondary tiers),
checks every loaded byte against the payload stored for that key, then
stores the remaining blocks (as if recomputed) and lets the manager cascade
them to every secondary tier.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from tiering.cli.bench.payload import payload_for
from tiering.cli.bench.series import ReplaySeries
from tiering.cli.bench.ttft import RequestTimings
from tiering.cli.bench.workload import Request
from tiering.core.base import OffloadKey, ReqContext, block_view
from tiering.core.policies.tenants import scope_key
from tiering.core.primary import CPUPrimaryTier
from tiering.core.runtime.manager import PRIMARY, LoadResult, TieringManager
from tiering.core.runtime.metrics import snapshot, tier_labels

T = TypeVar("T")

POLL_INTERVAL_S = 0.0002
DEFAULT_TIMEOUT_S = 60.0
MAX_PINNED_FRACTION = 0.5
"""Before a request, the replay waits for in-flight transfers while more than this
fraction of the primary tier is pinned (an engine's backpressure: without it a
replay that issues requests faster than the secondary tiers write would find
the primary full of pinned slots and drop its stores)."""


class VerificationError(RuntimeError):
    """A loaded block's bytes differ from what was stored under its key."""


class ReplayAbandoned(RuntimeError):
    """The replay was told to abandon its waits (a second interrupt); the report so far stays valid."""


def _never() -> bool:
    return False


@dataclasses.dataclass
class ReplayReport:
    """What a replay measured. Byte counts are payload bytes; times are seconds unless named ``_us``.

    ``block_lookups`` / ``hits`` count blocks; ``tokens_looked_up`` /
    ``token_hits`` count the same in tokens (a prompt's last block may be
    partial). ``pinned_lookups`` / ``pinned_hits`` count the blocks of
    :attr:`Replayer.pinned` apart (they are in the totals too). ``tier_stats``
    holds each tier's ``stats()`` at the end, the primary tier's under ``"primary"``.
    """

    requests: int = 0
    block_lookups: int = 0
    tokens_looked_up: int = 0
    token_hits: int = 0
    hits: Counter[str] = dataclasses.field(default_factory=Counter)
    blocks_stored: int = 0
    store_rejected: int = 0
    bytes_loaded: Counter[str] = dataclasses.field(default_factory=Counter)
    bytes_stored: Counter[str] = dataclasses.field(default_factory=Counter)
    verified_blocks: int = 0
    short_loads: int = 0
    wall_s: float = 0.0
    scheduler_call_s: list[float] = dataclasses.field(default_factory=list)
    tier_stats: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    series: ReplaySeries = dataclasses.field(default_factory=ReplaySeries)
    latency: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    partial: bool = False
    stopped_by: str | None = None
    timings: RequestTimings = dataclasses.field(default_factory=RequestTimings)
    pinned_lookups: int = 0
    pinned_hits: int = 0

    @property
    def total_hits(self) -> int:
        """Blocks served by any tier."""
        return sum(self.hits.values())

    @property
    def request_bytes(self) -> int:
        """Payload bytes the requests moved: loaded from any tier plus stored into the primary tier.

        A stored block counts once, not again for each secondary tier it is
        written to (those writes are in :attr:`bytes_stored` per tier).
        """
        return sum(self.bytes_loaded.values()) + self.bytes_stored["primary"]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        lat = sorted(self.scheduler_call_s)

        def pct(p: float) -> float:
            return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1e6 if lat else 0.0

        request_bytes = self.request_bytes
        misses = self.block_lookups - self.total_hits
        return {
            "partial": self.partial,
            "stopped_by": self.stopped_by,
            "requests": self.requests,
            "block_lookups": self.block_lookups,
            "hits": dict(self.hits),
            "hits_total": self.total_hits,
            "misses": misses,
            "miss_ratio": misses / self.block_lookups if self.block_lookups else 0.0,
            "tokens_looked_up": self.tokens_looked_up,
            "token_hits": self.token_hits,
            "token_hit_ratio": self.token_hits / self.tokens_looked_up if self.tokens_looked_up else 0.0,
            "blocks_stored": self.blocks_stored,
            "store_rejected": self.store_rejected,
            "bytes_loaded": dict(self.bytes_loaded),
            "bytes_stored": dict(self.bytes_stored),
            "verified_blocks": self.verified_blocks,
            "short_loads": self.short_loads,
            "wall_s": self.wall_s,
            "request_bytes": request_bytes,
            "throughput_bytes_per_s": request_bytes / self.wall_s if self.wall_s else 0.0,
            "scheduler_calls": len(lat),
            "scheduler_call_us": {
                "p50": pct(50),
                "p90": pct(90),
                "p99": pct(99),
                "max": lat[-1] * 1e6 if lat else 0.0,
                "mean": statistics.fmean(lat) * 1e6 if lat else 0.0,
            },
            "tier_stats": self.tier_stats,
            "series": self.series.to_dict(),
            "latency": self.latency,
            "metrics": self.metrics,
            "timings": self.timings.to_dict(),
            "pinned_lookups": self.pinned_lookups,
            "pinned_hits": self.pinned_hits,
        }


def primary_stats(primary: CPUPrimaryTier, rejected: int) -> dict[str, int]:
    """The primary tier's figures under the stats vocabulary's names (bytes, blocks).

    Args:
        primary: the stack's CPU primary tier.
        rejected: blocks whose store found no free slot (``store_failed_no_free_slot``).
    """
    resident = primary.num_resident * primary.block_bytes
    return {
        "capacity_bytes": primary.num_blocks * primary.block_bytes,
        "resident_blocks": primary.num_resident,
        "resident_bytes": resident,
        "used_bytes": resident,
        "evictions": primary.evictions,
        "evicted_bytes": primary.evictions * primary.block_bytes,
        "store_failed_no_free_slot": rejected,
    }


class Replayer:
    """Drives a :class:`TieringManager` with a workload and verifies every loaded block.

    Args:
        manager: the stack to drive.
        tier_names: label per secondary tier, e.g. ``["0:fs"]``.
        timeout_s: the longest a request may wait for a lookup or a load
            before the replay fails (a hang is a bug, not a slow tier).
        abandon: polled inside every wait; once it returns True the waits
            raise :class:`ReplayAbandoned` instead of waiting on (what a
            second Ctrl-C asks for). Default: never.
        pinned: blocks whose lookups and hits are also counted apart
            (``pinned_lookups`` / ``pinned_hits``; ``tiering bench --pin``).
    """

    def __init__(
        self,
        manager: TieringManager,
        tier_names: list[str],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        abandon: Callable[[], bool] = _never,
        pinned: Iterable[OffloadKey] = (),
    ) -> None:
        self.manager = manager
        self.tier_names = tier_names
        self.timeout_s = timeout_s
        self.abandon = abandon
        self.block_bytes = manager.primary.block_bytes
        self.report = ReplayReport()
        self.pinned = frozenset(pinned)

    def _check_abandon(self) -> None:
        if self.abandon():
            raise ReplayAbandoned("replay abandoned")

    def bytes_moved(self) -> int:
        """:attr:`ReplayReport.request_bytes` so far: payload bytes loaded plus stored into the primary tier."""
        return self.report.request_bytes

    def _timed(self, fn: Callable[[], T]) -> T:
        start = time.perf_counter()
        try:
            return fn()
        finally:
            self.report.scheduler_call_s.append(time.perf_counter() - start)

    def _payload(self, ctx: ReqContext, key: OffloadKey) -> bytes:
        # Each tenant's bytes differ for the same key: a block served to another tenant fails verification.
        return payload_for(scope_key(ctx.tenant, key), self.block_bytes)

    def _source_name(self, source: int) -> str:
        return "primary" if source == PRIMARY else self.tier_names[source]

    def _wait_lookup(self, req: Request, ctx: ReqContext) -> int:
        deadline = time.monotonic() + self.timeout_s
        while (n := self._timed(lambda: self.manager.lookup(req.keys, ctx))) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"request {req.req_id}: lookup pending for over {self.timeout_s}s")
            self._check_abandon()
            time.sleep(POLL_INTERVAL_S)
        return n

    def _wait_load(self, req: Request) -> LoadResult:
        deadline = time.monotonic() + self.timeout_s
        while True:
            for result in self._timed(self.manager.get_finished):
                if result.req_context.req_id == req.req_id:
                    return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"request {req.req_id}: load not finished within {self.timeout_s}s")
            self._check_abandon()
            time.sleep(POLL_INTERVAL_S)

    def replay_one(self, req: Request) -> None:
        """Look up, load, verify and store one request.

        Raises:
            VerificationError: a loaded block differs from its payload.
            TimeoutError: a lookup or load never finished.
            ReplayAbandoned: :attr:`abandon` said so during a wait.
        """
        self._backpressure()
        rep = self.report
        ctx = ReqContext(req.req_id, tenant=req.tenant)
        rep.requests += 1
        rep.block_lookups += len(req.keys)
        rep.tokens_looked_up += req.prompt_tokens
        hits_before = Counter(rep.hits)
        started = time.perf_counter()
        n = self._wait_lookup(req, ctx)
        loaded = 0
        if n:
            self._timed(lambda: self.manager.prepare_load(req.keys[:n], ctx))
            result = self._wait_load(req)
            for key, block_id, source in zip(result.keys, result.block_ids, result.sources, strict=True):
                if block_view(self.manager.primary.kv_view, block_id) != self._payload(ctx, key):
                    raise VerificationError(
                        f"request {req.req_id}: block {key.hex()} from {self._source_name(source)} "
                        "differs from the bytes stored under its key"
                    )
                name = self._source_name(source)
                rep.hits[name] += 1
                rep.bytes_loaded[name] += self.block_bytes
            rep.verified_blocks += len(result.keys)
            rep.short_loads += len(result.keys) < n
            loaded = len(result.keys)
            rep.token_hits += req.tokens_of(loaded)
            self._timed(lambda: self.manager.complete_load(ctx))
        rep.timings.record(req.prompt_tokens, req.tokens_of(loaded), time.perf_counter() - started)
        if self.pinned:
            rep.pinned_lookups += sum(key in self.pinned for key in req.keys)
            rep.pinned_hits += sum(key in self.pinned for key in req.keys[:loaded])
        rest = req.keys[loaded:]
        if rest:
            alloc = self._timed(lambda: self.manager.prepare_store(rest, ctx))
            for key, block_id in zip(alloc.keys, alloc.block_ids, strict=True):
                block_view(self.manager.primary.kv_view, block_id)[:] = self._payload(ctx, key)
            self._timed(lambda: self.manager.complete_store(alloc.keys, ctx))
            rep.blocks_stored += len(alloc.keys)
            rep.store_rejected += len(alloc.rejected)
            rep.bytes_stored["primary"] += len(alloc.keys) * self.block_bytes
        self._timed(lambda: self.manager.on_request_finished(ctx))
        self._record_series(req, Counter(rep.hits) - hits_before)

    def _record_series(self, req: Request, hits: Counter[str]) -> None:
        # Same meanings as the report: "loaded" is what each tier served to requests,
        # "stored" what was written into it.
        stored = {"primary": self.report.bytes_stored["primary"]}
        for idx, name in enumerate(self.tier_names):
            stored[name] = int(self.manager.metrics.value("stored_bytes_total", index=str(idx)))
        self.report.series.record(
            self.report.requests - 1,
            req.timestamp_ms,
            hits,
            len(req.keys),
            stored,
            dict(self.report.bytes_loaded),
            ["primary", *self.tier_names],
        )

    def _backpressure(self) -> None:
        primary = self.manager.primary
        deadline = time.monotonic() + self.timeout_s
        while primary.num_pinned > MAX_PINNED_FRACTION * primary.num_blocks and self.manager.has_pending_work():
            if time.monotonic() > deadline:
                raise TimeoutError(f"transfers still pinning {primary.num_pinned} slots after {self.timeout_s}s")
            self._check_abandon()
            self._timed(self.manager.get_finished)
            time.sleep(POLL_INTERVAL_S)

    def drain(self) -> None:
        """Wait until every cascade job has been reported (bounded by ``timeout_s``).

        Raises:
            TimeoutError: jobs still pending after ``timeout_s``.
            ReplayAbandoned: :attr:`abandon` said so meanwhile.
        """
        deadline = time.monotonic() + self.timeout_s
        while self.manager.has_pending_work():
            if time.monotonic() > deadline:
                raise TimeoutError(f"store jobs still pending after {self.timeout_s}s")
            self._check_abandon()
            self.manager.get_finished()
            time.sleep(POLL_INTERVAL_S)

    def run(
        self,
        requests: Iterable[Request],
        progress: Callable[[int], object] | None = None,
        stop: Callable[[], str | None] | None = None,
    ) -> ReplayReport:
        """Replay every request, drain, and return the report.

        Args:
            requests: the workload.
            progress: called with 1 after each request.
            stop: polled before each request; a non-None answer (the reason,
                e.g. ``"SIGINT"``) ends the replay early: the requests begun
                are finished, the jobs in flight drained (unless
                :attr:`abandon` says otherwise), and the report is marked
                ``partial`` with ``stopped_by`` set to the reason.

        Raises:
            VerificationError, TimeoutError: see :meth:`replay_one`.
        """
        start = time.perf_counter()
        try:
            for req in requests:
                reason = stop() if stop is not None else None
                if reason is not None:
                    self.report.partial, self.report.stopped_by = True, reason
                    break
                self.replay_one(req)
                if progress is not None:
                    progress(1)
            self.drain()
        except ReplayAbandoned:
            self.report.partial = True
            self.report.stopped_by = self.report.stopped_by or (stop() if stop is not None else None) or "abandoned"
        self.report.wall_s = time.perf_counter() - start
        self.report.tier_stats["primary"] = primary_stats(self.manager.primary, self.report.store_rejected)
        for idx, name in enumerate(self.tier_names):
            tier = self.manager.secondary_tiers[idx]
            stats = self.report.tier_stats[name] = dict(tier.stats())
            # The manager counts every block of a successful store job, also one the tier
            # already held (stored again while its first store was queued) and did not
            # rewrite; the tier's own count, where it keeps one, is what it wrote.
            written = stats.get("bytes_stored")
            if written is None:
                written = self.manager.metrics.value("stored_bytes_total", index=str(idx))
            self.report.bytes_stored[name] += int(written)
            for kind in ("store", "load"):
                hist = self.manager.metrics.histogram(f"{kind}_duration_seconds", **tier_labels(tier.tier_type, idx))
                if hist is not None and hist.count:
                    self.report.latency.append(
                        {
                            "tier": name,
                            "kind": kind,
                            "jobs": hist.count,
                            "mean": hist.total / hist.count,
                            **{f"p{q}": hist.quantile(q / 100) for q in (50, 90, 99)},
                        }
                    )
        self.report.metrics = snapshot(self.manager)
        return self.report

"""The tier wrapper: a vLLM ``SecondaryTierManager`` that runs one tiering tier.

:class:`TieringSecondaryTier` owns one tiering tier
(:class:`tiering.core.base.SecondaryTierManager`) and translates between
the two interfaces:

============================================  ==========================================
vLLM (0.32, 0.33)                             tiering
============================================  ==========================================
``__init__(offloading_spec, primary_kv_view,  :class:`~tiering.core.spec.OffloadingSpec`
tier_type, backpressure_detector, **kw)``     built from vLLM's ``OffloadingConfig``; the
                                              primary view re-cast to ``(rows, row_bytes)``
``lookup -> LookupResult.HIT/MISS/RETRY``     ``lookup -> True/False/None``
``submit_store/submit_load(TransferJob)``     ``submit_store/submit_load(JobMetadata)``
``get_finished_jobs -> JobResult(...,         ``get_finished -> JobResult(job_id, success,
successful_keys, transfer_bytes)``            successful_keys)``
``on_new_request -> RequestOffloadingContext  ``on_new_request -> None``
``drain_jobs`` (blocks)                       polls ``get_finished`` until all reported
``get_stats``, ``config_info`` (0.33)         ``stats()``, the namespace digest
============================================  ==========================================

Tenants: a request's tenant is ``kv_transfer_params["tenant"]``
(:func:`~tiering.core.policies.tenants.tenant_from_params`); the wrapper scopes every
key to it before the tiering tier sees it, and hands vLLM back vLLM's own
keys. A request naming a tenant that is not a string gets no tiering at all
(every lookup MISS, every job failed, one error logged): serving it the
default tenant's blocks would break the isolation it asked for.

The wrapper never lets an exception of the tiering tier reach vLLM's
scheduler: every call goes through :class:`~tiering.core.runtime.guard.GuardedTier`
(the same guard the standalone manager uses): a failing ``lookup`` is a
miss, a ``submit_*`` that raises is a failed job, and a job id the tier did
not get from vLLM is dropped with an error log (vLLM's manager would
``assert`` on it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from typing import Any, ClassVar

from tiering.core.base import JobMetadata
from tiering.core.base import OffloadKey as TieringOffloadKey
from tiering.core.base import ReqContext as TieringReqContext
from tiering.core.base import SecondaryTierManager as TieringTierManager
from tiering.core.configfile import WRAPPER_KWARGS
from tiering.core.events import HeldKeys
from tiering.core.factory import POLICY_KEYS, check_tier_keys, entry_policies
from tiering.core.policies.pinning import RequestPins
from tiering.core.policies.tenant_auth import TenantAuth
from tiering.core.policies.tenants import scope_key, scope_keys, tenant_from_params
from tiering.core.runtime.guard import GuardedTier
from tiering.core.vllm.compat import (
    ConfigInfoMapping,
    JobResult,
    Locality,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    SecondaryTierManager,
    TransferJob,
)
from tiering.core.vllm.cost import LoadGate
from tiering.core.vllm.observability import (
    INFO_KEYS,
    config_info_of,
    metric_definitions,
    stats_payload,
    to_offloading_events,
)
from tiering.core.vllm.translate import primary_block_view, tiering_spec_from_vllm, to_lookup_result

logger = logging.getLogger(__name__)

RESERVED_KWARGS = WRAPPER_KWARGS
"""Tier-entry keys the wrapper consumes (:data:`tiering.core.configfile.BINDING_KEYS`); the rest go to the tier."""

_DRAIN_WARN_S = 10.0


class TieringSecondaryTier(SecondaryTierManager):  # type: ignore[misc]
    """A vLLM ``SecondaryTierManager`` running one tiering tier.

    Not used directly: :mod:`tiering.core.vllm.tiers` makes one subclass per
    tiering tier name (:func:`tier_class`), with :attr:`tiering_name` and
    :attr:`tiering_class` set, and vLLM's ``SecondaryTierFactory`` builds it.

    Args:
        offloading_spec: vLLM's ``OffloadingSpec`` (``TieringOffloadingSpec``).
        primary_kv_view: vLLM's primary tier view (see :func:`primary_block_view`).
        tier_type: the ``type`` string of the tier entry (e.g. ``"tiering_fs"``).
        backpressure_detector: vLLM's detector built from the entry's
            ``backpressure`` block, or None; vLLM's manager consults it.
        **tier_kwargs: the tier entry's other keys. ``model_revision`` and
            ``kv_layout`` go into tiering's namespace, ``locality``
            (``"LOCAL"``/``"REMOTE"``, exactly vLLM's ``Locality`` values) to
            vLLM's tier filter and KV events, ``enable_kv_events`` (bool,
            default False, as vLLM's fs tier) to :meth:`take_events`; the rest are the
            tiering tier's own keys.

    Raises:
        TypeError: a key the tiering tier does not accept (named), or this
            base class instantiated without a tier.
        ValueError: a bad ``locality`` (vLLM's own message: ``'local' is not a
            valid Locality``) or primary view; errors of the tiering
            tier's constructor propagate unchanged.
    """

    tiering_name: ClassVar[str] = ""
    tiering_class: ClassVar[type[TieringTierManager] | None] = None

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        **tier_kwargs: Any,
    ) -> None:
        super().__init__(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=backpressure_detector,
        )
        inner_cls = type(self).tiering_class
        if inner_cls is None:
            raise TypeError(
                "TieringSecondaryTier is a base class; use a tier from tiering.core.vllm.tiers, e.g. tiering_fs"
            )
        if POLICY_KEYS & tier_kwargs.keys():
            entry_policies().refuse_admission(tier_kwargs, f"secondary tier {tier_type!r}", "vLLM's own manager")
        locality = tier_kwargs.pop("locality", None)
        # vLLM's own tiers take exactly Locality's values ("LOCAL", "REMOTE") and raise its ValueError.
        self.locality = Locality(locality) if locality is not None else None
        enable_kv_events = tier_kwargs.pop("enable_kv_events", False)
        if not isinstance(enable_kv_events, bool):
            raise TypeError(f"tier {tier_type!r}: enable_kv_events must be a bool, got {enable_kv_events!r}")
        # As vLLM's fs and obj tiers: events only when the entry and the engine (kv_events_config) both ask.
        self._events_enabled = enable_kv_events and bool(offloading_spec.kv_events_config.enable_kv_cache_events)
        self._held = HeldKeys()  # what vLLM was told this tier holds: a re-announcement first removes it
        if enable_kv_events and not self._events_enabled:
            logger.warning(
                "enable_kv_events is set on secondary tier %r but KV cache events are disabled globally; "
                "the tier will not emit events.",
                tier_type,
            )
        view = primary_block_view(primary_kv_view, offloading_spec)
        self.tiering_spec = tiering_spec_from_vllm(
            offloading_spec,
            view,
            model_revision=tier_kwargs.pop("model_revision", None),
            kv_layout=tier_kwargs.pop("kv_layout", None),
        )
        check_tier_keys(inner_cls, tier_kwargs, f"secondary tier {tier_type!r} (tiering {self.tiering_name!r})")
        if inner_cls.config_schema is not None:
            # The tier is given integers of bytes even where the config wrote "4GiB".
            tier_kwargs = inner_cls.config_schema.parse_sizes(tier_kwargs, entry=f"secondary tier {tier_type!r}")
        self.tier: TieringTierManager = inner_cls(self.tiering_spec, view, self.tiering_name, **tier_kwargs)
        self._view = view
        # Every call into the tier: no exception reaches vLLM; keys whose promotion failed are MISS for
        # the rest of their request (else a tier that still answers HIT would be asked to load the same
        # block again every step, forever).
        self._guard = GuardedTier(self.tier, f"tiering tier {self.tiering_name!r}")
        # Blocks that would take longer to load from this tier than to recompute are answered MISS.
        spec = self.tiering_spec
        self._gate = LoadGate(spec.extra_config, spec.block_bytes, spec.block_size)
        self._tenant_auth = TenantAuth.from_config(spec.extra_config)  # tenants signed with tenant_secret, if set
        self._contexts: dict[str, TieringReqContext] = {}
        self._refused: set[str] = set()  # requests whose tenant is unusable: no tiering for them
        self._vllm_keys: dict[int, dict[TieringOffloadKey, Any]] = {}  # promotions of a tenant: scoped -> vLLM key
        self._request_pins = RequestPins()
        logger.info(
            "tiering tier %r (%s.%s) serving vLLM tier %r, namespace %s",
            self.tiering_name,
            inner_cls.__module__,
            inner_cls.__qualname__,
            tier_type,
            self.tiering_spec.namespace.digest,
        )

    # -- translation helpers ---------------------------------------------------
    def _context(self, req_context: Any) -> TieringReqContext:
        ctx = self._contexts.get(req_context.req_id)
        if ctx is None:
            params = req_context.kv_transfer_params
            try:
                tenant = tenant_from_params(params, self._tenant_auth)
            except ValueError as exc:
                logger.error("request %r: %s; no tiering for this request", req_context.req_id, exc)
                self._refused.add(req_context.req_id)
                tenant = ""
            ctx = TieringReqContext(req_context.req_id, dict(params) if params else {}, tenant)
            self._contexts[req_context.req_id] = ctx
        return ctx

    def _job(self, job: Any) -> JobMetadata:
        ctx = self._context(job.req_context)
        keys = [TieringOffloadKey(bytes(k)) for k in job.keys]
        scoped = scope_keys(ctx.tenant, keys)
        if job.is_promotion and scoped != list(job.keys):
            self._vllm_keys[int(job.job_id)] = dict(zip(scoped, job.keys, strict=True))
        return JobMetadata(
            job_id=int(job.job_id),
            keys=scoped,
            block_ids=[int(c) for c in job.chunk_ids],
            is_promotion=bool(job.is_promotion),
            req_context=ctx,
        )

    def _submit(self, job: JobMetadata) -> None:
        # a job of a refused request is reported failed by the next get_finished_jobs, as one the tier refused
        (self._guard.refuse if job.req_context.req_id in self._refused else self._guard.submit)(job)

    # -- vLLM SecondaryTierManager ----------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> Any:
        """HIT, MISS or RETRY for ``key``.

        An exception of the tier is a MISS, and so is a key whose promotion
        already failed for this request, and one the load cost model
        declines (:class:`~tiering.core.vllm.cost.LoadGate`).
        """
        ctx = self._context(req_context)
        if req_context.req_id in self._refused:
            return to_lookup_result(False)
        verdict = self._guard.lookup(scope_key(ctx.tenant, TieringOffloadKey(bytes(key))), ctx)
        if verdict and not self._gate.admit(req_context.req_id):
            verdict = False
        return to_lookup_result(verdict)

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Hand a cascade (primary -> tier) to the tiering tier; returns at once.

        A request whose ``kv_transfer_params`` hold :data:`~tiering.core.policies.pinning.PIN_PARAM` also pins the
        job's blocks in the tier (queued on a background thread: :class:`~tiering.core.policies.pinning.RequestPins`);
        :meth:`touch` pins the blocks it uses that were stored already.
        """
        job = self._job(job_metadata)
        self._submit(job)
        if job.req_context.req_id not in self._refused:
            self._request_pins.submit([self.tier], job.keys, job.req_context)

    def submit_load(self, job_metadata: TransferJob) -> None:
        """Hand a promotion (tier -> primary) to the tiering tier; returns at once."""
        job = self._job(job_metadata)
        self._gate.loading(job.job_id, len(job.keys))
        self._submit(job)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        """Jobs finished since the last call, as vLLM ``JobResult`` with ``transfer_bytes``.

        A successful job moved ``len(keys)`` rows of :attr:`block_size_bytes`.
        A failed promotion passes the tier's ``successful_keys`` (the blocks
        that did reach the primary tier) on to vLLM, which keeps them; only
        the other keys read as MISS for the rest of their request.
        Results for job ids vLLM never submitted, or reported twice, are
        dropped with an error log.
        """
        results: list[JobResult] = []
        for done in self._guard.get_finished():
            if done.job.is_promotion:
                self._gate.finished(done.job.job_id, done.success)
            names = self._vllm_keys.pop(done.job.job_id, None)
            loaded = [names[k] for k in done.loaded] if names else done.loaded  # vLLM's keys, not the scoped ones
            moved = len(done.job.keys) if done.success else len(loaded)
            results.append(
                JobResult(
                    job_id=done.job.job_id,
                    success=done.success,
                    successful_keys=[OffloadKey(k) for k in loaded] if loaded else None,
                    transfer_bytes=moved * self.block_size_bytes if moved else None,
                )
            )
        return results

    def on_new_request(self, req_context: ReqContext) -> Any:
        """Forward to the tier; tiering tiers offload per chunk (vLLM's ``CHUNK_LEVEL``)."""
        self._guard.on_new_request(self._context(req_context))
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Forward to the tier and forget the request's context and failed keys."""
        ctx = self._context(req_context)
        del self._contexts[req_context.req_id]
        self._refused.discard(req_context.req_id)
        self._gate.forget(req_context.req_id)
        self._guard.on_request_finished(ctx)

    def take_events(self) -> Iterable[Any]:
        """The tier's KV events as vLLM's ``OffloadingEvent`` (``enable_kv_events`` and vLLM's KV events on).

        ``BlockStored`` of the tiering tier (a store, a block found, a
        re-announcement) becomes a stored event, ``BlockRemoved`` (an
        eviction, a corrupt block dropped, a block that vanished at a rescan,
        e.g. deleted by ``tiering gc``) a removed one; vLLM's own fs and obj
        tiers never emit removals. ``TierCleared`` (the tier reconnected and
        re-announces) becomes a removal of every key reported before (vLLM has
        no clear of one tier: ``AllBlocksCleared`` clears the engine). Each carries the
        tier's ``medium`` and ``locality``, and ``ownership`` = the tier's
        ``type``, so vLLM tracks our residency apart from the primary tier's;
        stored events set ``removal_expected`` (a removal will follow).
        """
        events = self._guard.take_events()
        if not self._events_enabled:
            return []
        return to_offloading_events(self._held.resolve(events), self.medium, self.locality, self.tier_type)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Forward a use of ``keys`` to the tier's recency order (and pin them when the request asks for pins)."""
        ctx = self._context(req_context)
        if req_context.req_id not in self._refused:
            scoped = scope_keys(ctx.tenant, [TieringOffloadKey(bytes(k)) for k in keys])
            self._guard.touch(scoped, ctx)
            self._request_pins.submit([self.tier], scoped, ctx)  # blocks it found stored are pinned too

    def has_pending_work(self) -> bool:
        """Whether a job vLLM submitted has not been reported back to it yet."""
        return self._guard.in_flight() > 0

    def drain_jobs(self) -> None:
        """Block until the tier has reported every submitted job (none is aborted).

        The results stay queued for the next :meth:`get_finished_jobs`, as
        vLLM's ``reset_cache`` expects. Warns every 10 s while waiting.
        """
        delay, started, warned = 0.0005, time.monotonic(), 0.0
        while True:
            self._guard.poll()
            waiting = self._guard.unreported()
            if not waiting:
                return
            waited = time.monotonic() - started
            if waited - warned >= _DRAIN_WARN_S:
                warned = waited
                logger.warning(
                    "tiering tier %r: drain_jobs still waiting for %d job(s) after %.0f s",
                    self.tiering_name,
                    waiting,
                    waited,
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def shutdown(self) -> None:
        """Shut the tier down (it finishes or fails its jobs first), then release the primary view.

        Releasing the re-cast view lets vLLM unmap its /dev/shm region when it
        cleans up right after; a view the tier still exports (e.g. through
        numpy) keeps the mapping alive, which vLLM reports and tolerates.
        """
        self._request_pins.close()
        self._guard.shutdown()
        try:
            self._view.release()
        except BufferError:
            logger.debug("tiering tier %r still exports the primary view", self.tiering_name)

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        """Declare the gauge that carries the tier's ``stats()`` (see :mod:`~tiering.core.vllm.observability`)."""
        return metric_definitions()

    def get_stats(self) -> Any:
        """The tier's ``stats()`` (plus ``binding_errors``) as gauges (see :mod:`~tiering.core.vllm.observability`)."""
        stats = self._guard.stats()
        stats["binding_errors"] = self._guard.errors
        stats.update(self._gate.stats())
        return stats_payload(self.tier_type, stats)

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        """Label names this tier fills on ``vllm:kv_offload_config_info``."""
        return INFO_KEYS

    def config_info(self) -> ConfigInfoMapping:
        """The tiering tier's class and version, and its namespace digest."""
        return config_info_of(self.tiering_name, self.tier, self.tiering_spec.namespace.digest)

"""The whole vLLM surface of tiering: version check, spec and job translation, the tier wrapper.

Every name this package uses from vLLM is imported here, and only here, so
a new vLLM release is supported by editing one module. The import fails with
:class:`UnsupportedVLLMVersionError` (an ``ImportError`` naming the installed
version) unless the installed vLLM is one of :data:`SUPPORTED_VLLM_VERSIONS`.

:class:`TieringSecondaryTier` is a vLLM ``SecondaryTierManager`` that owns
one tiering tier (:class:`tiering.core.base.SecondaryTierManager`) and
translates between the two interfaces:

============================================  ==========================================
vLLM 0.33                                     tiering
============================================  ==========================================
``__init__(offloading_spec, primary_kv_view,  :class:`~tiering.core.spec.OffloadingSpec`
tier_type, backpressure_detector, **kw)``     built from vLLM's ``OffloadingConfig``; the
                                              primary view re-cast to ``(rows, row_bytes)``
``lookup -> LookupResult.HIT/MISS/RETRY``     ``lookup -> True/False/None``
``submit_store/submit_load(TransferJob)``     ``submit_store/submit_load(JobMetadata)``
``get_finished_jobs -> JobResult(...,         ``get_finished -> JobResult(job_id, success)``
transfer_bytes)``
``on_new_request -> RequestOffloadingContext  ``on_new_request -> None``
``drain_jobs`` (blocks)                       polls ``get_finished`` until all reported
``get_stats``, ``config_info``                ``stats()``, the namespace digest
============================================  ==========================================

The wrapper never lets an exception of the tiering tier reach vLLM's
scheduler: a failing ``lookup`` is a miss, a ``submit_*`` that raises is a
failed job, and a job id the tier did not get from vLLM is dropped with an
error log (vLLM's manager would ``assert`` on it).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Collection, Iterable, Mapping
from importlib import metadata
from typing import Any, ClassVar

from tiering.core.base import JobMetadata
from tiering.core.base import JobResult as TieringJobResult
from tiering.core.base import OffloadKey as TieringOffloadKey
from tiering.core.base import ReqContext as TieringReqContext
from tiering.core.base import SecondaryTierManager as TieringTierManager
from tiering.core.factory import SecondaryTierFactory, check_tier_keys
from tiering.core.primary.buffer import as_block_view
from tiering.core.spec import OffloadingSpec

logger = logging.getLogger(__name__)

SUPPORTED_VLLM_VERSIONS: tuple[str, ...] = ("0.33",)
"""vLLM release series (``major.minor``, any patch) whose interface this module speaks."""

SKIP_VERSION_CHECK_ENV = "TIERING_VLLM_SKIP_VERSION_CHECK"
"""Set to ``1`` to import against an unsupported vLLM anyway (at your own risk)."""


class UnsupportedVLLMVersionError(ImportError):
    """The installed vLLM is not one of :data:`SUPPORTED_VLLM_VERSIONS`."""


def installed_vllm_version() -> str | None:
    """The installed ``vllm`` distribution's version, or None when it is not installed."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def check_vllm_version(version: str | None) -> None:
    """Raise unless ``version`` belongs to a supported release series.

    Args:
        version: a vLLM version string such as ``"0.33.0"`` or ``"0.33.1+cu130"``.

    Raises:
        UnsupportedVLLMVersionError: ``version`` is None (vLLM not installed)
            or outside :data:`SUPPORTED_VLLM_VERSIONS`; the message names it.
    """
    supported = ", ".join(f"{series}.x" for series in SUPPORTED_VLLM_VERSIONS)
    if version is None:
        raise UnsupportedVLLMVersionError(f"tiering.core.vllm needs vLLM ({supported}), which is not installed")
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or f"{match[1]}.{match[2]}" not in SUPPORTED_VLLM_VERSIONS:
        raise UnsupportedVLLMVersionError(
            f"tiering.core.vllm supports vLLM {supported}, but vLLM {version} is installed. "
            f"Install a supported vLLM, or a tiering-core release that supports {version}; "
            f"{SKIP_VERSION_CHECK_ENV}=1 skips this check at your own risk."
        )


if os.environ.get(SKIP_VERSION_CHECK_ENV) != "1":
    check_vllm_version(installed_vllm_version())

# The vLLM surface. Nothing below this line imports from vLLM.
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    ConfigInfoMapping,
    Locality,
    LookupResult,
    Medium,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.base import (  # noqa: E402
    JobResult,
    SecondaryTierManager,
    TransferJob,
)

VLLM_TIERING_SPEC = "vllm.v1.kv_offload.tiering.spec"
"""Module of vLLM's ``TieringOffloadingSpec`` (imported on use by :func:`tiering_offloading_spec`)."""
VLLM_TIER_FACTORY = "vllm.v1.kv_offload.tiering.factory"
"""Module of vLLM's own ``SecondaryTierFactory``."""

STAT_METRIC = "vllm:kv_offload_tiering_backend_stat"
"""The gauge carrying a tiering tier's :meth:`~tiering.core.base.SecondaryTierManager.stats`."""
STAT_LABELS = ("tiering_tier", "stat")
"""Labels of :data:`STAT_METRIC`: the ``type`` of the tier entry and the stat's name."""
INFO_KEYS = ("tiering_tier", "tiering_namespace")
"""Labels this tier adds to vLLM's ``vllm:kv_offload_config_info``."""

RESERVED_KWARGS = ("model_revision", "kv_layout", "locality")
"""Tier-entry keys the wrapper consumes; every other key goes to the tiering tier."""

_DEFAULT_MEDIUM = {"example": "cpu", "fs": "storage", "s3": "storage"}
_DRAIN_WARN_S = 10.0


def medium_for(name: str, tier_cls: type[TieringTierManager]) -> Any:
    """VLLM's ``Medium`` of a tiering tier: its class attribute ``medium``, else a default by name.

    ``medium`` (``"cpu"`` or ``"storage"``) decides how vLLM labels hits
    (``HOST`` / ``DISK``) and how ``load_tier_filter`` treats the tier. An
    unknown tier gets None (vLLM's "unspecified").
    """
    value = getattr(tier_cls, "medium", None) or _DEFAULT_MEDIUM.get(name)
    if isinstance(value, str) and value.upper() in Medium.__members__:
        return Medium[value.upper()]
    return None


def primary_block_view(primary_kv_view: memoryview, vllm_spec: Any) -> memoryview:
    """Re-cast vLLM's primary view to tiering's ``(num_blocks, block_bytes)`` contract.

    vLLM 0.33 hands its tiers a 2-D int8 view of shape ``(num_chunks, R)``
    whose rows are ``R = strides[0]`` bytes: every worker's slot of the chunk
    plus page-alignment padding. A tiering block is that whole row, so the
    bytes a tier stores are exactly the bytes vLLM's workers write and read
    at ``chunk_id * R``. A 1-D byte view is split into rows of the spec's
    ``kv_bytes_per_chunk`` (the page-aligned row size). Zero-copy.

    Raises:
        ValueError: the view is read-only, not C-contiguous (rows separated
            by bytes outside the view), or not a whole number of rows.
    """
    if not primary_kv_view.c_contiguous:
        raise ValueError(
            f"vLLM's primary view (shape {primary_kv_view.shape}, strides {primary_kv_view.strides}) "
            "is not C-contiguous; tiering needs rows of strides[0] bytes back to back"
        )
    if primary_kv_view.ndim >= 2 or primary_kv_view.itemsize > 1:
        assert primary_kv_view.strides is not None
        row_bytes = int(primary_kv_view.strides[0])
    else:
        row_bytes = int(getattr(vllm_spec, "kv_bytes_per_chunk", 0))
    if row_bytes <= 0 or primary_kv_view.nbytes % row_bytes:
        raise ValueError(
            f"vLLM's primary view of {primary_kv_view.nbytes} bytes is not a whole number of {row_bytes}-byte rows"
        )
    return as_block_view(primary_kv_view, primary_kv_view.nbytes // row_bytes, row_bytes)


def layout_descriptor(vllm_spec: Any, kv_layout: str | None) -> str:
    """The ``kv_layout`` namespace field: the user's layout plus everything of vLLM's row layout.

    vLLM's own fs digest covers the model, dtype, group layer names and the
    parallel sizes but not the model revision nor the KV layout; tiering's
    namespace takes the revision from its own field and folds every vLLM
    fact that shapes a row's bytes into this string, so two engines that
    would lay a row out differently never share blocks.
    """
    config = vllm_spec.config
    parallel = config.parallel
    groups = [[g.tokens_per_block, list(g.layer_names), g.group_id] for g in config.groups]
    groups_digest = hashlib.sha256(json.dumps(groups, sort_keys=True).encode()).hexdigest()[:12]
    facts = {
        "engine": "vllm",
        "kv_cache_layout": config.kv_cache_layout or "default",
        "worker_bytes": config.worker_kv_bytes_per_block,
        "slot_bytes": getattr(vllm_spec, "cpu_page_size_per_worker", 0),
        "tp": parallel.tp_size,
        "pp": parallel.pp_size,
        "pcp": parallel.pcp_size,
        "dcp": parallel.dcp_size,
        "replicated": int(bool(getattr(vllm_spec, "replicated_layout", config.replicated_layout))),
        "canonical": int(bool(config.canonical_layout)),
        "blocks_per_chunk": config.cache.blocks_per_chunk,
        "tokens_per_hash": config.cache.tokens_per_hash,
        "groups": groups_digest,
    }
    described = ",".join(f"{k}={v}" for k, v in facts.items())
    return f"{kv_layout or 'opaque'};{described}"


def tiering_spec_from_vllm(
    vllm_spec: Any,
    view: memoryview,
    *,
    model_revision: str | None = None,
    kv_layout: str | None = None,
) -> OffloadingSpec:
    """Build tiering's :class:`~tiering.core.spec.OffloadingSpec` from vLLM's ``OffloadingSpec``.

    Args:
        vllm_spec: vLLM's spec (0.33: ``config`` is an ``OffloadingConfig``;
            there is no ``vllm_config``).
        view: the primary view already re-cast by :func:`primary_block_view`.
        model_revision: the model revision (vLLM's config does not carry it);
            None falls back to ``kv_connector_extra_config["model_revision"]``,
            then tiering's default ``"main"`` with a warning.
        kv_layout: the KV layout name (see :func:`layout_descriptor`); None
            falls back to ``kv_connector_extra_config["kv_layout"]``.

    Returns:
        A spec whose ``block_bytes`` is the row size, ``block_size`` the
        tokens per chunk, ``rank``/``world_size`` vLLM's, and whose
        ``extra_config`` is vLLM's ``kv_connector_extra_config`` with those
        keys set. ``engine_config`` is vLLM's ``OffloadingConfig``.
    """
    config = vllm_spec.config
    extra: dict[str, Any] = dict(config.extra_config)
    revision = model_revision if model_revision is not None else extra.get("model_revision")
    layout = kv_layout if kv_layout is not None else extra.get("kv_layout")
    if revision is None:
        logger.warning(
            "tiering: no model_revision configured for %r; blocks of every revision of this model "
            'share one namespace. Set "model_revision" in the tier entry.',
            config.model.name,
        )
        extra.pop("model_revision", None)
    else:
        extra["model_revision"] = str(revision)
    assert view.shape is not None  # a memoryview over a buffer always has a shape
    num_blocks, block_bytes = int(view.shape[0]), int(view.shape[1])
    tokens_per_block = config.groups[0].tokens_per_block if config.groups else int(extra.get("block_size", 16))
    extra.update(
        {
            "block_size": int(tokens_per_block) * int(config.cache.blocks_per_chunk),
            "block_bytes": block_bytes,
            "cpu_bytes_to_use": num_blocks * block_bytes,
            "model": config.model.name,
            "kv_dtype": str(config.model.dtype).removeprefix("torch."),
            "kv_layout": layout_descriptor(vllm_spec, None if layout is None else str(layout)),
            "rank": config.parallel.rank,
            "world_size": config.parallel.world_size,
        }
    )
    return OffloadingSpec(extra, engine_config=config, strict=False)


def offloading_config(
    extra_config: Mapping[str, Any],
    *,
    worker_kv_bytes_per_block: int,
    engine_id: str,
    model: str = "test/model",
    dtype: str = "bfloat16",
    tokens_per_block: int = 16,
    blocks_per_chunk: int = 1,
    world_size: int = 1,
) -> Any:
    """Build vLLM's ``OffloadingConfig`` as its connector would for a single-group model.

    For tests, benchmarks and running vLLM's scheduler side standalone (the
    engine builds this itself when serving).

    Args:
        extra_config: ``kv_connector_extra_config``.
        worker_kv_bytes_per_block: KV bytes one worker stores per GPU block.
        engine_id: names the /dev/shm region; unique per live manager.
        model: the model name vLLM reports.
        dtype: the KV-cache dtype name vLLM reports.
        tokens_per_block: tokens per GPU block.
        blocks_per_chunk: GPU blocks per offloaded chunk.
        world_size: tensor-parallel workers (each has a slot in every row).
    """
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=tokens_per_block, layer_names=("layers",), group_id=0),),
        worker_kv_bytes_per_block=worker_kv_bytes_per_block,
        enable_kv_cache_events=False,
        extra_config=dict(extra_config),
        engine_id=engine_id,
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=tokens_per_block, blocks_per_chunk=blocks_per_chunk),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=world_size,
            tp_size=world_size,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def tiering_offloading_spec(config: Any) -> Any:
    """Build vLLM's own ``TieringOffloadingSpec(config)``; ``.get_manager()`` builds its scheduler side."""
    return importlib.import_module(VLLM_TIERING_SPEC).TieringOffloadingSpec(config)


def vllm_tier_factory() -> Any:
    """Return vLLM's own ``SecondaryTierFactory`` class."""
    return importlib.import_module(VLLM_TIER_FACTORY).SecondaryTierFactory


def to_lookup_result(verdict: bool | None) -> Any:
    """Tiering's lookup verdict as vLLM's ``LookupResult``: True HIT, False MISS, None RETRY."""
    if verdict is None:
        return LookupResult.RETRY
    return LookupResult.HIT if verdict else LookupResult.MISS


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
            (``"LOCAL"``/``"REMOTE"``) to vLLM's tier filter; the rest are the
            tiering tier's own keys.

    Raises:
        TypeError: a key the tiering tier does not accept (named), or this
            base class instantiated without a tier.
        ValueError: a bad ``locality`` or primary view; errors of the tiering
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
        locality = tier_kwargs.pop("locality", None)
        if locality is not None:
            if not isinstance(locality, str) or locality.upper() not in Locality.__members__:
                raise ValueError(f"tier {tier_type!r}: locality must be 'LOCAL' or 'REMOTE', got {locality!r}")
            self.locality = Locality[locality.upper()]
        view = primary_block_view(primary_kv_view, offloading_spec)
        self.tiering_spec = tiering_spec_from_vllm(
            offloading_spec,
            view,
            model_revision=tier_kwargs.pop("model_revision", None),
            kv_layout=tier_kwargs.pop("kv_layout", None),
        )
        check_tier_keys(inner_cls, tier_kwargs, f"secondary tier {tier_type!r} (tiering {self.tiering_name!r})")
        self.tier: TieringTierManager = inner_cls(self.tiering_spec, view, self.tiering_name, **tier_kwargs)
        self._view = view
        # Every job vLLM handed over and that was not yet reported back to it, by id.
        self._inflight: dict[int, JobMetadata] = {}
        # Keys whose promotion failed, per request: MISS for the rest of the request (else a tier
        # that still answers HIT would be asked to load the same block again every step, forever).
        self._failed_keys: dict[str, set[bytes]] = {}
        # Results already taken from the tier (by drain_jobs, or synthesized) but not yet given to vLLM.
        self._ready: list[TieringJobResult] = []
        self._contexts: dict[str, TieringReqContext] = {}
        self._errors = 0
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
            ctx = TieringReqContext(req_context.req_id, dict(params) if params else {})
            self._contexts[req_context.req_id] = ctx
        return ctx

    def _job(self, job: Any) -> JobMetadata:
        return JobMetadata(
            job_id=int(job.job_id),
            keys=[TieringOffloadKey(bytes(k)) for k in job.keys],
            block_ids=[int(c) for c in job.chunk_ids],
            is_promotion=bool(job.is_promotion),
            req_context=self._context(job.req_context),
        )

    def _submit(self, job: Any, promotion: bool) -> None:
        meta = self._job(job)
        self._inflight[meta.job_id] = meta
        try:
            (self.tier.submit_load if promotion else self.tier.submit_store)(meta)
        except Exception:
            self._errors += 1
            logger.exception("tiering tier %r refused job %d; reported failed", self.tiering_name, meta.job_id)
            self._ready.append(TieringJobResult(meta.job_id, False))

    def _collect(self) -> None:
        try:
            self._ready.extend(self.tier.get_finished())
        except Exception:
            self._errors += 1
            logger.exception("tiering tier %r get_finished raised", self.tiering_name)

    # -- vLLM SecondaryTierManager ----------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> Any:
        """HIT, MISS or RETRY for ``key``.

        An exception of the tier is a MISS, and so is a key whose promotion
        already failed for this request.
        """
        failed = self._failed_keys.get(req_context.req_id)
        if failed is not None and key in failed:
            return LookupResult.MISS
        try:
            verdict = self.tier.lookup(TieringOffloadKey(bytes(key)), self._context(req_context))
        except Exception:
            self._errors += 1
            logger.exception("tiering tier %r lookup raised; treated as a miss", self.tiering_name)
            return LookupResult.MISS
        return to_lookup_result(verdict)

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Hand a cascade (primary -> tier) to the tiering tier; returns at once."""
        self._submit(job_metadata, promotion=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        """Hand a promotion (tier -> primary) to the tiering tier; returns at once."""
        self._submit(job_metadata, promotion=True)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        """Jobs finished since the last call, as vLLM ``JobResult`` with ``transfer_bytes``.

        A successful job moved ``len(keys)`` rows of :attr:`block_size_bytes`.
        The keys of a failed promotion read as MISS for the rest of their
        request.
        Results for job ids vLLM never submitted, or reported twice, are
        dropped with an error log.
        """
        self._collect()
        ready, self._ready = self._ready, []
        results = []
        for result in ready:
            job = self._inflight.pop(result.job_id, None)
            if job is None:
                self._errors += 1
                logger.error("tiering tier %r reported unknown job %d; dropped", self.tiering_name, result.job_id)
                continue
            if job.is_promotion and not result.success:
                self._failed_keys.setdefault(job.req_context.req_id, set()).update(job.keys)
            results.append(
                JobResult(
                    job_id=result.job_id,
                    success=bool(result.success),
                    transfer_bytes=len(job.keys) * self.block_size_bytes if result.success else None,
                )
            )
        return results

    def on_new_request(self, req_context: ReqContext) -> Any:
        """Forward to the tier; tiering tiers offload per chunk (vLLM's ``CHUNK_LEVEL``)."""
        try:
            self.tier.on_new_request(self._context(req_context))
        except Exception:
            self._errors += 1
            logger.exception("tiering tier %r on_new_request raised", self.tiering_name)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Forward to the tier and forget the request's context and failed keys."""
        ctx = self._context(req_context)
        del self._contexts[req_context.req_id]
        self._failed_keys.pop(req_context.req_id, None)
        try:
            self.tier.on_request_finished(ctx)
        except Exception:
            self._errors += 1
            logger.exception("tiering tier %r on_request_finished raised", self.tiering_name)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Forward a use of ``keys`` to the tier's recency order."""
        try:
            self.tier.touch([TieringOffloadKey(bytes(k)) for k in keys], self._context(req_context))
        except Exception:
            self._errors += 1
            logger.exception("tiering tier %r touch raised", self.tiering_name)

    def has_pending_work(self) -> bool:
        """Whether a job vLLM submitted has not been reported back to it yet."""
        return bool(self._inflight)

    def drain_jobs(self) -> None:
        """Block until the tier has reported every submitted job (none is aborted).

        The results stay queued for the next :meth:`get_finished_jobs`, as
        vLLM's ``reset_cache`` expects. Warns every 10 s while waiting.
        """
        delay, started, warned = 0.0005, time.monotonic(), 0.0
        while True:
            self._collect()
            reported = {r.job_id for r in self._ready}
            if all(job_id in reported for job_id in self._inflight):
                return
            waited = time.monotonic() - started
            if waited - warned >= _DRAIN_WARN_S:
                warned = waited
                logger.warning(
                    "tiering tier %r: drain_jobs still waiting for %d job(s) after %.0f s",
                    self.tiering_name,
                    len(set(self._inflight) - reported),
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
        self.tier.shutdown()
        try:
            self._view.release()
        except BufferError:
            logger.debug("tiering tier %r still exports the primary view", self.tiering_name)

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        """Declare :data:`STAT_METRIC`, the gauge that carries the tier's ``stats()``."""
        return {
            STAT_METRIC: OffloadingGaugeMetadata(
                documentation=(
                    "A tiering secondary tier's own counters and levels (hits, failures by cause, "
                    "bytes, resident blocks, ...), as the tier reports them, labeled by tier type and stat name."
                ),
                labelnames=STAT_LABELS,
            )
        }

    def get_stats(self) -> Any:
        """The tier's ``stats()`` (plus ``binding_errors``) as gauges of :data:`STAT_METRIC`, or None."""
        try:
            stats = dict(self.tier.stats())
        except Exception:
            self._errors += 1
            logger.exception("tiering tier %r stats raised", self.tiering_name)
            stats = {}
        stats["binding_errors"] = self._errors
        payload = OffloadingConnectorStats()
        for name, value in stats.items():
            payload.set_gauge(STAT_METRIC, float(value), (self.tier_type, str(name)))
        return payload

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        """Label names this tier fills on ``vllm:kv_offload_config_info``."""
        return INFO_KEYS

    def config_info(self) -> ConfigInfoMapping:
        """The tiering tier's class and version, and its namespace digest."""
        inner = type(self.tier)
        dist = _distribution_of(inner)
        return {
            "tiering_tier": f"{self.tiering_name} ({inner.__module__}.{inner.__qualname__}{dist})",
            "tiering_namespace": self.tiering_spec.namespace.digest,
        }


def _distribution_of(cls: type) -> str:
    package = sys.modules.get(".".join(cls.__module__.split(".")[:2]))
    version = getattr(package, "__version__", None)
    return f" {version}" if isinstance(version, str) else ""


# -- the names vLLM resolves ----------------------------------------------------------

TIER_NAME_PREFIX = "tiering_"
"""``type`` = ``tiering_<name>`` selects tiering tier ``<name>``: never one of vLLM's built-in names."""

_classes: dict[str, type[TieringSecondaryTier]] = {}


def camel(name: str) -> str:
    """``fs`` -> ``Fs``, ``my-tier`` -> ``MyTier``: the part after ``Tiering`` in a class-style name."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^0-9A-Za-z]+", name) if part)


def known_tier_names() -> list[str]:
    """Tiering tier names resolvable here: registered in-process or installed (entry points)."""
    return SecondaryTierFactory.known_names()


def resolve_tier_name(attr: str) -> str | None:
    """The tiering tier name that ``attr`` selects, or None.

    Accepted, in this order: ``tiering_<name>`` (canonical), ``Tiering<Camel>``
    (e.g. ``TieringFs``), and the class name of an installed tiering tier
    (e.g. ``FsspecSecondaryTierManager``; this imports every installed tier).
    """
    names = known_tier_names()
    if attr.startswith(TIER_NAME_PREFIX) and attr[len(TIER_NAME_PREFIX) :] in names:
        return attr[len(TIER_NAME_PREFIX) :]
    if attr.startswith("Tiering"):
        for name in names:
            if "Tiering" + camel(name) == attr:
                return name
    for name in names:
        try:
            cls = SecondaryTierFactory.get_class(name)
        except Exception:  # a broken provider must not hide the others
            logger.debug("tiering tier %r did not load", name, exc_info=True)
            continue
        if cls.__name__ == attr:
            return name
    return None


def tier_class(name: str) -> type[TieringSecondaryTier]:
    """The vLLM tier class wrapping tiering tier ``name`` (one class per name, cached).

    Raises:
        ValueError, ImportError, TypeError: as
            :meth:`tiering.core.factory.Registry.get_class` for ``name``.
    """
    cls = _classes.get(name)
    if cls is None:
        inner = SecondaryTierFactory.get_class(name)
        class_name = "Tiering" + camel(name)
        cls = type(
            class_name,
            (TieringSecondaryTier,),
            {
                "__module__": "tiering.core.vllm.tiers",
                "__qualname__": class_name,
                "__doc__": f"vLLM secondary tier running tiering tier {name!r} "
                f"({inner.__module__}.{inner.__qualname__}).",
                "tiering_name": name,
                "tiering_class": inner,
                "medium": medium_for(name, inner),
            },
        )
        _classes[name] = cls
    return cls


def unknown_tier_message(attr: str) -> str:
    """The AttributeError text for a name :func:`resolve_tier_name` rejects."""
    names = known_tier_names()
    known = ", ".join(TIER_NAME_PREFIX + n for n in names) or "none installed"
    return (
        f'tiering.core.vllm.tiers has no tier {attr!r}. Use "type": "tiering_<name>" where <name> is a '
        f"tiering tier ({known}); install a backend (pip install tiering-fs) or register a tier under the "
        "'tiering.tiers' entry-point group. Bare names such as 'fs' or 'example' select vLLM's built-in tiers."
    )


__all__ = [
    "VLLM_TIERING_SPEC",
    "VLLM_TIER_FACTORY",
    "LookupResult",
    "ReqContext",
    "ScheduleEndContext",
    "offloading_config",
    "tiering_offloading_spec",
    "vllm_tier_factory",
    "INFO_KEYS",
    "RESERVED_KWARGS",
    "SKIP_VERSION_CHECK_ENV",
    "STAT_LABELS",
    "STAT_METRIC",
    "SUPPORTED_VLLM_VERSIONS",
    "TIER_NAME_PREFIX",
    "TieringSecondaryTier",
    "UnsupportedVLLMVersionError",
    "camel",
    "check_vllm_version",
    "installed_vllm_version",
    "known_tier_names",
    "layout_descriptor",
    "medium_for",
    "primary_block_view",
    "resolve_tier_name",
    "tier_class",
    "tiering_spec_from_vllm",
    "to_lookup_result",
    "unknown_tier_message",
]

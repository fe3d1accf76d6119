"""The secondary-tier contract: what every tier behind the CPU primary tier implements.

The contract follows the seeds of vLLM's ``vllm/v1/kv_offload/tiering`` layer
(``SecondaryTierManager``); it is kept stable across vLLM releases and the
vLLM binding translates vLLM's current interface to it.

All methods are called from the scheduler's thread and must stay cheap: the
bytes move on the tier's own threads (or event loop), never in the caller.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NewType

if TYPE_CHECKING:
    from tiering.core.schema import ConfigSchema
    from tiering.core.spec import OffloadingSpec

OffloadKey = NewType("OffloadKey", bytes)
"""A block's name: its prefix hash (chained over all token ids up to and
including the block), optionally followed by a KV-cache group index. Opaque
to tiers; at most :data:`tiering.core.format.MAX_KEY_BYTES` bytes."""


def block_view(primary_kv_view: memoryview, block_id: int) -> memoryview:
    """Slot ``block_id`` of a ``(num_blocks, block_bytes)`` view as a flat, writable memoryview.

    Python's memoryview does not index multi-dimensional views by an integer
    (``view[i]`` raises NotImplementedError); a one-row slice cast to bytes is
    the zero-copy equivalent.

    Raises:
        IndexError: ``block_id`` is outside ``[0, num_blocks)``.
    """
    num_blocks = len(primary_kv_view)
    if not 0 <= block_id < num_blocks:
        raise IndexError(f"block_id {block_id} outside [0, {num_blocks})")
    return primary_kv_view[block_id : block_id + 1].cast("B")


PRIMARY = -1
"""The source index of blocks that were already in the primary tier (secondary tiers count from 0)."""

TIER_PARAMETERS = frozenset({"self", "offloading_spec", "primary_kv_view", "tier_type"})
"""Constructor parameters of :class:`SecondaryTierManager` the factory fills itself: never config keys."""


@dataclasses.dataclass
class ReqContext:
    """Per-request context handed to tiers with every call.

    Attributes:
        req_id: the engine's request id.
        extra: free-form per-request data (vLLM's ``kv_transfer_params``).
        tenant: who the request belongs to; ``""`` is the default tenant.
            The manager keeps tenants' blocks apart by key
            (:mod:`tiering.core.policies.tenants`): the keys a tier gets already carry
            the tenant's tag, by which tiers that keep per-tenant quotas, TTLs
            or usage attribute each block.

    Raises:
        TypeError: ``tenant`` is not a str.
    """

    req_id: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    tenant: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.tenant, str):
            raise TypeError(f"request {self.req_id!r}: tenant must be a str, got {type(self.tenant).__name__}")


@dataclasses.dataclass(frozen=True)
class JobMetadata:
    """One transfer job between the primary tier and a secondary tier.

    Attributes:
        job_id: unique (per manager) job id; reported back in a :class:`JobResult`.
        keys: the blocks' keys, one per entry of ``block_ids``.
        block_ids: primary-tier slots (indices into ``primary_kv_view``'s first
            axis). A store reads from them; a load writes into them. The
            framework keeps them pinned until the job is reported finished.
        is_promotion: True for a load (secondary -> primary).
        req_context: the request that caused the job.
    """

    job_id: int
    keys: Sequence[OffloadKey]
    block_ids: Sequence[int]
    is_promotion: bool
    req_context: ReqContext

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.block_ids):
            raise ValueError(f"job {self.job_id}: {len(self.keys)} keys but {len(self.block_ids)} block_ids")


@dataclasses.dataclass(frozen=True)
class JobResult:
    """The outcome of one job, reported exactly once by ``get_finished``.

    Attributes:
        job_id: the id of the finished :class:`JobMetadata`.
        success: True when every block of the job was transferred (and, on a
            load, verified).
        successful_keys: for a failed load only, the keys whose blocks were
            read and verified into their slots anyway (a subset of the job's
            keys); None means none. The caller keeps those blocks and
            recomputes from the first key not in it (vLLM's
            ``JobResult.successful_keys`` has the same meaning).
    """

    job_id: int
    success: bool
    successful_keys: Sequence[OffloadKey] | None = None


class SecondaryTierManager(abc.ABC):
    """Base class of every secondary tier (filesystem, S3, ...).

    A tier reads and writes block bytes straight out of the primary tier's
    host buffer ``primary_kv_view``: a 2-D ``memoryview`` of shape
    ``(num_blocks, block_bytes)`` and format ``"B"``; :func:`block_view`
    gives slot ``i`` as a flat memoryview without copying.

    Subclasses accept their own configuration keys as keyword arguments after
    the three arguments below; the factory rejects unknown keys before the
    constructor runs. ``tier_type`` is injected by the factory (the name the
    tier was resolved by), never read from the class.

    Args:
        offloading_spec: the :class:`~tiering.core.spec.OffloadingSpec` of the
            stack (block geometry, namespace, raw config, engine config).
        primary_kv_view: the primary tier's host buffer, see above.
        tier_type: the registered name of the tier (``"fs"``, ``"s3"``, ...).

    Extension points (class attributes and classmethods a tier may
    override; core asks them instead of knowing any backend by name):

    - :attr:`medium`: where the blocks live, for KV events and vLLM's tier
      medium (``"storage"``, ``"memory"``, ``"cpu"``...).
    - :attr:`config_schema`: the tier's declared config keys
      (:class:`~tiering.core.schema.ConfigSchema`), used for
      side-effect-free validation (``tiering check`` without ``--probe``)
      and to know which keys are secret.

    What only some tiers can do (pins, KV events, offline inspection,
    probing, a local default) is an optional capability, a Protocol of
    :mod:`tiering.core.capabilities`: a tier offers it by defining its methods.

    Raises:
        ValueError: ``primary_kv_view`` is not 2-D or its rows are not
            ``offloading_spec.block_bytes`` long.
    """

    medium: ClassVar[str] = "storage"
    """Where this tier keeps blocks (vLLM's KV event / tier medium), e.g. ``"storage"`` or ``"memory"``."""

    config_schema: ClassVar[ConfigSchema | None] = None
    """The tier's declared config keys; None: only the constructor signature is known."""

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
    ) -> None:
        shape = primary_kv_view.shape or ()
        if len(shape) != 2:
            raise ValueError(f"primary_kv_view must be 2-D (num_blocks, block_bytes), got shape {shape}")
        if shape[1] != offloading_spec.block_bytes:
            raise ValueError(
                f"primary_kv_view rows are {shape[1]} bytes, spec block_bytes is {offloading_spec.block_bytes}"
            )
        self.offloading_spec = offloading_spec
        self.primary_kv_view = primary_kv_view
        self.tier_type = tier_type

    @property
    def block_bytes(self) -> int:
        """Bytes per block (one row of ``primary_kv_view``)."""
        return int(self.primary_kv_view.strides[0]) if self.primary_kv_view.strides else 0

    @abc.abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Whether the tier holds ``key``, without blocking.

        Returns:
            True: present and loadable now. False: absent. None: not known yet
            (a store of it or a remote probe is in flight); ask again later.
            A tier never answers True for a block it cannot serve.
        """

    @abc.abstractmethod
    def submit_store(self, job: JobMetadata) -> None:
        """Start writing ``job.block_ids``' bytes under ``job.keys``; return at once.

        The outcome is reported once by :meth:`get_finished`. Keys the tier
        already holds count as stored.
        """

    @abc.abstractmethod
    def submit_load(self, job: JobMetadata) -> None:
        """Start reading ``job.keys`` into ``job.block_ids``; return at once.

        The outcome is reported once by :meth:`get_finished`; a missing or
        unverifiable block fails the job (the caller recomputes).
        """

    @abc.abstractmethod
    def get_finished(self) -> Iterable[JobResult]:
        """The jobs finished since the last call; each job appears exactly once."""

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:  # noqa: B027
        """Record a use of ``keys`` for the tier's recency (eviction) order. Default: no-op."""

    def on_new_request(self, req_context: ReqContext) -> None:  # noqa: B027
        """Called when a request enters the scheduler. Default: no-op."""

    def on_request_finished(self, req_context: ReqContext) -> None:  # noqa: B027
        """Called when a request leaves the scheduler. Default: no-op."""

    def has_pending_work(self) -> bool:
        """Whether jobs are still in flight. Default: False."""
        return False

    def stats(self) -> dict[str, int | float]:
        """Figures of the tier for metrics and ``tiering stat``. Default: none.

        Keys use the stats vocabulary, :data:`tiering.core.store.stats.STATS`
        (one name per concept in every tier, documented once). Those with a
        meaning to :mod:`tiering.core.runtime.metrics`: ``resident_blocks``,
        ``resident_bytes``, ``used_bytes``, ``pending_delete_bytes``,
        ``capacity_bytes`` (0: unbounded), ``evictions``, ``failed_deletes``,
        and ``store_failed_<cause>`` / ``load_failed_<cause>`` (blocks, by
        cause: ``checksum``, ``truncated``, ``foreign``, ``io_error``,
        ``timeout``, ``throttled``, ``no_space``, ...). Other keys are shown
        as they are. Must be safe to call from another thread.
        """
        return {}

    def shutdown(self) -> None:  # noqa: B027
        """Stop background work. Jobs in flight are finished or reported failed first."""

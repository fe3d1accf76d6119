"""The tier conformance suite, shipped in the wheel (after fsspec's ``tests/abstract``).

A tier's test module subclasses :class:`TierConformanceTests` and provides
the ``tier_config`` fixture (its ``secondary_tiers`` entry); the suite builds
the tier through :func:`~tiering.core.factory.create_secondary_tier`, as a
user's config would, and checks the tier contract::

    from tiering.core.testing import TierConformanceTests

    class TestMyTier(TierConformanceTests):
        @pytest.fixture
        def tier_config(self, tmp_path):
            return {"type": "mytier", "root": str(tmp_path)}

Requires pytest (a test dependency, not a runtime one).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager, block_view
from tiering.core.factory import SecondaryTierFactory, create_secondary_tier
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec

DEFAULT_TIMEOUT_S = 30.0


def block_payload(key: bytes, block_bytes: int) -> bytes:
    """Deterministic pseudo-random bytes for ``key`` (SHAKE-256 stream), ``block_bytes`` long."""
    return hashlib.shake_256(key).digest(block_bytes)


def make_key(i: int, salt: bytes = b"") -> OffloadKey:
    """A 32-byte test key."""
    return OffloadKey(hashlib.sha256(salt + i.to_bytes(8, "little")).digest())


def requires_tier(name: str) -> pytest.MarkDecorator:
    """A skip marker for tests that need the secondary tier ``name`` installed."""
    return pytest.mark.skipif(
        name not in SecondaryTierFactory.known_names(),
        reason=f"tier {name!r} is not installed in this environment",
    )


def wait_for_jobs(
    tier: SecondaryTierManager, job_ids: Iterable[int], timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[int, bool]:
    """Poll ``tier.get_finished()`` until every job in ``job_ids`` is reported.

    Returns:
        job id -> success.

    Raises:
        AssertionError: a job is reported twice, an unknown job is reported,
            or the timeout passes first (a hang).
    """
    wanted = set(job_ids)
    results: dict[int, bool] = {}
    deadline = time.monotonic() + timeout_s
    while set(results) != wanted:
        for result in tier.get_finished():
            assert isinstance(result, JobResult), result
            assert result.job_id in wanted, f"unknown job {result.job_id} reported"
            assert result.job_id not in results, f"job {result.job_id} reported twice"
            results[result.job_id] = result.success
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs {sorted(wanted - set(results))} not reported within {timeout_s}s")
        time.sleep(0.001)
    return results


def wait_for_lookup(
    tier: SecondaryTierManager, key: OffloadKey, ctx: ReqContext, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """Ask ``tier.lookup`` until it answers True or False (not None)."""
    deadline = time.monotonic() + timeout_s
    while (verdict := tier.lookup(key, ctx)) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"lookup of {key.hex()} still pending after {timeout_s}s")
        time.sleep(0.001)
    return verdict


class TierConformanceTests:
    """The tier contract, as pytest tests. Subclass and provide ``tier_config``.

    Class attributes a subclass may override: ``num_blocks`` (primary slots)
    and ``block_bytes``.
    """

    num_blocks = 16
    block_bytes = 16 * 1024
    _job_ids = itertools.count(1)

    @pytest.fixture
    def tier_config(self) -> dict[str, Any]:
        """The tier's ``secondary_tiers`` entry; subclasses must override."""
        raise NotImplementedError("subclasses provide the tier_config fixture")

    @pytest.fixture
    def spec(self) -> OffloadingSpec:
        return OffloadingSpec(
            {
                "cpu_bytes_to_use": self.num_blocks * self.block_bytes,
                "block_bytes": self.block_bytes,
                "model": "conformance/model",
            }
        )

    @pytest.fixture
    def primary_kv_view(self) -> memoryview:
        return allocate_host_buffer(self.num_blocks, self.block_bytes)

    @pytest.fixture
    def tier(
        self, tier_config: dict[str, Any], spec: OffloadingSpec, primary_kv_view: memoryview
    ) -> Iterator[SecondaryTierManager]:
        tier = create_secondary_tier(tier_config, primary_kv_view, spec)
        yield tier
        tier.shutdown()

    # -- helpers ------------------------------------------------------------
    def job(self, keys: list[OffloadKey], block_ids: list[int], is_promotion: bool) -> JobMetadata:
        return JobMetadata(next(self._job_ids), keys, block_ids, is_promotion, ReqContext("conformance"))

    def fill(self, view: memoryview, keys: list[OffloadKey], block_ids: list[int]) -> None:
        for key, block_id in zip(keys, block_ids, strict=True):
            block_view(view, block_id)[:] = block_payload(key, self.block_bytes)

    def store(self, tier: SecondaryTierManager, view: memoryview, keys: list[OffloadKey]) -> None:
        block_ids = list(range(len(keys)))
        self.fill(view, keys, block_ids)
        job = self.job(keys, block_ids, False)
        tier.submit_store(job)
        assert wait_for_jobs(tier, [job.job_id]) == {job.job_id: True}

    # -- the contract -------------------------------------------------------
    def test_round_trip_is_byte_exact(self, tier: SecondaryTierManager, primary_kv_view: memoryview) -> None:
        keys = [make_key(i, b"round-trip") for i in range(self.num_blocks // 2)]
        self.store(tier, primary_kv_view, keys)
        ctx = ReqContext("r")
        assert all(wait_for_lookup(tier, k, ctx) for k in keys)
        targets = list(range(self.num_blocks - 1, self.num_blocks - 1 - len(keys), -1))
        for block_id in targets:
            block_view(primary_kv_view, block_id)[:] = bytes(self.block_bytes)
        job = self.job(keys, targets, True)
        tier.submit_load(job)
        assert wait_for_jobs(tier, [job.job_id]) == {job.job_id: True}
        for key, block_id in zip(keys, targets, strict=True):
            assert block_view(primary_kv_view, block_id).tobytes() == block_payload(key, self.block_bytes)

    def test_absent_key_looks_up_false(self, tier: SecondaryTierManager) -> None:
        assert wait_for_lookup(tier, make_key(0, b"never-stored"), ReqContext("r")) is False

    def test_missing_key_load_fails(self, tier: SecondaryTierManager) -> None:
        job = self.job([make_key(1, b"never-stored")], [0], True)
        tier.submit_load(job)
        assert wait_for_jobs(tier, [job.job_id]) == {job.job_id: False}

    def test_partly_missing_load_fails(self, tier: SecondaryTierManager, primary_kv_view: memoryview) -> None:
        present = make_key(0, b"partly")
        self.store(tier, primary_kv_view, [present])
        job = self.job([present, make_key(1, b"partly-absent")], [2, 3], True)
        tier.submit_load(job)
        assert wait_for_jobs(tier, [job.job_id]) == {job.job_id: False}

    def test_store_of_present_key_succeeds(self, tier: SecondaryTierManager, primary_kv_view: memoryview) -> None:
        keys = [make_key(i, b"twice") for i in range(2)]
        self.store(tier, primary_kv_view, keys)
        self.store(tier, primary_kv_view, keys)
        assert all(wait_for_lookup(tier, k, ReqContext("r")) for k in keys)

    def test_every_job_reported_exactly_once(self, tier: SecondaryTierManager, primary_kv_view: memoryview) -> None:
        keys = [make_key(i, b"many") for i in range(self.num_blocks)]
        self.fill(primary_kv_view, keys, list(range(self.num_blocks)))
        stores = [self.job([k], [i], False) for i, k in enumerate(keys)]
        for job in stores:
            tier.submit_store(job)
        loads = [self.job([make_key(i, b"many-absent")], [i], True) for i in range(4)]
        for job in loads:
            tier.submit_load(job)
        results = wait_for_jobs(tier, [j.job_id for j in stores + loads])
        assert [results[j.job_id] for j in stores] == [True] * len(stores)
        assert [results[j.job_id] for j in loads] == [False] * len(loads)
        time.sleep(0.05)
        assert list(tier.get_finished()) == []

    def test_in_flight_lookup_is_never_a_wrong_true(
        self, tier: SecondaryTierManager, primary_kv_view: memoryview
    ) -> None:
        keys = [make_key(i, b"in-flight") for i in range(self.num_blocks // 2)]
        self.fill(primary_kv_view, keys, list(range(len(keys))))
        job = self.job(keys, list(range(len(keys))), False)
        tier.submit_store(job)
        ctx = ReqContext("r")
        verdicts = [tier.lookup(k, ctx) for k in keys]
        assert all(v in (None, True, False) for v in verdicts)
        loadable = [k for k, v in zip(keys, verdicts, strict=True) if v is True]
        wait_for_jobs(tier, [job.job_id])
        if loadable:
            target = self.num_blocks - 1
            block_view(primary_kv_view, target)[:] = bytes(self.block_bytes)
            load = self.job(loadable[:1], [target], True)
            tier.submit_load(load)
            assert wait_for_jobs(tier, [load.job_id]) == {load.job_id: True}
            assert block_view(primary_kv_view, target).tobytes() == block_payload(loadable[0], self.block_bytes)

    def test_shutdown_with_jobs_in_flight_reports_them(
        self, tier: SecondaryTierManager, primary_kv_view: memoryview
    ) -> None:
        keys = [make_key(i, b"shutdown") for i in range(self.num_blocks)]
        self.fill(primary_kv_view, keys, list(range(self.num_blocks)))
        jobs = [self.job([k], [i], False) for i, k in enumerate(keys)]
        for job in jobs:
            tier.submit_store(job)
        tier.shutdown()
        results = wait_for_jobs(tier, [j.job_id for j in jobs])
        assert set(results) == {j.job_id for j in jobs}

    def test_tier_type_is_injected(self, tier: SecondaryTierManager, tier_config: dict[str, Any]) -> None:
        assert tier.tier_type == tier_config["type"]

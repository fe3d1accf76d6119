"""Test suites shipped in the wheel (after fsspec's ``tests/abstract``), and the shared test helpers.

- :class:`TierConformanceTests`: the tier contract; every tier's tests subclass it.
- (the inspector suite, ``tiering ls/stat/gc/verify`` through a persistent tier's inspector, is the
  command's: :class:`tiering.cli.testing.InspectorConformanceTests` in tiering-cli.)
- helpers (``make_key``, ``block_payload``, ``make_spec``, ``store_blocks``, ``load_blocks``,
  ``wait_for_jobs``, ``wait_until``...), re-exported from the runtime module
  :mod:`tiering.testing.harness` so that benchmarks need no pytest.

The distribution tiering-testing (``pip install tiering-testing``, which brings pytest);
the helpers import without pytest (a benchmark needs none), the suite and
:func:`requires_tier` / :func:`requires_vllm` on first use::

    from tiering.testing import TierConformanceTests

    class TestMyTier(TierConformanceTests):
        @pytest.fixture
        def tier_config(self, tmp_path):
            return {"type": "mytier", "root": str(tmp_path)}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from tiering.testing.conformance import TierConformanceTests, requires_tier, requires_vllm


def __getattr__(name: str) -> Any:
    """The pytest parts (:class:`TierConformanceTests`, :func:`requires_tier`, :func:`requires_vllm`), on first use.

    Imported lazily (PEP 562): the helpers need no pytest.
    """
    if name in ("TierConformanceTests", "requires_tier", "requires_vllm"):
        from tiering.testing import conformance

        value = getattr(conformance, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    "requires_vllm",
    "store_blocks",
    "store_job",
    "wait_for_jobs",
    "wait_for_lookup",
    "wait_for_results",
    "wait_until",
]

"""The bench's ``throttled_fs`` tier: built from a config entry alone (by ``module_path``), its keys checked by name."""

from __future__ import annotations

from typing import Any

import pytest

from tiering.core.factory import create_secondary_tier
from tiering.core.schema import InvalidTypeError, InvalidValueError, MissingKeyError, UnknownKeyError
from tiering.testing import make_spec, requires_tier, requires_vllm

pytestmark = requires_tier("fs")

BLOCK = 16 * 1024


def view() -> memoryview:
    return memoryview(bytearray(4 * BLOCK)).cast("B", (4, BLOCK))


MODULE = "tiering.cli.bench.throttled_fs"


def build(entry: dict[str, Any]) -> Any:
    spec = make_spec(BLOCK, 4)
    return create_secondary_tier({"type": "throttled_fs", "module_path": MODULE, **entry}, view(), spec)


def test_factory_builds_the_fs_tier_throttled_as_the_entry_says(tmp_path: Any) -> None:
    from tiering.cli.bench.throttled_fs import ThrottledFsTier
    from tiering.fs import FsspecSecondaryTierManager

    tier = build({"root": str(tmp_path), "latency_s": 0.03, "bytes_per_s": "6MiB", "n_read_threads": 2})
    try:
        assert type(tier) is ThrottledFsTier
        assert (tier.latency_s, tier.bytes_per_s) == (0.03, 6.0 * 2**20)
        assert type(tier.inner) is FsspecSecondaryTierManager
        assert tier.inner.n_read_threads == 2
        assert tier.tier_type == "throttled_fs"
    finally:
        tier.shutdown()


def test_bandwidth_defaults_to_unlimited(tmp_path: Any) -> None:
    tier = build({"root": str(tmp_path), "latency_s": 0})
    try:
        assert (tier.latency_s, tier.bytes_per_s) == (0.0, None)
    finally:
        tier.shutdown()


@pytest.mark.parametrize(
    ("keys", "error", "where"),
    [
        ({}, MissingKeyError, "secondary_tiers[0].latency_s"),
        ({"latency_s": -1}, InvalidValueError, "secondary_tiers[0].latency_s"),
        ({"latency_s": "soon"}, InvalidValueError, "secondary_tiers[0].latency_s"),
        ({"latency_s": 0.1, "bytes_per_s": 0}, InvalidValueError, "secondary_tiers[0].bytes_per_s"),
        ({"latency_s": 0.1, "bytes_per_s": "fast"}, InvalidValueError, "secondary_tiers[0].bytes_per_s"),
        ({"latency_s": 0.1, "bytes_per_s": [1]}, InvalidTypeError, "secondary_tiers[0].bytes_per_s"),
        ({"latency_s": 0.1, "latency": 1}, UnknownKeyError, "secondary_tiers[0].latency"),
        ({"latency_s": 0.1, "n_read_threads": 0}, InvalidValueError, "secondary_tiers[0].n_read_threads"),
    ],
)
def test_bad_keys_are_named(tmp_path: Any, keys: dict[str, Any], error: type[Exception], where: str) -> None:
    with pytest.raises(error) as raised:
        build({"root": str(tmp_path), **keys})
    assert str(raised.value).startswith(f"{where}: ")
    assert "'throttled_fs'" in str(raised.value)


def test_missing_root_is_named() -> None:
    with pytest.raises(MissingKeyError, match=r"^secondary_tiers\[0\]\.root: required"):
        build({"latency_s": 0.1})


def test_direct_construction_checks_the_throttle_keys() -> None:
    from tiering.cli.bench.throttled_fs import ThrottledFsTier

    with pytest.raises(InvalidValueError, match=r"^tier 'throttled_fs': bytes_per_s: must be"):
        ThrottledFsTier(make_spec(BLOCK, 4), view(), "throttled_fs", latency_s=0, bytes_per_s=-5)


@requires_vllm()
def test_vllm_factory_builds_it_from_json_alone(tmp_path: Any) -> None:
    from tiering.cli.bench.throttled_fs import ThrottledFsTier
    from tiering.testing import vllm_driver

    entry = {"type": "tiering_throttled_fs", "module_path": MODULE, "root": str(tmp_path)}
    extra = {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8 * BLOCK,
        "secondary_tiers": [{**entry, "latency_s": 0.25, "bytes_per_s": "1MiB"}],
    }
    with vllm_driver.vllm_manager(extra, worker_kv_bytes_per_block=BLOCK) as (_spec, manager, _driver):
        (tier,) = manager.secondary_tiers
        assert tier.medium.name == "STORAGE"
        assert type(tier.tier) is ThrottledFsTier
        assert (tier.tier.latency_s, tier.tier.bytes_per_s) == (0.25, float(2**20))


def test_without_the_fs_tier_building_one_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from tiering.cli.bench.throttled_fs import ThrottledFsTier

    monkeypatch.setattr(ThrottledFsTier, "config_schema", None)  # what the class holds when tiering-fs is absent
    with pytest.raises(ImportError, match="pip install tiering-fs"):
        ThrottledFsTier(make_spec(BLOCK, 4), view(), "throttled_fs", latency_s=0, root=str(tmp_path))

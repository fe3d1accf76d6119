import logging

import pytest

from tiering.core import JobMetadata, ReqContext, block_view
from tiering.example import ExampleSecondaryTierManager
from tiering.testing import TierConformanceTests, make_key


class TestExampleConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self):
        return {"type": "example", "custom_param": 7}


def test_custom_param_is_logged_and_kept(spec_view, caplog):
    spec, view = spec_view
    with caplog.at_level(logging.INFO, logger="tiering.example.tier"):
        tier = ExampleSecondaryTierManager(spec, view, "example", custom_param=7)
    assert tier.custom_param == 7
    assert "custom_param=7" in caplog.text


def test_custom_param_must_be_int(spec_view):
    spec, view = spec_view
    with pytest.raises(TypeError, match="custom_param"):
        ExampleSecondaryTierManager(spec, view, "example", custom_param="7")


def test_stats_count_resident_blocks(spec_view):
    spec, view = spec_view
    tier = ExampleSecondaryTierManager(spec, view, "example")
    tier.submit_store(JobMetadata(1, [make_key(1), make_key(2)], [0, 1], False, ReqContext("r")))
    assert [r.success for r in tier.get_finished()] == [True]
    stats = tier.stats()
    assert (stats["resident_blocks"], stats["resident_bytes"], stats["in_flight_jobs"]) == (2, 2 * spec.block_bytes, 0)


def test_failed_load_keeps_the_blocks_it_copied(spec_view):
    spec, view = spec_view
    tier = ExampleSecondaryTierManager(spec, view, "example")
    block_view(tier.primary_kv_view, 0)[:] = b"\x01" * spec.block_bytes
    block_view(tier.primary_kv_view, 1)[:] = b"\x02" * spec.block_bytes
    tier.submit_store(JobMetadata(1, [make_key(1), make_key(2)], [0, 1], False, ReqContext("r")))
    assert [r.success for r in tier.get_finished()] == [True]
    tier.submit_load(JobMetadata(2, [make_key(1), make_key(9), make_key(2)], [2, 3, 1], True, ReqContext("r")))
    (result,) = tier.get_finished()
    assert (result.job_id, result.success) == (2, False)
    assert list(result.successful_keys) == [make_key(1), make_key(2)]
    assert bytes(block_view(tier.primary_kv_view, 2)) == b"\x01" * spec.block_bytes
    assert tier.stats()["load_jobs_failed"] == 1


def test_stores_publish_kv_events_once_per_new_block(spec_view):
    spec, view = spec_view
    tier = ExampleSecondaryTierManager(spec, view, "example")
    tier.submit_store(JobMetadata(1, [make_key(1), make_key(2)], [0, 1], False, ReqContext("r")))
    tier.submit_store(JobMetadata(2, [make_key(2), make_key(3)], [1, 2], False, ReqContext("r")))
    events = tier.take_events()
    assert [(type(e).__name__, list(e.keys), e.medium, e.tier) for e in events] == [
        ("TierCleared", [], "cpu", "example"),  # the start-up clear: nothing held yet
        ("BlockStored", [make_key(1), make_key(2)], "cpu", "example"),
        ("BlockStored", [make_key(3)], "cpu", "example"),
    ]
    assert tier.take_events() == []


def test_schema_checks_values_without_building_the_tier():
    from tiering.core.schema import InvalidTypeError

    assert ExampleSecondaryTierManager.config_schema.validate({"type": "example"}) == {"custom_param": 0}
    with pytest.raises(InvalidTypeError, match=r"secondary_tiers\[2\].custom_param"):
        ExampleSecondaryTierManager.config_schema.validate({"custom_param": "7"}, entry="secondary_tiers[2]")


@pytest.fixture
def spec_view():
    from tiering.core import OffloadingSpec
    from tiering.core.primary import allocate_host_buffer

    spec = OffloadingSpec({"cpu_bytes_to_use": 4 * 4096, "block_bytes": 4096})
    return spec, allocate_host_buffer(4, 4096)


def test_config_declared_once_names_and_defaults():
    from tiering.core.declared import declaration_drift

    assert declaration_drift(ExampleSecondaryTierManager.config_schema, ExampleSecondaryTierManager) == []
    assert ExampleSecondaryTierManager.config_schema.defaults() == {"custom_param": 0}

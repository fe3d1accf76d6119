import logging

import pytest

from tiering.core import ReqContext
from tiering.core.testing import TierConformanceTests, make_key
from tiering.example import ExampleSecondaryTierManager


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
    from tiering.core import JobMetadata

    tier.submit_store(JobMetadata(1, [make_key(1), make_key(2)], [0, 1], False, ReqContext("r")))
    assert [r.success for r in tier.get_finished()] == [True]
    assert tier.stats() == {"resident_blocks": 2, "resident_bytes": 2 * spec.block_bytes}


@pytest.fixture
def spec_view():
    from tiering.core import OffloadingSpec
    from tiering.core.primary import allocate_host_buffer

    spec = OffloadingSpec({"cpu_bytes_to_use": 4 * 4096, "block_bytes": 4096})
    return spec, allocate_host_buffer(4, 4096)

import pytest

from tiering.testing import TierConformanceTests


class TestS3Conformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self, s3):
        return s3.tier_config()


class TestS3ConformanceWithCapacityAndNoHead(TierConformanceTests):
    """The contract also holds with a byte cap and without the HEAD fallback."""

    @pytest.fixture
    def tier_config(self, s3):
        return s3.tier_config(capacity_bytes=64 * (16 * 1024 + 128), head_fallback=False, max_concurrency=2)

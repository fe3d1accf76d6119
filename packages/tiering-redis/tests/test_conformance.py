import pytest

from tiering.testing import TierConformanceTests


class TestRedisConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self, redis_server, prefix):
        return {"type": "redis", "url": redis_server.url, "prefix": prefix}


class TestRedisClusterConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self, redis_cluster, prefix):
        return {"type": "redis", "mode": "cluster", "url": redis_cluster.url, "prefix": prefix}


def sentinel_config(redis_sentinel, prefix, **extra):
    """A redis tier config through the test's Sentinel, plus ``extra`` keys."""
    return {
        "type": "redis",
        "mode": "sentinel",
        "sentinels": redis_sentinel.sentinels,
        "service_name": redis_sentinel.service_name,
        "prefix": prefix,
        **extra,
    }


class TestRedisSentinelConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self, redis_sentinel, prefix):
        return sentinel_config(redis_sentinel, prefix)


class TestRedisConformanceTierEviction(TierConformanceTests):
    """The contract also holds with the tier as eviction authority, small pipelines and few connections."""

    @pytest.fixture
    def tier_config(self, redis_server, prefix):
        return {
            "type": "redis",
            "url": redis_server.url,
            "prefix": prefix,
            "eviction": "tier",
            "capacity_bytes": 64 * (16 * 1024 + 128),
            "pipeline_blocks": 2,
            "max_connections": 2,
        }


class TestRedisConformanceProcessEviction(TierConformanceTests):
    """The per-process cap (``eviction: "process"``)."""

    @pytest.fixture
    def tier_config(self, redis_server, prefix):
        return {
            "type": "redis",
            "url": redis_server.url,
            "prefix": prefix,
            "eviction": "process",
            "capacity_bytes": 64 * (16 * 1024 + 128),
        }


class TestRedisClusterConformanceTierEviction(TierConformanceTests):
    """The fleet-wide cap on a cluster (its LRU set in one slot, the blocks in every slot)."""

    @pytest.fixture
    def tier_config(self, redis_cluster, prefix):
        return {
            "type": "redis",
            "mode": "cluster",
            "url": redis_cluster.url,
            "prefix": prefix,
            "eviction": "tier",
            "capacity_bytes": 64 * (16 * 1024 + 128),
        }


class TestRedisSentinelConformanceTierEviction(TierConformanceTests):
    """The fleet-wide cap through a Sentinel-managed primary."""

    @pytest.fixture
    def tier_config(self, redis_sentinel, prefix):
        return sentinel_config(redis_sentinel, prefix, eviction="tier", capacity_bytes=64 * (16 * 1024 + 128))

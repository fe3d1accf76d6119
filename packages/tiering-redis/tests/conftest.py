"""Real Redis servers for the tests: Debian's redis-server / redis-sentinel on 127.0.0.1, no persistence."""

import uuid

import pytest

from tiering.redis.testing import LocalCluster, LocalRedis, LocalSentinel, have_redis_server

needs_server = pytest.mark.skipif(not have_redis_server(), reason="redis-server is not installed")


@pytest.fixture(scope="session")
def redis_server():
    if not have_redis_server():
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with LocalRedis() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster():
    if not have_redis_server():
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with LocalCluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_sentinel():
    if not have_redis_server():
        pytest.skip("redis-server is not installed")
    with LocalSentinel() as sentinel:
        yield sentinel


@pytest.fixture
def prefix():
    """A prefix of its own per test, so tests sharing a server never see each other's blocks."""
    return f"t-{uuid.uuid4().hex[:12]}"

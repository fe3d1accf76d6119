import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tiering.core import OffloadingSpec
from tiering.core.primary import allocate_host_buffer


@pytest.fixture
def small_spec():
    return OffloadingSpec({"cpu_bytes_to_use": 8 * 4096, "block_bytes": 4096, "model": "test/model"})


@pytest.fixture
def small_view():
    return allocate_host_buffer(8, 4096)


HAS_S3 = importlib.util.find_spec("tiering.s3") is not None and importlib.util.find_spec("moto") is not None


@pytest.fixture(scope="module")
def s3_server() -> Iterator[dict[str, Any]]:
    """A moto S3 server on 127.0.0.1 with the bucket ``tiering-kv``: its connection keys plus ``client`` (boto3)."""
    if not HAS_S3:
        pytest.skip("tiering-s3 or moto is not installed")
    from tiering.s3.testing import moto_server

    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    with moto_server("tiering-kv") as server:
        yield {**server.connection(), "client": server.client()}

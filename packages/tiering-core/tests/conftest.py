import pytest

from tiering.core import OffloadingSpec
from tiering.core.primary import allocate_host_buffer


@pytest.fixture
def small_spec():
    return OffloadingSpec({"cpu_bytes_to_use": 8 * 4096, "block_bytes": 4096, "model": "test/model"})


@pytest.fixture
def small_view():
    return allocate_host_buffer(8, 4096)

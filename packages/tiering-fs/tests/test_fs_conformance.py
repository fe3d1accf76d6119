import uuid

import fsspec
import pytest

from tiering.testing import TierConformanceTests


@pytest.mark.usefixtures("io_path")
class TestFsLocalConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self, tmp_path):
        return {"type": "fs", "root": str(tmp_path / "kv"), "n_read_threads": 2, "n_write_threads": 2}


class TestFsFileUrlCappedConformance(TierConformanceTests):
    """file:// URL, a cap of 64 stored blocks (larger than any test's working set)."""

    @pytest.fixture
    def tier_config(self, tmp_path):
        return {"type": "fs", "root": f"file://{tmp_path}/kv", "capacity_bytes": 64 * (self.block_bytes + 4096)}


class TestFsMemoryConformance(TierConformanceTests):
    @pytest.fixture
    def tier_config(self):
        root = f"memory://tiering-conf-{uuid.uuid4().hex}"
        yield {"type": "fs", "root": root}
        fs = fsspec.filesystem("memory")
        if fs.exists(root):
            fs.rm(root, recursive=True)

"""The docs followed literally by a new user (issue 15): the out-of-tree guide, run as written."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "content" / "out-of-tree.md"
EXE = Path(sys.executable).parent / "tiering"


def fenced(lang):
    return [body for kind, body in re.findall(r"^```(\w+)\n(.*?)^```", GUIDE.read_text(), re.S | re.M) if kind == lang]


def guide_directory(tmp_path):
    """my_tiers.py (the guide's first sample), config.json and test_my_tiers.py, in one directory."""
    python = fenced("python")
    (tmp_path / "my_tiers.py").write_text(python[0])
    (tmp_path / "test_my_tiers.py").write_text(
        next(b for b in python if "class TestDictTier(TierConformanceTests)" in b)
    )
    (tmp_path / "config.json").write_text(next(b for b in fenced("json") if '"module_path": "my_tiers"' in b))
    return tmp_path


def run(cmd, cwd, **env):
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**environ, **env}, timeout=300)


def test_guide_check_command_works_as_written_and_the_error_without_it_names_pythonpath(tmp_path):
    folder = guide_directory(tmp_path)
    assert "PYTHONPATH=. .venv/bin/tiering check config.json\n" in fenced("console")
    proc = run([str(EXE), "check", "config.json"], folder)
    assert proc.returncode == 2
    assert "No module named 'my_tiers'" in proc.stderr and "PYTHONPATH" in proc.stderr
    proc = run([str(EXE), "check", "config.json"], folder, PYTHONPATH=".")
    assert proc.returncode == 0, proc.stderr
    assert "secondary_tiers[0] type 'DictTier': my_tiers.DictTier" in proc.stdout


def test_guide_conformance_example_tests_the_guides_own_tier_and_passes(tmp_path):
    folder = guide_directory(tmp_path)
    assert '{"type": "DictTier", "module_path": "my_tiers"}' in (folder / "test_my_tiers.py").read_text()
    proc = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_tiers.py"], folder, PYTHONPATH="."
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", proc.stdout) and " failed" not in proc.stdout


def test_guide_inspector_sample_flips_a_payload_byte_that_verification_catches(tmp_path):
    import pytest

    from tiering.core.format import HEADER_SIZE, CorruptBlockError, encode_block, verify_block
    from tiering.core.inspection import BlockInfo

    namespace = {}
    exec(next(b for b in fenced("python") if "class TestMyInspector" in b), namespace)
    key, digest, payload = b"k" * 32, b"d" * 16, bytes(range(256)) * 16
    path = tmp_path / "block.kvb"
    path.write_bytes(encode_block(digest, key, payload))
    block = BlockInfo(name=str(path), key=key, size=path.stat().st_size, mtime=0.0)
    namespace["TestMyInspector"]().corrupt_block({}, digest.hex(), block, "flip")
    data = path.read_bytes()
    assert len(data) == HEADER_SIZE + len(payload)
    assert [i for i, (a, b) in enumerate(zip(data, encode_block(digest, key, payload))) if a != b] == [HEADER_SIZE + 10]
    with pytest.raises(CorruptBlockError, match="payload checksum"):
        verify_block(data[:HEADER_SIZE], data[HEADER_SIZE:], digest, key)

"""Case C22: ``capacity_bytes`` above what the filesystem holds; once it is full the tier evicts and keeps storing.

A write refused with ``ENOSPC`` lowers the cap in force to what the filesystem holds (``stats()``:
``capacity_bytes``; ``configured_capacity_bytes`` keeps the configured one) and the block is stored after an
eviction. Two disks: a fault-injecting one (the pure-Python write primitive refuses past a byte budget; no
root needed) and a real 20 MiB tmpfs (root only), on both I/O paths.
"""

import errno
import os
import subprocess
import threading
from pathlib import Path

import pytest

from tiering.core import JobMetadata
from tiering.core.base import block_view
from tiering.fs import FsspecSecondaryTierManager
from tiering.fs.io.local import LocalBackend
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.testing import BB, CTX, loads_exact, make_spec, store
from tiering.testing import make_key
from tiering.testing.harness import block_payload, next_job_id, wait_for_jobs

STORED = BB + TRAILER_BYTES
MIB = 1 << 20


def _block_bytes_on_disk(root):
    return sum(p.stat().st_size for p in Path(root).rglob("*.kvb*") if p.is_file())


@pytest.mark.usefixtures("python_io")
@pytest.mark.parametrize("capacity", [100 * STORED, None], ids=["capped", "unbounded"])
def test_c22_full_disk_lowers_the_cap_and_stores_go_on(tmp_path, open_tier, monkeypatch, capacity):
    disk = 6 * STORED  # what the fake filesystem holds for block files
    real_pwritev = os.pwritev

    def pwritev(fd, buffers, offset):
        if _block_bytes_on_disk(tmp_path) + sum(len(b) for b in buffers) > disk:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    monkeypatch.setattr(
        LocalBackend, "free_bytes", lambda self, path: disk - _block_bytes_on_disk(tmp_path), raising=False
    )
    tier, view = open_tier(tmp_path, capacity_bytes=capacity, n_read_threads=1, n_write_threads=1)
    keys = [make_key(i, b"c22") for i in range(30)]
    assert [store(tier, view, [key]) for key in keys] == [True] * 30  # never frozen into refusing stores
    s = tier.stats()
    assert (s["capacity_bytes"], s["configured_capacity_bytes"]) == (disk, capacity or 0)
    assert (s["disk_full_stores"], s["store_failures"], s["evictions"]) == (1, 0, 24)
    assert s["resident_blocks"] == 6 and s["used_bytes"] == _block_bytes_on_disk(tmp_path) == disk
    assert loads_exact(tier, view, keys[-6:])


@pytest.mark.usefixtures("python_io")
def test_c22_a_disk_that_stays_full_fails_the_store_once_retried(tmp_path, open_tier, monkeypatch):
    def pwritev(fd, buffers, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    tier, view = open_tier(tmp_path, capacity_bytes=100 * STORED)
    monkeypatch.setattr(os, "pwritev", pwritev)
    monkeypatch.setattr(LocalBackend, "free_bytes", lambda self, path: 0, raising=False)
    assert store(tier, view, [make_key(1, b"c22-full")]) is False  # bounded: one retry, then no_space
    s = tier.stats()
    assert (s["store_failed_no_space"], s["disk_full_stores"], s["capacity_bytes"]) == (1, 2, STORED)
    assert list(Path(tmp_path).rglob("*.tmp.*")) == []


@pytest.fixture
def tmpfs(tmp_path):
    """A 20 MiB tmpfs mounted under ``tmp_path`` (root only; skipped elsewhere)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.usefixtures("io_path")
def test_c22_tmpfs_of_20_mib_under_a_100_mib_cap_keeps_storing(tmpfs, open_tier):
    block_bytes = 256 * 1024
    stored = block_bytes + TRAILER_BYTES
    tier, view = open_tier(tmpfs, spec=make_spec(block_bytes), capacity_bytes=100 * MIB)
    try:
        keys = [make_key(i, b"c22-tmpfs") for i in range(240)]  # three times what the disk holds
        outcomes = [store(tier, view, keys[i : i + 8]) for i in range(0, len(keys), 8)]
        s = tier.stats()
        assert all(outcomes[-10:]), outcomes  # stores go on after the disk filled up
        assert s["store_failures"] <= 8, s  # at most a few blocks in flight when the disk first refused
        # every block stored beyond what the disk holds evicted one (a refused store evicted nothing)
        assert s["disk_full_stores"] >= 1 and s["evictions"] >= len(keys) - s["store_failures"] - 20 * MIB // stored
        assert 10 * MIB < s["capacity_bytes"] <= 20 * MIB and s["configured_capacity_bytes"] == 100 * MIB
        assert s["used_bytes"] == s["resident_bytes"] == _block_bytes_on_disk(tmpfs)
        assert loads_exact(tier, view, keys[-8:])
    finally:
        tier.shutdown()  # before the unmount: the tier keeps its directories open


def test_c22_probe_says_the_cap_follows_a_full_disk(tmp_path):
    free = 1 << 50  # more than any disk here has free
    found = FsspecSecondaryTierManager.probe({"type": "fs", "root": str(tmp_path / "kv"), "capacity_bytes": free})
    assert f"capacity_bytes {free} is more than the" in found
    assert "once the disk is full the tier lowers its cap to what the disk holds" in found
    fits = FsspecSecondaryTierManager.probe({"type": "fs", "root": str(tmp_path / "kv"), "capacity_bytes": 1 << 20})
    assert "lowers its cap" not in fits
    assert not (tmp_path / "kv").exists()  # a probe creates nothing


@pytest.mark.usefixtures("python_io")
def test_c22_a_write_in_flight_when_the_disk_refuses_does_not_lift_the_cap_above_the_disk(
    tmp_path, open_tier, monkeypatch
):
    # A write in flight holds a reservation of a whole block while the disk still reports its unwritten bytes
    # free: counting both set a cap above what the disk holds (seen on a real tmpfs, one trailer too high).
    disk = 6 * STORED
    real_pwritev = os.pwritev
    held, release, refuse = threading.Event(), threading.Event(), threading.Event()

    def pwritev(fd, buffers, offset):
        if refuse.is_set() and held.is_set():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if refuse.is_set():
            held.set()  # the first write after the resident blocks: stays in flight, nothing written yet
            assert release.wait(60)
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", pwritev)
    monkeypatch.setattr(
        LocalBackend, "free_bytes", lambda self, path: disk - _block_bytes_on_disk(tmp_path), raising=False
    )
    tier, view = open_tier(tmp_path, capacity_bytes=100 * STORED, n_read_threads=1, n_write_threads=2)
    keys = [make_key(i, b"c22-in-flight") for i in range(6)]
    assert store(tier, view, keys[:4])
    refuse.set()
    block_view(view, 4)[:] = block_payload(keys[4], tier.block_bytes)
    in_flight = JobMetadata(next_job_id(), [keys[4]], [4], False, CTX)
    tier.submit_store(in_flight)
    assert held.wait(60)
    assert store(tier, view, [keys[5]], [5]) is False  # refused, retried once, refused again
    assert tier.stats()["capacity_bytes"] == disk  # the 4 resident + the 2 free; the write in flight not twice
    release.set()
    assert wait_for_jobs(tier, [in_flight.job_id])[in_flight.job_id] is True
    s = tier.stats()
    assert s["capacity_bytes"] == disk and s["used_bytes"] == _block_bytes_on_disk(tmp_path) == 5 * STORED

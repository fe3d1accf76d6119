"""Shared-memory primary regions of killed engines are swept at the next start; live ones never."""

import mmap
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tiering.core.primary.regions import OWNERS_SUFFIX, hold_region, sweep_dead_regions

REGION_BYTES = 1 << 20

# An engine process: holds its region first, then creates (or joins) and maps it, writes to it, and waits.
ENGINE = textwrap.dedent(
    """
    import mmap, os, sys, time
    from tiering.core.primary.regions import hold_region
    path = sys.argv[1]
    hold_region(path)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, int(sys.argv[2]))
    region = mmap.mmap(fd, int(sys.argv[2]), flags=mmap.MAP_SHARED)
    region[:5] = b"alive"
    print("mapped", flush=True)
    time.sleep(120)
    """
)


def _engine(path):
    proc = subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(path), str(REGION_BYTES)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "mapped"
    return proc


def _region(directory, engine_id):
    return directory / f"vllm_offload_{engine_id}.mmap"


@pytest.fixture
def engines():
    procs = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_c25_region_of_a_sigkilled_engine_is_removed_at_the_next_start(tmp_path, engines):
    dead, live = _region(tmp_path, "dead"), _region(tmp_path, "live")
    killed = _engine(dead)
    engines.append(_engine(live))
    engines.append(_engine(live))  # a second process of the live engine (a worker) joins its region
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert dead.stat().st_size == REGION_BYTES  # the kill left it behind

    hold = hold_region(str(_region(tmp_path, "next")))  # the next engine starts
    try:
        assert not dead.exists() and not (tmp_path / f"{dead.name}{OWNERS_SUFFIX}").exists()
        assert live.read_bytes()[:5] == b"alive"  # the live engine's region is untouched
        assert (tmp_path / f"{live.name}{OWNERS_SUFFIX}").exists()
        assert sweep_dead_regions(str(tmp_path)) == []  # nothing else to remove

        engines[0].kill()
        engines[0].wait()
        assert sweep_dead_regions(str(tmp_path)) == []  # one process of the live engine still maps it
        assert live.exists()
        engines[1].kill()
        engines[1].wait()
        assert sweep_dead_regions(str(tmp_path)) == [str(live)]  # its last process is gone
    finally:
        hold.release()


def test_c25_a_region_being_created_is_never_swept(tmp_path):
    path = _region(tmp_path, "starting")
    hold = hold_region(str(path))  # held before the file exists, as the binding does before vLLM creates it
    try:
        assert hold_region(str(path)) is hold
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        os.ftruncate(fd, REGION_BYTES)
        with mmap.mmap(fd, REGION_BYTES, flags=mmap.MAP_SHARED):
            assert sweep_dead_regions(str(tmp_path)) == []
            assert path.exists()
        os.close(fd)
    finally:
        hold.release()
    assert sweep_dead_regions(str(tmp_path)) == [str(path)]


def test_c25_regions_without_an_owner_file_and_other_names_are_left_alone(tmp_path):
    foreign = _region(tmp_path, "old")  # written by vLLM alone, or before owner files existed
    foreign.write_bytes(b"x")
    other = tmp_path / f"notes.txt{OWNERS_SUFFIX}"
    other.write_bytes(b"")
    (tmp_path / "notes.txt").write_bytes(b"mine")
    assert sweep_dead_regions(str(tmp_path)) == []
    assert foreign.exists() and (tmp_path / "notes.txt").read_bytes() == b"mine"

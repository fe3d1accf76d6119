"""Atomic publish, several processes, crashes and temporaries."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fs_worker import run_worker

from tiering.core import (
    JobMetadata,
)
from tiering.core.base import block_view
from tiering.fs.layout import HOST, TRAILER_BYTES
from tiering.fs.testing import BB, CTX, block_files, load, loads_exact, make_spec, temp_files
from tiering.testing import block_payload, make_key, wait_for_jobs
from tiering.testing.harness import next_job_id

pytestmark = pytest.mark.usefixtures("io_path")


# -- atomic publish, concurrency, crashes ---------------------------------------------------
@pytest.mark.usefixtures("python_io")
def test_C02_throttled_write_is_never_served_partially(tmp_path, open_tier, monkeypatch):
    bb = 8 * 1024 * 1024
    tier, view = open_tier(tmp_path, spec=make_spec(block_bytes=bb, num_blocks=2), num_blocks=2)
    key = make_key(0, b"c02")
    final = tier.block_path(key)
    real = os.pwritev

    def throttled(fd, bufs, offset):  # at most 1 MiB per call, 20 MiB/s
        time.sleep(0.05)
        first = memoryview(bufs[0])[: 1024 * 1024]
        return real(fd, [first], offset)

    monkeypatch.setattr(os, "pwritev", throttled)
    block_view(view, 0)[:] = block_payload(key, bb)
    sentinel = b"\xab" * bb
    block_view(view, 1)[:] = sentinel
    job = JobMetadata(next_job_id(), [key], [0], False, CTX)
    tier.submit_store(job)
    verdicts, partial_seen, load_result = set(), False, None
    results = {}
    while job.job_id not in results:
        for r in tier.get_finished():
            results[r.job_id] = r.success
        if job.job_id in results:
            break
        verdicts.add(tier.lookup(key, CTX))
        temps = temp_files(tmp_path)
        if temps and not os.path.exists(final):
            partial_seen = partial_seen or any(0 < p.stat().st_size < bb + TRAILER_BYTES for p in temps)
        if load_result is None and partial_seen:
            load_job = JobMetadata(next_job_id(), [key], [1], True, CTX)
            tier.submit_load(load_job)
            load_result = load_job.job_id
        time.sleep(0.01)
    assert results[job.job_id] is True
    assert verdicts == {None}
    assert partial_seen
    assert load_result is not None
    if load_result not in results:
        results.update(wait_for_jobs(tier, [load_result]))
    assert results[load_result] is False
    assert block_view(view, 1).tobytes() == sentinel  # no partial bytes delivered
    assert tier.lookup(key, CTX) is True and os.path.getsize(final) == bb + TRAILER_BYTES
    monkeypatch.undo()
    assert load(tier, view, [key], [1]) and block_view(view, 1).tobytes() == block_payload(key, bb)


def test_C07_eight_processes_open_the_same_new_root_at_once(tmp_path, open_tier):
    root = tmp_path / "new" / "root"
    go = tmp_path / "go"
    salts = ["shared", "shared"] + [f"p{i}" for i in range(2, 8)]
    procs = [
        run_worker(
            {
                "root": str(root),
                "block_bytes": BB,
                "n": 50,
                "salt": s,
                "go_file": str(go),
                "tier": {"n_write_threads": 2, "n_read_threads": 1},
            }
        )
        for s in salts
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    go.touch()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, outs
    assert temp_files(root) == []
    tier, view = open_tier(root)
    keys = [make_key(i, s.encode()) for s in sorted(set(salts)) for i in range(50)]
    assert len(block_files(root)) == len(keys) == 350
    assert all(tier.lookup(k, CTX) for k in keys)
    assert loads_exact(tier, view, keys)


def test_kill_9_mid_store_leaves_nothing_servable(tmp_path, open_tier):
    worker = run_worker({"root": str(tmp_path), "block_bytes": BB, "n": 5, "salt": "k9", "hang": True})
    lines = [worker.stdout.readline().strip() for _ in range(3)]
    assert lines == ["ready", "stored", "hanging"]
    temps = temp_files(tmp_path)
    assert len(temps) == 1 and temps[0].stat().st_size == 4096
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)  # reaped: the pid is gone, so its temporaries are removed at once
    tier, view = open_tier(tmp_path)
    assert tier.wait_for_scan(10)
    assert temp_files(tmp_path) == [] and tier.stats()["temps_removed"] == 1
    hung = make_key(0, b"hang")
    assert tier.lookup(hung, CTX) is False
    assert load(tier, view, [hung]) is False
    assert loads_exact(tier, view, [make_key(i, b"k9") for i in range(5)])


def test_stale_temporaries_are_removed_only_when_safe(tmp_path, open_tier):
    tier, _ = open_tier(tmp_path)
    shard = Path(tier.namespace_dir) / "ab" / "cd"
    shard.mkdir(parents=True)
    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    host = HOST
    names = {
        "dead_owner": f"aa.kvb.tmp.{host}.{dead_pid.pid}.1f",
        "live_owner": f"bb.kvb.tmp.{host}.{os.getppid()}.2f",
        "other_host_young": "cc.kvb.tmp.elsewhere.1.3f",
        "other_host_old": "dd.kvb.tmp.elsewhere.1.4f",
    }
    for name in names.values():
        (shard / name).write_bytes(b"x" * 10)
    old = time.time() - 3600
    os.utime(shard / names["other_host_old"], (old, old))
    tier.shutdown()
    tier2, _ = open_tier(tmp_path, stale_temp_s=600)
    assert tier2.wait_for_scan(10)
    left = {p.name for p in shard.iterdir()}
    assert left == {names["live_owner"], names["other_host_young"]}
    assert tier2.stats()["temps_removed"] == 2


# -- shard directory descriptors ------------------------------------------------------------------


def _open_dirs(under: Path) -> int:
    """Descriptors of this process open on shard directories (two levels) below ``under``."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
        n += target.parent.parent == under
    return n


def test_shard_directory_removed_under_the_tier_is_recreated_and_descriptors_are_closed(tmp_path, open_tier):
    import shutil

    from tiering.fs.testing import store

    root = tmp_path / "kv"
    tier, view = open_tier(root)
    keys = [make_key(i, b"dirs") for i in range(8)]
    assert store(tier, view, keys)
    assert _open_dirs(root) == len({Path(tier.block_path(k)).parent for k in keys})  # one per shard, kept
    shard = Path(tier.block_path(keys[0])).parent
    shutil.rmtree(shard)  # a cleanup by hand: the kept descriptor now names a removed directory
    gone = [k for k in keys if Path(tier.block_path(k)).parent == shard]
    assert load(tier, view, gone[:1], [9]) is False  # a vanished block: a miss, nothing else
    assert store(tier, view, gone) and all(Path(tier.block_path(k)).is_file() for k in gone)
    assert loads_exact(tier, view, keys)
    tier.shutdown()
    assert _open_dirs(root) == 0

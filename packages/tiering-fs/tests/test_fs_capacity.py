"""Restart and capacity of the fs tier."""

import logging
import re
import time

import fsspec
import pytest
from fs_worker import run_worker

from tiering.core import JobMetadata
from tiering.core.base import block_view
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.testing import (
    BB,
    CTX,
    block_files,
    count_calls,
    hold_every_thread,
    loads_exact,
    make_spec,
    store,
    store_many,
)
from tiering.testing import block_payload, make_key, wait_for_jobs

# -- restart, capacity -------------------------------------------------------------------


def test_C04_restart_in_new_process_reuses_every_block(tmp_path, open_tier, caplog):
    bb = 256 * 1024
    worker = run_worker({"root": str(tmp_path), "block_bytes": bb, "n": 100, "salt": "c04"})
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0 and "stored" in out
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in block_files(tmp_path)}
    assert len(before) == 100
    with caplog.at_level(logging.INFO, logger="tiering.fs.tier"):
        tier, view = open_tier(tmp_path, spec=make_spec(block_bytes=bb))
        assert tier.wait_for_scan(10)
    assert re.search(r"startup scan of .* took [0-9.]+ s: 100 blocks", caplog.text)
    s = tier.stats()
    assert (s["resident_blocks"], s["resident_bytes"]) == (100, 100 * (bb + TRAILER_BYTES))
    keys = [make_key(i, b"c04") for i in range(100)]
    assert all(tier.lookup(k, CTX) is True for k in keys)
    assert store_many(tier, view, keys)
    assert tier.stats()["blocks_stored"] == 0 and tier.stats()["stores_already_present"] == 100
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in block_files(tmp_path)} == before
    assert loads_exact(tier, view, keys)


def test_cap_holds_across_restart(tmp_path, open_tier):
    stored = BB + TRAILER_BYTES
    tier, view = open_tier(tmp_path, capacity_bytes=10 * stored)
    keys = [make_key(i, b"cap") for i in range(15)]
    for key in keys:  # one at a time: a defined recency order
        assert store(tier, view, [key])
    assert tier.stats()["evictions"] == 5 and len(block_files(tmp_path)) == 10
    assert [tier.lookup(k, CTX) for k in keys] == [False] * 5 + [True] * 10
    tier.shutdown()

    tier2, view2 = open_tier(tmp_path, capacity_bytes=10 * stored)
    assert tier2.wait_for_scan(10)
    assert tier2.stats()["resident_bytes"] == 10 * stored
    more = [make_key(i, b"cap-more") for i in range(3)]
    assert store(tier2, view2, more)
    assert len(block_files(tmp_path)) == 10 and tier2.stats()["evictions"] == 3
    tier2.shutdown()

    # A smaller cap at restart evicts at once, oldest files first (mtime order after a restart).
    tier3, _ = open_tier(tmp_path, capacity_bytes=4 * stored)
    assert tier3.wait_for_scan(10)
    assert tier3.stats()["resident_blocks"] == 4 and len(block_files(tmp_path)) == 4
    assert all(tier3.lookup(k, CTX) for k in more)


@pytest.mark.parametrize("where", ["file", "memory"])
def test_C05_cap_of_20_blocks_never_refuses_500_stores(tmp_path, memroot, open_tier, where):
    bb = 4096
    root = str(tmp_path) if where == "file" else memroot
    tier, view = open_tier(root, spec=make_spec(block_bytes=bb), capacity_bytes=20 * (bb + TRAILER_BYTES))
    keys = [make_key(i, b"c05") for i in range(500)]
    assert store_many(tier, view, keys)
    s = tier.stats()
    assert (s["blocks_stored"], s["evictions"], s["resident_blocks"]) == (500, 480, 20)
    if where == "file":
        assert len(block_files(root)) == 20
    else:
        files = [p for p in fsspec.filesystem("memory").find(root) if p.endswith(".kvb")]
        assert len(files) == 20
    assert all(tier.lookup(k, CTX) for k in keys[-20:])
    assert loads_exact(tier, view, keys[-16:])


def test_cap_is_enforced_per_directory_by_rescans(tmp_path, open_tier):
    stored = BB + TRAILER_BYTES
    config = {"capacity_bytes": 10 * stored, "rescan_interval_s": 0.1}
    a, view_a = open_tier(tmp_path, **config)
    b, view_b = open_tier(tmp_path, **config)
    assert store(a, view_a, [make_key(i, b"proc-a") for i in range(10)])
    assert store(b, view_b, [make_key(i, b"proc-b") for i in range(10)])
    deadline = time.monotonic() + 10
    while (len(block_files(tmp_path)) > 10 or a.stats()["scans"] < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(block_files(tmp_path)) <= 10
    assert a.stats()["scans"] >= 2  # rescans ran (either process may have done the evicting)


def test_store_jobs_joined_in_one_share_keep_the_cap(tmp_path, open_tier, monkeypatch):
    """Queued one-block store jobs of a busy tier are written in one share, each job's victim deleted once."""
    stored = BB + TRAILER_BYTES
    tier, view = open_tier(tmp_path, capacity_bytes=4 * stored, n_read_threads=1, n_write_threads=1)
    old = [make_key(i, b"old") for i in range(4)]
    assert store(tier, view, old)
    calls = count_calls(monkeypatch, tier.files, "write_many")
    new = [make_key(i, b"new") for i in range(3)]
    for slot, key in enumerate(new):
        block_view(view, slot)[:] = block_payload(key, BB)
    (reader,), (writer,) = hold_every_thread(tier)
    jobs = [JobMetadata(100 + n, [key], [n], False, CTX) for n, key in enumerate(new)]
    for job in jobs:
        tier.submit_store(job)  # each reserves its block and takes one of the oldest as its victim
    writer.set()  # the writer frees up while the reader is still busy: it takes the three jobs as one share
    ok = wait_for_jobs(tier, [j.job_id for j in jobs], 30)
    reader.set()
    assert calls == [3] and all(ok.values())
    assert len(block_files(tmp_path)) == 4
    assert [tier.lookup(k, CTX) for k in old + new] == [False] * 3 + [True] * 4
    assert tier.stats()["resident_bytes"] == 4 * stored and loads_exact(tier, view, old[3:] + new)

"""Every load is verified: damaged, truncated and foreign blocks are misses."""

import itertools
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tiering.cli.main import main
from tiering.core import (
    ReqContext,
    TieringOffloadingSpec,
)
from tiering.core.base import JobMetadata, block_view
from tiering.core.spec import Namespace
from tiering.fs.testing import BB, CTX, count_calls, hold_every_thread, load, make_spec, store
from tiering.testing import block_payload, make_key, wait_for_jobs

pytestmark = pytest.mark.usefixtures("io_path")
_ids = itertools.count(10_000)

# -- verification on load ------------------------------------------------------------------


def _count_reads(monkeypatch, tier):
    counts = {}
    real = tier.backend.read_block

    def counting(path, payload, trailer, expected):
        counts[path] = counts.get(path, 0) + 1
        return real(path, payload, trailer, expected)

    monkeypatch.setattr(tier.backend, "read_block", counting)
    return counts


@pytest.mark.usefixtures("python_io")
def test_C06_truncated_file_is_a_miss_once(tmp_path, open_tier, monkeypatch):
    bb = 256 * 1024
    tier, view = open_tier(tmp_path, spec=make_spec(block_bytes=bb), n_read_threads=2, n_write_threads=1)
    keys = [make_key(i, b"c06") for i in range(8)]
    assert store(tier, view, keys)
    assert [tier.lookup(k, CTX) for k in keys] == [True] * 8
    k4 = tier.block_path(keys[3])
    os.truncate(k4, 100)
    reads = _count_reads(monkeypatch, tier)
    for slot in range(8, 16):
        block_view(view, slot)[:] = bytes(bb)
    assert load(tier, view, keys, list(range(8, 16))) is False
    for i in range(3):  # K1..K3 were read and verified into their slots
        assert block_view(view, 8 + i).tobytes() == block_payload(keys[i], bb)
    assert reads[k4] == 1 and max(reads.values()) == 1
    assert not os.path.exists(k4)
    assert tier.lookup(keys[3], CTX) is False
    s = tier.stats()
    assert (s["load_failed_truncated"], s["bad_blocks_removed"], s["load_jobs_failed"]) == (1, 1, 1)
    # The intact blocks stay: a job without K4 succeeds.
    assert load(tier, view, keys[4:], list(range(8, 12)))
    assert block_view(view, 8).tobytes() == block_payload(keys[4], bb)


def _manager_store(manager, keys, bb, deadline):
    ctx = ReqContext("store")
    alloc = manager.prepare_store(keys, ctx)
    for key, slot in zip(alloc.keys, alloc.block_ids):
        block_view(manager.primary.kv_view, slot)[:] = block_payload(key, bb)
    manager.complete_store(alloc.keys, ctx)
    while manager.has_pending_work() and time.monotonic() < deadline:
        manager.get_finished()
        time.sleep(0.005)


def test_C06_through_the_manager_k1_to_k3_load_k4_on_are_misses(tmp_path):
    bb = 256 * 1024
    spec = TieringOffloadingSpec(
        {
            "cpu_bytes_to_use": 8 * bb,
            "block_bytes": bb,
            "secondary_tiers": [{"type": "fs", "root": str(tmp_path), "n_read_threads": 4}],
        }
    )
    manager = spec.get_manager()
    tier = manager.secondary_tiers[0]
    keys = [make_key(i, b"c06m") for i in range(8)]
    deadline = time.monotonic() + 30
    try:
        _manager_store(manager, keys, bb, deadline)
        _manager_store(manager, [make_key(i, b"c06-other") for i in range(8)], bb, deadline)
        assert not any(manager.primary.lookup(k) for k in keys)  # evicted: loads come from fs
        ctx = ReqContext("load")
        assert manager.lookup(keys, ctx) == 8
        os.truncate(tier.block_path(keys[3]), 100)
        manager.prepare_load(keys, ctx)
        results = []
        while not results and time.monotonic() < deadline:
            results = manager.get_finished()
            time.sleep(0.005)
        (result,) = results
        assert result.keys == keys[:3]
        for key, slot in zip(result.keys, result.block_ids):
            assert block_view(manager.primary.kv_view, slot).tobytes() == block_payload(key, bb)
        manager.complete_load(ctx)
        assert tier.lookup(keys[3], ctx) is False
        assert manager.lookup(keys, ctx) == 3  # K4 is now a miss for this request: no second read
        assert tier.stats()["load_failed_truncated"] == 1
    finally:
        manager.shutdown()


@pytest.mark.parametrize(
    ("damage", "cause"),
    [
        ("payload_bit_flip", "checksum"),
        ("header_bit_flip", "checksum"),
        ("zero_length", "truncated"),
        ("extra_bytes", "truncated"),
        ("other_key", "foreign"),
    ],
)
def test_damaged_file_is_a_removed_miss(tmp_path, open_tier, damage, cause):
    tier, view = open_tier(tmp_path)
    key, other = make_key(1, b"damage"), make_key(2, b"damage")
    assert store(tier, view, [key, other])
    path = Path(tier.block_path(key))
    data = bytearray(path.read_bytes())
    if damage == "payload_bit_flip":
        data[1000] ^= 0x10
    elif damage == "header_bit_flip":
        data[BB + 30] ^= 0x01
    elif damage == "zero_length":
        data = bytearray()
    elif damage == "extra_bytes":
        data += b"\0"
    else:
        data = bytearray(Path(tier.block_path(other)).read_bytes())
    path.write_bytes(bytes(data))
    block_view(view, 9)[:] = bytes(BB)
    assert load(tier, view, [key], [9]) is False
    s = tier.stats()
    assert s[f"load_failed_{cause}"] == 1 and s["bad_blocks_removed"] == 1
    assert not path.exists()
    assert tier.lookup(key, CTX) is False
    # A second attempt is a plain miss, not another verification failure.
    assert load(tier, view, [key], [9]) is False
    assert tier.stats()[f"load_failed_{cause}"] == 1 and tier.stats()["load_failed_missing"] == 1
    assert load(tier, view, [other], [9]) and block_view(view, 9).tobytes() == block_payload(other, BB)


def test_C01_namespace_changes_are_misses(tmp_path, open_tier):
    base = {"model": "m", "model_revision": "r1", "kv_dtype": "bfloat16", "block_size": 16}
    bb = 64 * 1024
    keys = [make_key(i, b"c01") for i in range(20)]
    tier, view = open_tier(tmp_path, spec=make_spec(block_bytes=bb, num_blocks=20, **base), num_blocks=20)
    assert store(tier, view, keys)
    src_file = tier.block_path(keys[0])
    tier.shutdown()
    variants = [
        (dict(base, model_revision="r2"), bb),
        (dict(base, kv_layout="layer-major/kv-hnd"), bb),
        (dict(base, kv_dtype="float8_e4m3fn"), 32 * 1024),
    ]
    digests = {tier.namespace.digest}
    for extra, vbb in variants:
        t, v = open_tier(tmp_path, spec=make_spec(block_bytes=vbb, num_blocks=4, **extra), num_blocks=4)
        assert t.wait_for_scan(10) and t.stats()["resident_blocks"] == 0
        assert [t.lookup(k, CTX) for k in keys] == [False] * 20
        assert load(t, v, keys[:4]) is False
        digests.add(t.namespace.digest)
        if vbb != bb:
            # A block of the wrong length placed where this namespace looks: never returned.
            os.makedirs(os.path.dirname(t.block_path(keys[0])), exist_ok=True)
            shutil.copyfile(src_file, t.block_path(keys[0]))
            assert t.lookup(keys[0], CTX) is False
            assert load(t, v, keys[:1]) is False
            assert t.stats()["load_failed_truncated"] == 1
            assert not os.path.exists(t.block_path(keys[0]))
    assert len(digests) == 4
    for digest in digests:
        fields = json.loads((tmp_path / digest / "namespace.json").read_text())
        assert set(fields) == set(Namespace.__dataclass_fields__) | {"digest"} and fields["digest"] == digest
        assert fields["model"] == "m" and fields["block_size"] == 16


def test_same_length_block_of_another_namespace_is_foreign(tmp_path, open_tier):
    key = make_key(7, b"ns")
    t1, v1 = open_tier(tmp_path, spec=make_spec(model_revision="r1"))
    assert store(t1, v1, [key])
    t2, v2 = open_tier(tmp_path, spec=make_spec(model_revision="r2"))
    os.makedirs(os.path.dirname(t2.block_path(key)), exist_ok=True)
    # Publish the copy atomically, as a writer would: the start-up scan may be
    # running and removes final files of the wrong size (a half-copied one).
    shutil.copyfile(t1.block_path(key), t2.block_path(key) + ".copy")
    os.replace(t2.block_path(key) + ".copy", t2.block_path(key))
    assert t2.lookup(key, CTX) is True  # right size: only the header can tell
    assert load(t2, v2, [key]) is False
    assert t2.stats()["load_failed_foreign"] == 1
    assert t2.lookup(key, CTX) is False and not os.path.exists(t2.block_path(key))
    assert t1.lookup(key, CTX) is True and load(t1, v1, [key], [3])


def test_load_jobs_joined_in_one_share_fail_alone(tmp_path, open_tier, monkeypatch):
    """Queued load jobs of a busy tier are read in one share; a damaged block fails its own job, not its neighbours."""
    tier, view = open_tier(tmp_path, n_read_threads=1, n_write_threads=1)
    keys = [make_key(i, b"joined") for i in range(5)]
    assert store(tier, view, keys)
    path = Path(tier.block_path(keys[2]))
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))
    calls = count_calls(monkeypatch, tier.files, "read_many")
    for slot in range(5):
        block_view(view, slot)[:] = bytes(BB)
    (reader,), (writer,) = hold_every_thread(tier)
    jobs = [
        JobMetadata(next(_ids), keys[0:2], [0, 1], True, CTX),
        JobMetadata(next(_ids), keys[2:4], [2, 3], True, CTX),  # its first block is damaged
        JobMetadata(next(_ids), keys[4:5], [4], True, CTX),
    ]
    for job in jobs:
        tier.submit_load(job)
    reader.set()  # one thread frees up while the other is still busy: it takes the three jobs as one share
    ok = wait_for_jobs(tier, [j.job_id for j in jobs], 30)
    writer.set()
    assert calls == [5]
    assert [ok[j.job_id] for j in jobs] == [True, False, True]
    for slot in (0, 1, 4):
        assert block_view(view, slot).tobytes() == block_payload(keys[slot], BB)
    s = tier.stats()
    # keys[3], read in the same share after the damaged block, verified: kept and counted as loaded
    assert s["load_failed_checksum"] == 1 and s["blocks_loaded"] == 4 and not path.exists()
    assert block_view(view, 3).tobytes() == block_payload(keys[3], BB)


# -- a corrupted chain heals in one request ----------------------------------------------------------


def _c24_manager(config):
    return TieringOffloadingSpec(config).get_manager()


def _c24_load(manager, keys, ctx, deadline):
    """Look ``keys`` up and load the run found; returns the load's result (once reported)."""
    n = None
    while n is None and time.monotonic() < deadline:
        n = manager.lookup(keys, ctx)
    manager.prepare_load(keys[:n], ctx)
    results = []
    while not results and time.monotonic() < deadline:
        results = manager.get_finished()
        time.sleep(0.005)
    (result,) = results
    assert result.requested == n
    return result


def test_c24_a_corrupted_chain_is_replaced_by_the_recompute_of_one_request(tmp_path, capsys):
    bb, n = 64 * 1024, 31
    config = {
        "cpu_bytes_to_use": 2 * n * bb,
        "block_bytes": bb,
        "secondary_tiers": [{"type": "fs", "root": str(tmp_path / "kv")}],
    }
    keys = [make_key(i, b"c24") for i in range(n)]
    deadline = time.monotonic() + 60
    manager = _c24_manager(config)
    try:
        _manager_store(manager, keys, bb, deadline)
        paths = [manager.secondary_tiers[0].block_path(k) for k in keys]
    finally:
        manager.shutdown()
    for path in paths:  # one payload byte flipped in every block file
        with open(path, "r+b") as f:
            f.seek(bb // 2)
            byte = f.read(1)[0]
            f.seek(bb // 2)
            f.write(bytes([byte ^ 0x20]))

    # A fresh stack: the request finds the chain, its load fails, it recomputes and stores every block.
    manager = _c24_manager(config)
    try:
        ctx = ReqContext("c24")
        result = _c24_load(manager, keys, ctx, deadline)
        assert result.requested == n and result.keys == []
        alloc = manager.prepare_store(keys, ctx)
        assert sorted(alloc.keys) == sorted(keys)  # none of them reached the primary tier
        for key, slot in zip(alloc.keys, alloc.block_ids):
            block_view(manager.primary.kv_view, slot)[:] = block_payload(key, bb)
        manager.complete_store(alloc.keys, ctx)
        while manager.has_pending_work() and time.monotonic() < deadline:
            time.sleep(0.005)
        manager.on_request_finished(ctx)
        s = manager.secondary_tiers[0].stats()
        assert (s["load_failed_checksum"], s["bad_blocks_removed"]) == (n, n)
        assert (s["stores_already_present"], s["blocks_stored"]) == (0, n)
    finally:
        manager.shutdown()

    # The next fresh stack loads all of them, verified.
    manager = _c24_manager(config)
    try:
        ctx = ReqContext("c24-again")
        result = _c24_load(manager, keys, ctx, deadline)
        assert result.keys == keys
        for key, slot in zip(result.keys, result.block_ids):
            assert block_view(manager.primary.kv_view, slot).tobytes() == block_payload(key, bb)
        manager.complete_load(ctx)
        assert manager.secondary_tiers[0].stats()["load_failures"] == 0
    finally:
        manager.shutdown()
    capsys.readouterr()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["verify", str(path)]) == 0
    assert f"{n} checked, {n} sound, 0 corrupt" in capsys.readouterr().out

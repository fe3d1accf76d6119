"""Lookups: index, filesystem fallbacks and the start-up scan."""

import threading
import time

import pytest
from fs_test_helpers import BB, CTX, load, store

from tiering.core.base import block_view
from tiering.core.testing import block_payload, make_key, wait_for_lookup
from tiering.fs.io.local import LocalBackend

pytestmark = pytest.mark.usefixtures("io_path")

# -- lookups -----------------------------------------------------------------------------------


def test_local_lookup_finds_blocks_of_another_process_at_once(tmp_path, open_tier):
    a, view_a = open_tier(tmp_path)
    b, view_b = open_tier(tmp_path)
    key = make_key(3, b"shared-root")
    assert store(a, view_a, [key])
    assert b.lookup(key, CTX) is True
    assert load(b, view_b, [key], [4]) and block_view(view_b, 4).tobytes() == block_payload(key, BB)


def test_memory_lookup_probes_asynchronously(memroot, open_tier):
    a, view_a = open_tier(memroot)
    b, _ = open_tier(memroot)
    assert b.lookup_fallback == "async"
    key, absent = make_key(1, b"probe"), make_key(2, b"probe")
    assert store(a, view_a, [key])
    assert b.lookup(key, CTX) is None
    assert wait_for_lookup(b, key, CTX) is True
    assert b.lookup(absent, CTX) is None
    assert wait_for_lookup(b, absent, CTX) is False
    assert b.stats()["lookups_pending"] >= 2


def test_lookup_fallback_off_answers_from_the_index_only(tmp_path, open_tier):
    a, view_a = open_tier(tmp_path)
    key = make_key(1, b"off")
    assert store(a, view_a, [key])
    b, _ = open_tier(tmp_path, lookup_fallback="off")
    assert b.wait_for_scan(10)
    assert b.lookup(key, CTX) is True  # found by the start-up scan
    later = make_key(2, b"off")
    assert store(a, view_a, [later])
    assert b.lookup(later, CTX) is False


def test_construction_waits_for_the_startup_scan(tmp_path, open_tier):
    a, view_a = open_tier(tmp_path)
    keys = [make_key(i, b"restart") for i in range(12)]
    assert store(a, view_a, keys)
    b, _ = open_tier(tmp_path, lookup_fallback="off")  # index only: a hit proves the scan is done
    assert b.stats()["scan_done"] == 1
    assert [b.lookup(k, CTX) for k in keys] == [True] * 12


def test_slow_startup_scan_does_not_block_construction_or_lookups(tmp_path, open_tier, monkeypatch):
    a, view_a = open_tier(tmp_path)
    key = make_key(1, b"slow-scan")
    assert store(a, view_a, [key])
    release = threading.Event()
    real_scan = LocalBackend.scan

    def slow_scan(self, directory):
        release.wait(10)
        yield from real_scan(self, directory)

    monkeypatch.setattr(LocalBackend, "scan", slow_scan)
    started = time.monotonic()
    b, view_b = open_tier(tmp_path, startup_scan_wait_s=0.2)
    assert 0.2 <= time.monotonic() - started < 2.0  # waited 0.2 s for the scan, then went on
    assert b.stats()["scan_done"] == 0
    assert b.lookup(key, CTX) is True
    assert load(b, view_b, [key], [2])
    release.set()
    assert b.wait_for_scan(10) and b.stats()["resident_blocks"] == 1

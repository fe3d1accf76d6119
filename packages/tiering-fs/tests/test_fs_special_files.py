"""Case C19: a FIFO, socket, device node or directory where a block file should be, on both I/O paths.

The entry is a bounded miss (a ``foreign`` load failure, left in place, a directory's content kept), no I/O
thread blocks on it, and a healthy block loads meanwhile on a tier with two read threads. Every wait is
bounded: on code that opens a FIFO blocking, the test fails instead of hanging (and unblocks the readers).
"""

import contextlib
import json
import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from tiering.cli.main import main
from tiering.core import JobMetadata
from tiering.core.base import block_view
from tiering.fs.inspection import FsInspector
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.testing import BB, CTX, store
from tiering.testing import block_payload, make_key, wait_for_jobs
from tiering.testing.harness import next_job_id

pytestmark = pytest.mark.usefixtures("io_path")

STORED = BB + TRAILER_BYTES


def _plant(path, kind, stack):
    """Replace the block file at ``path`` with an entry of ``kind``; returns the path ``tiering ls`` reports."""
    os.unlink(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        stack.callback(sock.close)
        here = os.getcwd()
        os.chdir(os.path.dirname(path))  # a socket path is limited to 108 bytes: bind the short relative name
        try:
            sock.bind(os.path.basename(path))
        finally:
            os.chdir(here)
    elif kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # the /dev/null character device
        except PermissionError:
            pytest.skip("creating a device node needs root")
    else:
        os.mkdir(path)
        (Path(path) / "operator-note.txt").write_text("kept")
        return os.path.join(path, "operator-note.txt")
    return path


@contextlib.contextmanager
def _writers_for(paths):
    """Hold each FIFO among ``paths`` open for writing: a read blocked in its open (before the fix) returns."""
    fds = []
    for path in paths:
        with contextlib.suppress(OSError):
            if stat.S_ISFIFO(os.lstat(path).st_mode):
                fds.append(os.open(path, os.O_RDWR | os.O_NONBLOCK))
    try:
        yield
    finally:
        for fd in fds:
            os.close(fd)


def _load_jobs(tier, keys, slots):
    """Submit one load job per key; returns their ids."""
    ids = []
    for key, slot in zip(keys, slots, strict=True):
        job = JobMetadata(next_job_id(), [key], [slot], True, CTX)
        tier.submit_load(job)
        ids.append(job.job_id)
    return ids


@pytest.mark.parametrize("kind", ["fifo", "socket", "device", "directory"])
def test_c19_special_file_in_a_block_place_is_a_bounded_miss(tmp_path, open_tier, kind, capsys):
    root = tmp_path / "kv"
    tier, view = open_tier(root, n_read_threads=2)
    bad = [make_key(i, b"c19-bad") for i in range(2)]
    good = make_key(0, b"c19-good")
    assert store(tier, view, [*bad, good])
    direct = tier.o_direct  # where the filesystem takes O_DIRECT: a special file refusing it must not end that
    with contextlib.ExitStack() as stack:
        reported = [_plant(tier.block_path(key), kind, stack) for key in bad]
        block_view(view, 12)[:] = bytes(BB)
        ids = _load_jobs(tier, [*bad, good], [10, 11, 12])
        try:
            results = wait_for_jobs(tier, ids, timeout_s=10)
        finally:
            with _writers_for([tier.block_path(key) for key in bad]):
                tier.shutdown()  # before the fix: only returns once the readers stuck in a FIFO's open are freed
        assert results == dict(zip(ids, [False, False, True], strict=True))
        assert block_view(view, 12).tobytes() == block_payload(good, BB)  # the healthy block, meanwhile
        s = tier.stats()
        assert (s["load_failed_foreign"], s["failed_deletes"], s["pending_delete_bytes"]) == (2, 0, 0)
        assert (s["resident_blocks"], s["used_bytes"]) == (1, STORED)  # only bytes that are blocks
        assert [tier.lookup(key, CTX) for key in bad] == [False, False] and tier.o_direct == direct
        for key in bad:  # left in place, never removed (a directory's content kept)
            path = tier.block_path(key)
            assert os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode)
        if kind == "directory":
            assert all(Path(p).read_text() == "kept" for p in reported)

        # A restart's scan indexes neither and does not hang; ls reports both as foreign.
        tier, _ = open_tier(root, n_read_threads=2)
        assert tier.wait_for_scan(10) and tier.stats()["resident_blocks"] == 1
        assert [tier.lookup(key, CTX) for key in bad] == [False, False] and tier.lookup(good, CTX) is True
        inspector = FsInspector.from_config({"root": str(root)})
        assert sorted(inspector.foreign()) == sorted(reported)
        assert [b.key for b in inspector.blocks(tier.namespace.digest)] == [good]
        config = tmp_path / "config.json"
        config.write_text(
            json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "fs", "root": str(root)}]})
        )
        capsys.readouterr()
        assert main(["ls", str(config), "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)[0]
        assert sorted(listed["foreign"]) == sorted(reported) and listed["namespaces"][0]["blocks"] == 1


def test_c19_namespace_file_replaced_by_a_fifo_does_not_hang_the_open(tmp_path, open_tier):
    root = tmp_path / "kv"
    tier, _ = open_tier(root)
    ns_file = Path(tier.namespace_dir) / "namespace.json"
    tier.shutdown()
    ns_file.unlink()
    os.mkfifo(ns_file)
    opened = []
    thread = threading.Thread(target=lambda: opened.append(open_tier(root)), daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():  # before the fix: reading namespace.json waits for a writer
        os.close(os.open(ns_file, os.O_WRONLY | os.O_NONBLOCK))  # a writer that closes at once: the read ends
        thread.join(10)
        pytest.fail("opening the tier waited on a FIFO named namespace.json")
    tier, view = opened[0]
    assert ns_file.is_file() and json.loads(ns_file.read_text())["digest"] == tier.namespace.digest  # rewritten
    assert store(tier, view, [make_key(1, b"c19-ns")])

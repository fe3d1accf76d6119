"""A separate process that stores blocks through the fs tier (driven by test_fs_tier.py).

Usage: python fs_worker.py '<json config>'. Prints "ready" before waiting for
the optional go file, "stored" after its blocks are stored, and with
"hang": true, "hanging" once a further store has written part of its
temporary file and then blocks forever (the parent kills it with SIGKILL);
with "pin_ttl_s": N, "pinned" once its blocks are pinned for N seconds, then
it waits to be killed.
"""

import json
import os
import subprocess
import sys
import time

from tiering.core import JobMetadata, OffloadingSpec, ReqContext
from tiering.core.base import block_view
from tiering.core.primary import allocate_host_buffer
from tiering.fs import FsspecSecondaryTierManager
from tiering.testing import block_payload, make_key, wait_for_jobs


def run_worker(cfg, **popen):
    """Start this script in a child process with ``cfg``; its stdout is a text pipe."""
    return subprocess.Popen([sys.executable, __file__, json.dumps(cfg)], stdout=subprocess.PIPE, text=True, **popen)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    bb = cfg["block_bytes"]
    n = cfg["n"]
    salt = cfg["salt"].encode()
    spec = OffloadingSpec({"cpu_bytes_to_use": 16 * bb, "block_bytes": bb, "model": "fs-test"})
    view = allocate_host_buffer(16, bb)
    print("ready", flush=True)
    go = cfg.get("go_file")
    while go and not os.path.exists(go):
        time.sleep(0.001)
    if cfg.get("hang"):
        os.environ["TIERING_FS_NATIVE"] = "0"  # the hang is injected into os.pwritev: the pure-Python path
    tier = FsspecSecondaryTierManager(spec, view, "fs", root=cfg["root"], **cfg.get("tier", {}))
    keys = [make_key(i, salt) for i in range(n)]
    for start in range(0, n, 16):
        batch = keys[start : start + 16]
        for j, k in enumerate(batch):
            block_view(view, j)[:] = block_payload(k, bb)
        job = JobMetadata(start + 1, batch, list(range(len(batch))), False, ReqContext("worker"))
        tier.submit_store(job)
        result = wait_for_jobs(tier, [job.job_id], 60)
        assert result == {job.job_id: True}, result
    print("stored", flush=True)
    if cfg.get("pin_ttl_s"):  # pin every block, then wait to be killed (a crash: nothing unpins)
        assert tier.pin(keys, cfg["pin_ttl_s"])
        print("pinned", flush=True)
        time.sleep(3600)
    if cfg.get("hang"):
        real = os.pwritev

        def hang(fd, bufs, offset):
            real(fd, [bufs[0][:4096]], offset)  # the first page of the payload, no trailer
            print("hanging", flush=True)
            time.sleep(3600)
            return 0

        os.pwritev = hang
        key = make_key(0, b"hang")
        block_view(view, 0)[:] = block_payload(key, bb)
        tier.submit_store(JobMetadata(10_000, [key], [0], False, ReqContext("worker")))
        time.sleep(3600)
    tier.shutdown()


if __name__ == "__main__":
    main()

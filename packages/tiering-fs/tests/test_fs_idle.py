"""An idle fs tier takes no CPU from the engine it runs in, and leaves the process's CPU affinity as it found it.

In vLLM the tier lives in the engine core process, next to a scheduler thread
that must answer quickly and on a machine whose cores the engine's OpenMP
threads are bound to: a tier thread that polls or spins while there is no
job would slow every model step, not only the tier's own loads.
"""

import os
import threading
import time

import pytest

IDLE_S = 1.0
MAX_IDLE_CPU_S = 0.05
"""CPU all the tier's threads together may use in ``IDLE_S`` of idleness (a polling loop would use most of it)."""

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="per-thread CPU times need Linux /proc")


def _thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process (``/proc/self/task/<id>/stat``)."""
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_idle_tier_threads_use_no_cpu(open_tier, tmp_path):
    before = set(threading.enumerate())
    affinity = os.sched_getaffinity(0)
    tier, _ = open_tier(tmp_path / "kv", n_read_threads=8, n_write_threads=4)
    deadline = time.monotonic() + 10
    while not tier.stats()["scan_done"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tier.stats()["scan_done"] == 1
    ours = [t for t in threading.enumerate() if t not in before and t.native_id is not None]
    assert len(ours) >= 12  # 8 readers and 4 writers, started with the tier
    start = {t.native_id: _thread_cpu_s(t.native_id) for t in ours}
    time.sleep(IDLE_S)
    used = {t.name: _thread_cpu_s(t.native_id) - start[t.native_id] for t in ours if t.is_alive()}
    assert sum(used.values()) <= MAX_IDLE_CPU_S, used
    assert os.sched_getaffinity(0) == affinity

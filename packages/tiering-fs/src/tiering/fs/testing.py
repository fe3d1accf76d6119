"""Test fixtures of the fs tier: pytest fixtures that open tiers, and helpers that store, load and list blocks.

The fs tier's own tests use them (their ``conftest.py`` imports the fixtures);
so can the tests of anything built on the tier. Blocks are ``BB`` bytes
(16 KiB) unless a test says otherwise; payloads are
:func:`~tiering.testing.harness.block_payload` of the key, so a load can be
checked byte for byte.

Requires pytest, like :mod:`tiering.testing` (``pip install tiering-testing`` brings both); without it,
importing this module raises an ``ImportError`` naming that extra.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import fsspec

from tiering.core import JobMetadata, OffloadingSpec, ReqContext
from tiering.core.configfile import install_hint

try:
    import pytest
except ImportError as exc:  # the fixtures are pytest's: say which extra brings it
    raise ImportError(
        f"tiering.fs.testing (test fixtures) runs under pytest, which is not installed: "
        f"{install_hint('tiering-testing')}",
        name="pytest",
    ) from exc

from tiering.core.base import OffloadKey, block_view
from tiering.core.primary import allocate_host_buffer
from tiering.fs import FsspecSecondaryTierManager, native
from tiering.testing.harness import block_payload, next_job_id, wait_for_jobs

BB = 16 * 1024
"""Bytes of one block in these helpers (16 KiB)."""
CTX = ReqContext("test")
"""The request context of the helpers' jobs and of the tests' lookups."""

OpenTier = Callable[..., tuple[FsspecSecondaryTierManager, memoryview]]


def make_spec(block_bytes: int = BB, num_blocks: int = 16, **extra: Any) -> OffloadingSpec:
    """A spec of ``num_blocks`` primary blocks of ``block_bytes`` bytes, plus ``extra`` fields."""
    return OffloadingSpec(
        {"cpu_bytes_to_use": num_blocks * block_bytes, "block_bytes": block_bytes, "model": "fs-test", **extra}
    )


def store(
    tier: FsspecSecondaryTierManager,
    view: memoryview,
    keys: Sequence[OffloadKey],
    slots: Sequence[int] | None = None,
    timeout: float = 30,
) -> bool:
    """Write each key's payload into its slot (default ``0..len(keys)-1``), store them as one job and wait.

    Returns:
        The job's success.

    Raises:
        AssertionError: the job did not finish within ``timeout`` seconds.
    """
    slots = list(range(len(keys))) if slots is None else list(slots)
    for key, slot in zip(keys, slots, strict=False):  # a test may pass more slots than keys
        block_view(view, slot)[:] = block_payload(key, tier.block_bytes)
    job = JobMetadata(next_job_id(), list(keys), slots, False, CTX)
    tier.submit_store(job)
    return wait_for_jobs(tier, [job.job_id], timeout)[job.job_id]


def store_many(tier: FsspecSecondaryTierManager, view: memoryview, keys: Sequence[OffloadKey]) -> bool:
    """Store ``keys`` in jobs of as many blocks as ``view`` holds; True when every job succeeds."""
    n = len(view)
    return all(store(tier, view, keys[i : i + n]) for i in range(0, len(keys), n))


def load(
    tier: FsspecSecondaryTierManager, view: memoryview, keys: Sequence[OffloadKey], slots: Sequence[int] | None = None
) -> bool:
    """Load ``keys`` into ``slots`` (default ``0..len(keys)-1``) as one job and wait.

    Returns:
        The job's success (the loaded bytes are not checked: see :func:`loads_exact`).
    """
    slots = list(range(len(keys))) if slots is None else list(slots)
    job = JobMetadata(next_job_id(), list(keys), slots, True, CTX)
    tier.submit_load(job)
    return wait_for_jobs(tier, [job.job_id])[job.job_id]


def loads_exact(tier: FsspecSecondaryTierManager, view: memoryview, keys: Sequence[OffloadKey]) -> bool:
    """Load keys in batches of the primary size; True when every batch succeeds byte-exact."""
    n = len(view)
    for i in range(0, len(keys), n):
        batch = keys[i : i + n]
        for slot in range(len(batch)):
            block_view(view, slot)[:] = bytes(tier.block_bytes)
        if not load(tier, view, batch):
            return False
        for slot, key in enumerate(batch):
            if block_view(view, slot).tobytes() != block_payload(key, tier.block_bytes):
                return False
    return True


def block_files(root: str | Path) -> list[Path]:
    """The block files (``*.kvb``) under the local folder ``root``, sorted."""
    return sorted(p for p in Path(root).rglob("*.kvb"))


def temp_files(root: str | Path) -> list[Path]:
    """The temporary files of unpublished stores (``*.tmp.*``) under the local folder ``root``, sorted."""
    return sorted(p for p in Path(root).rglob("*.tmp.*"))


def hold_every_thread(tier: Any) -> tuple[list[threading.Event], list[threading.Event]]:
    """Occupy each I/O thread of ``tier`` with a call that waits on a gate; returns (readers' gates, writers' gates).

    Each call waits at most 10 s for its gate.

    Raises:
        AssertionError: the threads did not all start within 10 s.
    """
    gates: dict[bool, list[threading.Event]] = {True: [], False: []}
    threads = tier.pool.n_read_threads + tier.pool.n_write_threads
    lock = threading.Lock()

    def hold() -> None:
        gate = threading.Event()
        with lock:
            gates["-read-" in threading.current_thread().name].append(gate)
        gate.wait(10)

    for _ in range(threads):
        tier.pool.submit_call("read", hold)
    deadline = time.monotonic() + 10
    while len(gates[True]) + len(gates[False]) < threads:
        assert time.monotonic() < deadline, "the I/O threads did not all start"
        time.sleep(0.001)
    return gates[True], gates[False]


def count_calls(monkeypatch: pytest.MonkeyPatch, obj: Any, name: str) -> list[int]:
    """Wrap ``obj.name(keys, ...)``; returns the list that gets ``len(keys)`` of every call."""
    calls: list[int] = []
    real = getattr(obj, name)

    def counted(keys: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        calls.append(len(keys))
        return real(keys, *args, **kwargs)

    monkeypatch.setattr(obj, name, counted)
    return calls


@pytest.fixture
def python_io(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pure-Python block I/O path, for tests that inject faults by patching ``os`` or the back end."""
    monkeypatch.setenv(native.ENV_VAR, "0")


@pytest.fixture(params=["native", "python"])
def io_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on both block I/O paths (modules opt in with ``pytestmark = pytest.mark.usefixtures("io_path")``).

    The native run is skipped when the library is not built (``python packages/tiering-fs/hatch_build.py``
    builds it; test_fs_native.py fails when a C compiler is there and the library is not).
    """
    if request.param == "python":
        monkeypatch.setenv(native.ENV_VAR, "0")
    elif "python_io" in request.fixturenames:
        pytest.skip("injects faults into the pure-Python path")
    elif native._load()[0] is None:
        pytest.skip(f"native library not built: {native._load()[1]}")
    else:
        monkeypatch.delenv(native.ENV_VAR, raising=False)
    return str(request.param)


@pytest.fixture
def open_tier() -> Iterator[OpenTier]:
    """A factory of fs tiers: ``open_tier(root, spec=None, num_blocks=16, **config)`` -> ``(tier, view)``.

    Every tier it opened is shut down at teardown.
    """
    opened: list[FsspecSecondaryTierManager] = []

    def _open(
        root: str | Path, spec: OffloadingSpec | None = None, num_blocks: int = 16, **config: Any
    ) -> tuple[FsspecSecondaryTierManager, memoryview]:
        spec = spec or make_spec()
        view = allocate_host_buffer(num_blocks, spec.block_bytes)
        tier = FsspecSecondaryTierManager(spec, view, "fs", root=str(root), **config)
        opened.append(tier)
        return tier, view

    yield _open
    for tier in opened:
        tier.shutdown()


@pytest.fixture
def memroot() -> Iterator[str]:
    """A fresh ``memory://`` root (fsspec's in-memory file system), removed afterwards."""
    root = f"memory://tiering-test-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)

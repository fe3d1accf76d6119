"""Drive a secondary tier directly, without the manager: keys, payloads, jobs, waits.

Runtime code (no pytest): benchmarks (``scripts/bench_*.py``), the CLI and
the test suites (:mod:`tiering.testing`) share these helpers. Keys and
payloads are deterministic, so a loaded block can be checked byte for byte
against what was stored.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager, block_view
from tiering.core.policies.tenants import scope_keys
from tiering.core.spec import OffloadingSpec

DEFAULT_TIMEOUT_S = 30.0
"""Seconds the wait helpers wait before declaring a hang."""

_job_ids = itertools.count(1)


def next_job_id() -> int:
    """A process-wide unique job id (thread safe: ``itertools.count`` is atomic under the GIL)."""
    return next(_job_ids)


def block_payload(key: bytes, block_bytes: int) -> bytes:
    """Deterministic pseudo-random bytes for ``key`` (SHAKE-256 stream), ``block_bytes`` long."""
    return hashlib.shake_256(key).digest(block_bytes)


def make_key(i: int, salt: bytes = b"") -> OffloadKey:
    """A 32-byte key: SHA-256 of ``salt`` and ``i`` (8 bytes, little endian)."""
    return OffloadKey(hashlib.sha256(salt + i.to_bytes(8, "little")).digest())


def make_spec(block_bytes: int = 16 * 1024, num_blocks: int = 16, **fields: Any) -> OffloadingSpec:
    """An :class:`~tiering.core.spec.OffloadingSpec` of ``num_blocks`` primary slots of ``block_bytes``.

    ``fields`` are further config keys (``model``, ``model_revision``...);
    the model defaults to ``"test/model"``.
    """
    config: dict[str, Any] = {"cpu_bytes_to_use": num_blocks * block_bytes, "block_bytes": block_bytes}
    config.setdefault("model", "test/model")
    config.update(fields)
    return OffloadingSpec(config)


def wait_until(predicate: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.005) -> None:
    """Poll ``predicate`` until it is truthy.

    Raises:
        AssertionError: ``timeout_s`` seconds passed first.
    """
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout_s}s")
        time.sleep(interval_s)


def wait_for_results(
    tier: SecondaryTierManager, job_ids: Iterable[int], timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[int, JobResult]:
    """Poll ``tier.get_finished()`` until every job in ``job_ids`` is reported; the results by job id.

    Raises:
        AssertionError: a job is reported twice, an unknown job is reported,
            or the timeout passes first (a hang).
    """
    wanted = set(job_ids)
    results: dict[int, JobResult] = {}
    deadline = time.monotonic() + timeout_s
    while set(results) != wanted:
        for result in tier.get_finished():
            if not isinstance(result, JobResult):
                raise AssertionError(f"get_finished yielded {result!r}, not a JobResult")
            if result.job_id not in wanted:
                raise AssertionError(f"unknown job {result.job_id} reported")
            if result.job_id in results:
                raise AssertionError(f"job {result.job_id} reported twice")
            results[result.job_id] = result
        if set(results) == wanted:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs {sorted(wanted - set(results))} not reported within {timeout_s}s")
        time.sleep(0.001)
    return results


def wait_for_jobs(
    tier: SecondaryTierManager, job_ids: Iterable[int], timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[int, bool]:
    """Like :func:`wait_for_results`, returning job id -> success."""
    return {job_id: r.success for job_id, r in wait_for_results(tier, job_ids, timeout_s).items()}


def wait_for_lookup(
    tier: SecondaryTierManager, key: OffloadKey, ctx: ReqContext, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """Ask ``tier.lookup`` until it answers True or False (not None).

    Raises:
        AssertionError: still None after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while (verdict := tier.lookup(key, ctx)) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"lookup of {key.hex()} still pending after {timeout_s}s")
        time.sleep(0.001)
    return verdict


def fill_slots(view: memoryview, keys: Sequence[OffloadKey], slots: Sequence[int]) -> None:
    """Write each key's :func:`block_payload` into its primary slot of ``view``."""
    block_bytes = view.shape[1] if view.shape else 0
    for key, slot in zip(keys, slots, strict=True):
        block_view(view, slot)[:] = block_payload(key, block_bytes)


def store_job(
    keys: Sequence[OffloadKey], slots: Sequence[int], req_id: str = "harness", *, tenant: str = ""
) -> JobMetadata:
    """A store job of ``keys`` from ``slots`` with a fresh id, for a request of ``tenant``.

    It mimics the manager: the job's keys are ``keys`` scoped to ``tenant``
    (:func:`~tiering.core.policies.tenants.scope_keys`; ``keys`` as given for the
    default tenant), the one form a tier ever sees.
    """
    return JobMetadata(next_job_id(), scope_keys(tenant, keys), list(slots), False, ReqContext(req_id, tenant=tenant))


def load_job(
    keys: Sequence[OffloadKey], slots: Sequence[int], req_id: str = "harness", *, tenant: str = ""
) -> JobMetadata:
    """A load job of ``keys`` into ``slots`` with a fresh id, for a request of ``tenant``.

    Its keys are ``keys`` scoped to ``tenant``, as the manager's (see :func:`store_job`).
    """
    return JobMetadata(next_job_id(), scope_keys(tenant, keys), list(slots), True, ReqContext(req_id, tenant=tenant))


def store_blocks(
    tier: SecondaryTierManager,
    view: memoryview,
    keys: Sequence[OffloadKey],
    slots: Sequence[int] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    tenant: str = "",
) -> bool:
    """Fill ``slots`` (default ``0..len(keys)-1``) with the keys' payloads, store them as one job of ``tenant``, wait.

    The payloads are those of ``keys``; the blocks are stored under ``keys``
    scoped to ``tenant``, as the manager would (see :func:`store_job`).

    Returns:
        The job's success.
    """
    slots = list(slots if slots is not None else range(len(keys)))
    fill_slots(view, keys, slots)
    job = store_job(keys, slots, tenant=tenant)
    tier.submit_store(job)
    return wait_for_jobs(tier, [job.job_id], timeout_s)[job.job_id]


def load_blocks(
    tier: SecondaryTierManager,
    view: memoryview,
    keys: Sequence[OffloadKey],
    slots: Sequence[int] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    verify: bool = True,
) -> bool:
    """Zero ``slots``, load ``keys`` into them as one job, wait; with ``verify``, check every byte.

    Returns:
        The job's success.

    Raises:
        AssertionError: ``verify`` and a successful job left a slot with other bytes than the key's payload.
    """
    slots = list(slots if slots is not None else range(len(keys)))
    block_bytes = view.shape[1] if view.shape else 0
    for slot in slots:
        block_view(view, slot)[:] = bytes(block_bytes)
    job = load_job(keys, slots)
    tier.submit_load(job)
    ok = wait_for_jobs(tier, [job.job_id], timeout_s)[job.job_id]
    if ok and verify:
        for key, slot in zip(keys, slots, strict=True):
            if block_view(view, slot).tobytes() != block_payload(key, block_bytes):
                raise AssertionError(f"block {key.hex()} loaded into slot {slot} with wrong bytes")
    return ok


def in_forked_child(fn: Callable[[], Any], timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Run ``fn`` in a child made by ``os.fork()`` and tell the parent what happened there.

    The child sends its outcome through a pipe and ends with ``os._exit`` (no
    exit handler of the parent's runs in it). A child that has not answered
    within ``timeout_s`` is killed.

    Returns:
        ``{"returned": value}`` (``fn``'s return value, which must pickle) or
        ``{"raised": type name, "message": str(exception)}``, plus ``"seconds"``:
        how long ``fn`` ran in the child.

    Raises:
        AssertionError: the child did not answer within ``timeout_s`` (a hang) or died without answering.
    """
    import os
    import pickle
    import select
    import signal

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into the caller's code
        status = 0
        try:
            os.close(read_fd)
            started = time.monotonic()
            try:
                outcome: dict[str, Any] = {"returned": fn()}
            except BaseException as exc:
                outcome = {"raised": type(exc).__name__, "message": str(exc)}
            outcome["seconds"] = time.monotonic() - started
            with os.fdopen(write_fd, "wb") as pipe:
                pickle.dump(outcome, pipe)
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    data = b""
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"the forked child did not answer within {timeout_s} s (a hang)")
            chunk = os.read(read_fd, 1 << 16)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_fd)
        os.waitpid(pid, 0)
    if not data:
        raise AssertionError("the forked child died without answering")
    result: dict[str, Any] = pickle.loads(data)
    return result


def call_outcomes(calls: Mapping[str, Callable[[], object]]) -> dict[str, str]:
    """Make each call, in order; its outcome by name: ``"ok"`` or ``"<exception type>: <message>"``."""
    seen = {}
    for name, call in calls.items():
        try:
            call()
            seen[name] = "ok"
        except Exception as exc:
            seen[name] = f"{type(exc).__name__}: {exc}"
    return seen


def tier_calls_in_forked_child(
    tier: SecondaryTierManager, view: memoryview, keys: Sequence[OffloadKey], slots: Sequence[int], timeout_s: float
) -> dict[str, str]:
    """Use ``tier`` (built in this process) in a child made by ``os.fork()``; each call's outcome there.

    The child looks up ``keys[0]``, touches ``keys``, loads ``keys`` into ``slots``
    and stores a new key from ``slots[0]`` (each waiting at most ``timeout_s``
    for its job), asks ``get_finished`` and ``stats``, then shuts the tier down.

    Returns:
        Call name -> ``"ok"`` or ``"<exception type>: <message>"``; the key
        ``"shutdown"`` is the outcome of the child's ``shutdown``.

    Raises:
        AssertionError: the child did not answer in time (see :func:`in_forked_child`).
    """
    ctx = ReqContext("forked-child")
    calls: dict[str, Callable[[], object]] = {
        "lookup": lambda: tier.lookup(keys[0], ctx),
        "touch": lambda: tier.touch(keys, ctx),
        "load": lambda: load_blocks(tier, view, keys, slots, timeout_s=timeout_s),
        "store": lambda: store_blocks(tier, view, [make_key(0, b"forked-child")], slots[:1], timeout_s=timeout_s),
        "get_finished": lambda: list(tier.get_finished()),
        "stats": tier.stats,
        "shutdown": tier.shutdown,
    }

    outcome = in_forked_child(lambda: call_outcomes(calls), timeout_s=timeout_s * (len(calls) + 1))
    if "returned" not in outcome:
        raise AssertionError(f"the forked child raised {outcome}")
    seen: dict[str, str] = outcome["returned"]
    return seen

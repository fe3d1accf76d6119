"""Opening an fs tier root: the namespace directory, the writability probe, ``namespace.json``, ``O_DIRECT``.

:func:`prepare_namespace_dir` and :func:`write_namespace_file` run once per
tier instance (they create what is missing); :func:`probe_root` answers "would this root work?" for
``tiering check --probe`` without creating anything that was not there
(every probe file is a :mod:`tiering.fs.layout` temporary, removed at once
and recognised as stale by a later scan if the process dies in between).
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
from typing import Any

from tiering.fs.errors import RootNotUsableError
from tiering.fs.io import Backend, open_backend
from tiering.fs.io.local import LocalBackend
from tiering.fs.io.posix import DIRECT_ALIGN
from tiering.fs.layout import NAMESPACE_FILE, PROBE_NAME, temp_namer

logger = logging.getLogger(__name__)


MOUNTS = "/proc/self/mounts"
"""This process's mount table (``device mountpoint fstype options ...`` lines)."""

PSEUDO_FILESYSTEMS = frozenset(
    {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs", "securityfs", "pstore", "bpf", "configfs"}
)
"""Kernel filesystems that show state rather than store files: creating a file there fails with a misleading errno."""


def filesystem_type(path: str) -> str | None:
    """The type of the filesystem ``path`` lies on (``"proc"``, ``"ext4"``), from the mount table; None when unknown."""
    try:
        with open(MOUNTS, encoding="utf-8") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    real = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for fields in mounts:
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), fields[2])
    return None if best is None else best[1]


def _root_error(
    tier_type: str, root: str, exc: OSError, what: str, local_path: str | None = None
) -> RootNotUsableError:
    """The error of an unusable root; for a local path on a kernel pseudo filesystem, says so instead of the errno."""
    reason = exc.strerror or str(exc)
    fstype = filesystem_type(local_path) if local_path is not None else None
    if fstype in PSEUDO_FILESYSTEMS:
        # /proc answers "No such file or directory" to a new file: the real reason is that it stores nothing
        reason = f"it is on a {fstype!r} filesystem, which shows kernel state and stores no files; choose a disk path"
    return RootNotUsableError(tier_type, f"{root!r}: {what}: {reason}", exc.errno or errno.EIO)


def _write_probe(backend: Backend, directory: str) -> None:
    """Write and remove one small file in ``directory`` (temporary names only)."""
    final = temp_namer(f"{directory}/{PROBE_NAME}")
    backend.write_block(temp_namer(f"{directory}/{PROBE_NAME}"), final, memoryview(b"probe"), memoryview(b""), False)
    backend.remove(final)


def prepare_namespace_dir(backend: Backend, root: str, namespace_dir: str, tier_type: str) -> None:
    """Create ``namespace_dir`` and prove it writable.

    Args:
        backend: the root's back end.
        root: the root as configured (for messages).
        namespace_dir: ``<root>/<digest>``.
        tier_type: the tier's name (for messages).

    Raises:
        RootNotUsableError: the directory cannot be created, is a symlink, or is not writable;
            the message names the ``root`` key, the path and the reason.
    """
    try:
        backend.makedirs(namespace_dir)
    except OSError as exc:
        where = namespace_dir if backend.is_local else None
        raise _root_error(tier_type, root, exc, f"cannot create directory {namespace_dir!r}", where) from exc
    if not backend.is_real_directory(namespace_dir):
        raise RootNotUsableError(tier_type, f"{root!r}: {namespace_dir!r} is a symlink, not a directory", errno.ELOOP)
    try:
        _write_probe(backend, namespace_dir)
    except OSError as exc:
        where = namespace_dir if backend.is_local else None
        raise _root_error(tier_type, root, exc, f"directory {namespace_dir!r} is not writable", where) from exc


def write_namespace_file(
    backend: Backend, root: str, namespace_dir: str, namespace: dict[str, Any], tier_type: str = "fs"
) -> None:
    """Publish ``namespace.json`` in ``namespace_dir`` when it is missing or different.

    Args:
        backend: the root's back end.
        root: the root as configured (for messages).
        namespace_dir: ``<root>/<digest>`` (created by :func:`prepare_namespace_dir`).
        namespace: every namespace field, plus ``digest`` (the JSON written).
        tier_type: the tier's name (for messages).

    Raises:
        RootNotUsableError: the file cannot be written (names ``root``, the path and the reason).
    """
    ns_path = f"{namespace_dir}/{NAMESPACE_FILE}"
    try:
        current = backend.read_small(ns_path)
        if current is not None:
            try:
                if json.loads(current) == namespace:
                    return
            except ValueError:
                pass
            logger.warning("fs tier: %s does not match this namespace; rewriting it", ns_path)
        data = json.dumps(namespace, indent=2, sort_keys=True).encode() + b"\n"
        backend.write_small_atomic(temp_namer(ns_path), ns_path, data)
    except OSError as exc:
        raise _root_error(tier_type, root, exc, f"cannot write {ns_path!r}") from exc


def probe_root(root: str, storage_options: dict[str, Any] | None = None, tier_type: str = "fs") -> str:
    """Check that a tier could be opened at ``root``, leaving nothing behind; returns what was found.

    An existing root gets a probe file (a temporary name, removed at once);
    a missing root is not created: the nearest existing ancestor (local
    roots) gets the probe instead, and the answer says the root would be
    created. For ``tiering check --probe``.

    Raises:
        RootNotUsableError: the root (or the ancestor it would be created in) is not a writable directory.
        ValueError: an unknown protocol.
    """
    backend, base = open_backend(root, dict(storage_options or {}))
    if not backend.is_local:
        try:
            _write_probe(backend, base)
        except OSError as exc:
            raise _root_error(tier_type, root, exc, "not writable") from exc
        return f"{base}: writable (probe file written and removed)"
    existing = base
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        problem = f"{root!r}: cannot create directory {base!r}: {existing!r} is not a directory"
        raise RootNotUsableError(tier_type, problem, errno.ENOTDIR)
    try:
        _write_probe(backend, existing)
    except OSError as exc:
        raise _root_error(tier_type, root, exc, f"directory {existing!r} is not writable", existing) from exc
    if existing == base:
        return f"{base}: exists, writable (probe file written and removed)"
    return f"{base}: does not exist; would be created in {existing!r}, writable (probe file written and removed)"


def _view_address(view: memoryview) -> int | None:
    """Address of the first byte of a writable C-contiguous buffer, None when it cannot be taken."""
    try:
        flat = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        return ctypes.addressof(ctypes.c_char.from_buffer(flat))
    except (TypeError, ValueError, BufferError):
        return None


def direct_obstacle(backend: Backend, namespace_dir: str, block_bytes: int, primary_kv_view: memoryview) -> str | None:
    """Why ``O_DIRECT`` cannot be used for this tier, None when it can (probes the directory once)."""
    if not isinstance(backend, LocalBackend):
        return "the root is not a local filesystem"
    if block_bytes % DIRECT_ALIGN:
        return f"block_bytes {block_bytes} is not a multiple of {DIRECT_ALIGN}"
    address = _view_address(primary_kv_view)
    if address is None:
        return "the primary buffer's address cannot be taken (read-only or not contiguous)"
    if address % DIRECT_ALIGN:
        return f"the primary buffer is not {DIRECT_ALIGN}-byte aligned (address {address:#x})"
    return LocalBackend.probe_direct(namespace_dir)

"""Storage back ends of the fs tier: the local fast path and any fsspec filesystem.

A back end publishes one block atomically (temporary name, then rename),
reads one block into caller-supplied buffers and lists what is stored. It
holds no state about blocks (the tier does) and knows nothing of the layout
(:mod:`tiering.fs.layout` does).

A block file is the payload (one primary slot, at offset 0) followed by a
:data:`~tiering.fs.layout.TRAILER_BYTES` trailer page whose first
``HEADER_SIZE`` bytes are the :mod:`tiering.core.format` header (the rest
zeros). Keeping the payload at offset 0 and the trailer a whole page keeps
every part of the file page aligned, so the local back end can move it with
``O_DIRECT``.

- :class:`~tiering.fs.io.base.Backend`: the interface every back end implements
  (:class:`~tiering.fs.io.base.StoredFile`: one entry a scan lists);
- :class:`~tiering.fs.io.local.LocalBackend`: POSIX files through ``os``
  (vectored positional I/O straight from/into primary slots, optional
  ``O_DIRECT`` with a run-time fallback, no symlink ever followed below the
  root);
- :class:`~tiering.fs.io.remote.FsspecBackend`: any other fsspec filesystem,
  through its file objects.

:func:`open_backend` picks one for a configured root.
"""

from __future__ import annotations

import os
from typing import Any

from tiering.fs.io.base import Backend, StoredFile

__all__ = ["Backend", "StoredFile", "open_backend"]


def open_backend(root: str, storage_options: dict[str, Any]) -> tuple[Backend, str]:
    """The back end for a configured root, and the root in that back end's syntax.

    Plain paths and ``file://`` URLs get the local back end (absolute path,
    ``~`` expanded); any other fsspec URL gets :class:`FsspecBackend` (serialized
    for a chained cache such as ``filecache::``).

    Raises:
        ValueError: an unknown protocol or a filesystem that cannot be opened
            (e.g. ``s3://`` without s3fs installed); the message names the root.
    """
    from tiering.fs.io.local import LocalBackend

    if "://" not in root and "::" not in root:
        return LocalBackend(), os.path.abspath(os.path.expanduser(root))
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    from tiering.fs.io.remote import backend_for

    try:
        fs, path = fsspec.core.url_to_fs(root, **storage_options)
    except (ValueError, ImportError) as exc:
        raise ValueError(f"cannot open root {root!r}: {exc}") from exc
    if isinstance(fs, LocalFileSystem):
        return LocalBackend(), os.path.abspath(path)
    return backend_for(fs), str(path).rstrip("/") or "/"

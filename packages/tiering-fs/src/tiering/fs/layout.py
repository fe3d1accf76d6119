"""Where the fs tier puts things: block paths, file names, temporary names and their owners.

Layout under ``root``::

    <root>/<namespace digest>/namespace.json        every namespace field, clear text
    <root>/<namespace digest>/<ab>/<key hex>.kvb

``ab`` is the low byte of XXH3-64 of the key in two hex digits (keys are
opaque, so they are hashed once more to spread them evenly): 256 shard
directories, so a store creates a directory only the first time its shard is
used (a deeper tree would cost a ``mkdir`` for most stores of a young cache)
and each directory holds 1/256 of the namespace, which ext4 and XFS index.
Each ``.kvb`` file is the block bytes (one primary slot, at offset 0)
followed by a :data:`TRAILER_BYTES` trailer page: the
:mod:`tiering.core.format` header (128 bytes), then zeros.

Every file the tier creates other than those two kinds is a **temporary**
named ``<final name>.tmp.<host>.<pid>.<nonce>.<counter>``: a block being
written, ``namespace.json`` being replaced, or a probe (``.probe``,
``.odirect-probe``). ``nonce`` is 8 hex digits drawn once per process, so a
temporary left by a dead process whose pid was reused (a container restart)
is still told apart from one of a live writer; ``counter`` makes names
unique within the process without a random draw (a system call) per block.
:func:`temp_owner` parses the owner back; :mod:`tiering.fs.scanner` decides
from it (and the file's age) whether a temporary is provably stale.

This module holds no state and does no I/O; the tier and the offline
inspector (:mod:`tiering.fs.inspection`) both import it.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
from typing import NamedTuple

from tiering.core.format import checksum

BLOCK_SUFFIX = ".kvb"
"""Suffix of a published block file."""

TMP_MARK = ".tmp."
"""Marker between a final name and the owner part of a temporary name."""

NAMESPACE_FILE = "namespace.json"
"""Name of the file that lists a namespace's fields in clear text."""

TRAILER_BYTES = 4096
"""Size of the trailer page after the payload: the block header, then zeros."""

PROBE_NAME = ".probe"
"""Final-name stem of the writability probe (only ever written under a temporary name)."""

ODIRECT_PROBE_NAME = ".odirect-probe"
"""Final-name stem of the ``O_DIRECT`` probe (only ever written under a temporary name)."""

HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
"""This host's name as it appears in temporary names (characters outside ``[A-Za-z0-9_-]`` become ``_``)."""

DIGEST_RE = re.compile(r"^[0-9a-f]{32}$")
"""A namespace directory name: the 32-hex-digit namespace digest."""

BLOCK_RE = re.compile(r"^([0-9a-f]{2})/((?:[0-9a-f]{2})+)\.kvb$")
"""A block file's path relative to its namespace directory: ``<ab>/<key hex>.kvb``."""

TEMP_RE = re.compile(r"\.tmp\.([A-Za-z0-9_-]+)\.(\d+)\.([0-9a-f]{8})\.([0-9a-f]+)$")
"""The owner part at the end of a temporary name: host, pid, nonce, counter."""

LEGACY_TEMP_RE = re.compile(r"\.tmp\.([A-Za-z0-9_-]+)\.(\d+)\.([0-9a-f]+)$")
"""Temporary names of tiering-fs 0.1 (host, pid, token; no nonce): still recognised and cleaned."""


class TempOwner(NamedTuple):
    """Who created a temporary file, parsed from its name.

    Attributes:
        host: the writer's host name (as in :data:`HOST`).
        pid: the writer's process id on that host.
        nonce: the writer's per-process nonce, "" for a 0.1 name without one.
    """

    host: str
    pid: int
    nonce: str


def shard_of(key: bytes) -> str:
    """The shard directory name of ``key``: two hex digits, the low byte of XXH3-64(key)."""
    return f"{checksum(key) & 0xFF:02x}"


def block_path(namespace_dir: str, key: bytes) -> str:
    """Path of ``key``'s block file: ``<namespace_dir>/<ab>/<key hex>.kvb`` (``/`` separators)."""
    return f"{namespace_dir}/{shard_of(key)}/{key.hex()}{BLOCK_SUFFIX}"


def key_of_block_name(name: str) -> bytes | None:
    """The key of a block file's base name ``<key hex>.kvb``; None for any other name."""
    if not name.endswith(BLOCK_SUFFIX):
        return None
    try:
        return bytes.fromhex(name[: -len(BLOCK_SUFFIX)])
    except ValueError:
        return None


def is_temp_name(name: str) -> bool:
    """Whether a base name is a temporary of some fs tier process (this version's or 0.1's)."""
    return TEMP_RE.search(name) is not None or LEGACY_TEMP_RE.search(name) is not None


def temp_owner(name: str) -> TempOwner | None:
    """The owner encoded in a temporary name; None when ``name`` is not a temporary."""
    match = TEMP_RE.search(name)
    if match is not None:
        return TempOwner(match.group(1), int(match.group(2)), match.group(3))
    match = LEGACY_TEMP_RE.search(name)
    if match is not None:
        return TempOwner(match.group(1), int(match.group(2)), "")
    return None


class TempNamer:
    """Makes this process's temporary names: ``<final>.tmp.<host>.<pid>.<nonce>.<counter hex>``.

    One random draw per process (the nonce), then a counter: no system call
    per name. The pid and the nonce are taken again in a forked child
    (``os.register_at_fork``), so a child's names carry its own pid and nonce.
    Thread-safe: ``next()`` of an ``itertools.count`` is atomic in CPython.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.nonce = os.urandom(4).hex()
        self.pid = os.getpid()
        self._prefix = f"{TMP_MARK}{HOST}.{self.pid}.{self.nonce}."
        self._counter = itertools.count()

    def owner(self) -> TempOwner:
        """This process's owner triple as it appears in its temporary names."""
        return TempOwner(HOST, self.pid, self.nonce)

    @property
    def prefix(self) -> str:
        """What follows a final name in this process's temporaries, before the counter: ``.tmp.<host>.<pid>.<nonce>.``.

        The native batch path (:mod:`tiering.fs.native`) appends its own counter, from a
        range this class never reaches (``2**40`` up), so the two never make the same name.
        """
        return self._prefix

    def __call__(self, final: str) -> str:
        """A new temporary name next to ``final`` (same directory)."""
        return f"{final}{self._prefix}{next(self._counter):x}"


temp_namer = TempNamer()
"""The process-wide :class:`TempNamer` (one nonce per process, shared by every tier instance)."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=temp_namer._reset)

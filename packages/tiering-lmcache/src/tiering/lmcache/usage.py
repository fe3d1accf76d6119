"""Bytes an LMCache adapter's tier holds, per cache salt, kept across restarts. Imports nothing from LMCache.

LMCache reads ``bytes_by_cache_salt`` from every L2 adapter (its quota
endpoints compare it with each salt's limit). LMCache's fs adapter counts
only what its own process stored, so a restart forgets every object still
on disk. Here each key carries its salt's tag
(:func:`~tiering.lmcache.keys.salt_tag`): at start the adapter lists
the keys of its namespace (:func:`scan_keys`, the tier's inspector: a
directory walk, a bucket listing, a Redis scan), keeps those the tier still
holds, and counts them again (:meth:`SaltUsage.restored`).

Each object counts one row (:func:`~tiering.lmcache.keys.row_bytes`, what the tier
stores for it, a last partial chunk included), as LMCache's raw-block
adapter counts its slots.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.inspection import inspector_for
from tiering.lmcache.keys import PLAIN_SALT_BYTES, key_salt_tag, salt_of, salt_tag

logger = logging.getLogger(__name__)


class SaltUsage:
    """Rows held per cache salt, key by key. Not thread safe: the adapter calls it under its lock.

    Args:
        row_bytes: bytes counted per object (the tier's row, :func:`~tiering.lmcache.keys.row_bytes`).
    """

    def __init__(self, row_bytes: int) -> None:
        self.row_bytes = row_bytes
        self._salt: dict[OffloadKey, str] = {}  # key -> its salt, for every key counted
        self._object: dict[OffloadKey, Any] = {}  # key -> LMCache's ObjectKey, for keys stored by this process
        self._bytes: dict[str, int] = {}
        self._names: dict[bytes, str] = {}  # hashed tag -> salt, once a key of that salt was seen
        self._unnamed: dict[bytes, set[OffloadKey]] = {}  # hashed tag -> restored keys of a salt not seen yet

    def learn(self, salt: str) -> None:
        """A request carried ``salt``: count the restored keys of a long (hashed) salt under its name from now on."""
        if len(salt.encode()) <= PLAIN_SALT_BYTES:
            return  # a short salt is in its keys as it is
        tag = salt_tag(salt)
        if tag in self._names:
            return
        self._names[tag] = salt
        for key in self._unnamed.pop(tag, ()):
            self._count(key, salt)

    def _count(self, key: OffloadKey, salt: str) -> None:
        self._salt[key] = salt
        self._bytes[salt] = self._bytes.get(salt, 0) + self.row_bytes

    def stored(self, key: OffloadKey, object_key: Any) -> bool:
        """Count ``key`` (stored now under LMCache's ``object_key``); False when it was counted already."""
        if key in self._salt:
            return False
        self._forget_unnamed(key)
        self._count(key, object_key.cache_salt)
        self._object[key] = object_key
        return True

    def restored(self, keys: Iterable[OffloadKey]) -> int:
        """Count keys the tier held at start (found by :func:`scan_keys`); returns how many were new.

        A key of a salt short enough to be in the key is counted under it at
        once; one of a hashed salt is counted once :meth:`learn` sees that salt.
        """
        new = 0
        for key in keys:
            tag = key_salt_tag(key)
            if tag is None or key in self._salt:
                continue
            salt = salt_of(tag)
            if salt is None:
                salt = self._names.get(tag)
            if salt is None:
                self._unnamed.setdefault(tag, set()).add(key)
            else:
                self._count(key, salt)
            new += 1
        return new

    def _forget_unnamed(self, key: OffloadKey) -> None:
        tag = key_salt_tag(key)
        keys = self._unnamed.get(tag) if tag is not None else None
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._unnamed[tag]  # type: ignore[arg-type]

    def removed(self, keys: Iterable[OffloadKey]) -> list[Any]:
        """Stop counting ``keys`` (the tier removed them); returns the LMCache ``ObjectKey`` s known of them."""
        gone = []
        for key in keys:
            self._forget_unnamed(key)
            salt = self._salt.pop(key, None)
            if salt is None:
                continue
            left = self._bytes[salt] - self.row_bytes
            if left > 0:
                self._bytes[salt] = left
            else:
                del self._bytes[salt]
            object_key = self._object.pop(key, None)
            if object_key is not None:
                gone.append(object_key)
        return gone

    def by_salt(self) -> dict[str, int]:
        """Bytes per cache salt (salts with none left are absent); restored keys of unseen long salts are not in it."""
        return dict(self._bytes)

    def unnamed_bytes(self) -> int:
        """Bytes of restored keys whose (long, hashed) salt no request carried yet."""
        return sum(len(keys) for keys in self._unnamed.values()) * self.row_bytes


def scan_keys(tier_entry: Mapping[str, Any], digest: str) -> list[OffloadKey]:
    """The keys the tier of ``tier_entry`` holds in namespace ``digest`` (its inspector's listing).

    Returns an empty list for a tier without an inspector (one that keeps
    nothing across a restart).

    Raises:
        Whatever the tier's inspector raises listing its root or bucket.
    """
    inspector = inspector_for(tier_entry)
    if inspector is None:
        return []
    return [OffloadKey(block.key) for block in inspector.blocks(digest)]

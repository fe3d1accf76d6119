"""Offline inspection of a redis tier's keys for ``tiering ls / stat / gc / verify``.

Only keys laid out by :mod:`tiering.redis.layout` are ours: ``<prefix>:<digest>:namespace``,
``<prefix>:<digest>:<key hex>`` blocks, ``<prefix>:<digest>:probe:<hex>`` probes and
``<prefix>:{<digest>}:lru``, the fleet's LRU of ``eviction: "tier"`` (blocks removed by
``gc`` leave it too; removing a namespace removes it). Any
other key under ``<prefix>:`` is foreign: reported, never deleted. Nothing outside the
prefix is read or deleted. Keys are listed with ``SCAN MATCH <prefix>:*`` (on every primary
of a cluster), never ``KEYS``, so a large server is not blocked.

Redis keeps no modification time: a block's ``mtime`` is the time of its last access
(now minus ``OBJECT IDLETIME``), which is what ``tiering gc --older-than`` should prune by
for a cache; under an LFU policy, where IDLETIME is not kept, it is the time of the listing.

Inspecting is not an access: a listing must neither reset the ages it reports nor make every
block look recently used to the server's ``allkeys-lru`` eviction. ``OBJECT IDLETIME`` and
``EXISTS`` never touch a key; ``STRLEN`` does, so sizes are read with ``STRLEN`` only under
``CLIENT NO-TOUCH ON`` (Redis 7.2 and later). An older server does not know that command: a
block's size is then the size every block of the namespace has (its header plus the
namespace record's ``block_bytes``), and a value of another length is found by
``tiering verify``, which reads every block it checks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from redis.cluster import RedisCluster
from tiering.core.format import HEADER_SIZE
from tiering.core.inspection import BlockInfo, ObjectStoreInspector
from tiering.redis.config import RedisSettings
from tiering.redis.errors import RedisStartupError, classify_error
from tiering.redis.layout import KeyLayout, is_digest

SCAN_COUNT = 1000
"""Keys per ``SCAN`` step."""
BATCH = 512
"""Keys per pipeline of ``STRLEN`` / ``OBJECT IDLETIME`` / ``UNLINK``."""


class RedisInspector(ObjectStoreInspector):
    """Walks and prunes the keys of a redis tier's prefix.

    Args:
        client: a redis-py client (:class:`redis.Redis` or :class:`redis.cluster.RedisCluster`).
        settings: the validated entry (prefix, location, redaction).
    """

    def __init__(self, client: Any, settings: RedisSettings) -> None:
        self._client = client
        self._settings = settings
        self.layout = KeyLayout(settings["prefix"])
        self._no_touch: bool | None = None  # CLIENT NO-TOUCH known to work (None: not tried yet)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RedisInspector:
        """Open the server of a ``redis`` entry and ``PING`` it (nothing is written).

        Raises:
            tiering.core.schema.TierConfigError: a wrong, missing or unknown key.
            RedisStartupError: (an ``OSError``) the server is unreachable or refuses the credentials.
        """
        settings = RedisSettings.from_config({k: v for k, v in config.items() if k not in ("type", "module_path")})
        try:
            client = settings.make_client()
            client.ping()
        except Exception as exc:
            raise RedisStartupError(
                f"redis tier: cannot reach {settings.location()}: {settings.redact(f'{type(exc).__name__}: {exc}')}",
                classify_error(exc),
            ) from None
        return cls(client, settings)

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()

    # -- helpers -------------------------------------------------------------------
    def _fail(self, what: str, exc: BaseException) -> RedisStartupError:
        text = self._settings.redact(f"{type(exc).__name__}: {exc}")
        return RedisStartupError(f"redis tier: {what} at {self.location()} failed: {text}", classify_error(exc))

    def _scan(self, pattern: str) -> Iterator[str]:
        kwargs: dict[str, Any] = {"match": pattern, "count": SCAN_COUNT}
        if isinstance(self._client, RedisCluster):
            kwargs["target_nodes"] = RedisCluster.PRIMARIES
        try:
            for name in self._client.scan_iter(**kwargs):
                yield name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        except Exception as exc:
            raise self._fail(f"SCAN of {pattern!r}", exc) from None

    def _pipelined(self, command: str, names: list[str], no_touch: bool = False) -> list[Any]:
        """``command`` (``STRLEN``, ``IDLETIME`` or ``UNLINK``) of every name, :data:`BATCH` per round trip.

        With ``no_touch``, each batch runs between ``CLIENT NO-TOUCH ON`` and ``OFF`` on its connection
        (a pipeline is one connection), so reads do not count as accesses.
        """
        out: list[Any] = []
        for start in range(0, len(names), BATCH):
            pipe = self._client.pipeline(transaction=False)
            if no_touch:
                pipe.execute_command("CLIENT", "NO-TOUCH", "ON")
            for name in names[start : start + BATCH]:
                if command == "IDLETIME":
                    pipe.object("idletime", name)
                else:
                    getattr(pipe, command.lower())(name)
            if no_touch:
                pipe.execute_command("CLIENT", "NO-TOUCH", "OFF")
            try:
                replies = pipe.execute(raise_on_error=False)
            except Exception as exc:
                raise self._fail(f"{command} of {len(names)} keys", exc) from None
            out.extend(replies[1:-1] if no_touch else replies)
        return out

    def _supports_no_touch(self) -> bool:
        """Whether ``CLIENT NO-TOUCH`` works here (Redis 7.2+; never on a cluster, whose pipelines span connections)."""
        if self._no_touch is None and isinstance(self._client, RedisCluster):
            self._no_touch = False
        if self._no_touch is None:
            try:
                self._client.execute_command("CLIENT", "NO-TOUCH", "OFF")
                self._no_touch = True
            except Exception:  # an unknown subcommand (older server) or a denied one (ACL)
                self._no_touch = False
        return self._no_touch

    def _block_size(self, digest: str) -> int | None:
        """Stored bytes of every block of the namespace (header + ``block_bytes``), None without a record."""
        fields = self.namespace_fields(digest)
        block_bytes = fields.get("block_bytes") if fields else None
        return HEADER_SIZE + block_bytes if isinstance(block_bytes, int) and block_bytes > 0 else None

    def _check_digest(self, digest: str) -> None:
        if not isinstance(digest, str) or not is_digest(digest):
            raise ValueError(f"{digest!r} is not a namespace digest (32 hex characters)")

    def check_block(self, digest: str, block: BlockInfo) -> None:
        parsed = self.layout.parse(block.name)
        if parsed is None or parsed[0] != digest or parsed[1] != "block":
            raise ValueError(
                f"refusing to touch {block.name!r}: not a block key of namespace {digest} under {self.layout.prefix}:"
            )

    # -- TierInspector -------------------------------------------------------------
    def location(self) -> str:
        return f"{self._settings.location()}, keys {self.layout.prefix}:*"

    def namespaces(self) -> list[str]:
        found = set()
        for name in self._scan(self.layout.pattern()):
            parsed = self.layout.parse(name)
            if parsed is not None:
                found.add(parsed[0])
        return sorted(found)

    def read_namespace_file(self, digest: str) -> bytes | None:
        self._check_digest(digest)
        try:
            raw = self._client.get(self.layout.namespace_key(digest))
        except Exception as exc:
            raise self._fail("GET of the namespace record", exc) from None
        return bytes(raw) if raw is not None else None

    def blocks(self, digest: str) -> Iterator[BlockInfo]:
        self._check_digest(digest)
        names: list[tuple[str, bytes]] = []
        for name in self._scan(self.layout.pattern(digest)):
            parsed = self.layout.parse(name)
            if parsed is not None and parsed[1] == "block" and parsed[0] == digest and parsed[2] is not None:
                names.append((name, parsed[2]))
        exact = self._supports_no_touch()
        nominal = None if exact else self._block_size(digest)
        read_sizes = exact or nominal is None  # no record to size blocks by: STRLEN, even if it touches
        for start in range(0, len(names), BATCH):
            chunk = [n for n, _ in names[start : start + BATCH]]
            now = time.time()
            idle = self._pipelined("IDLETIME", chunk)  # first: it never touches a key
            sizes = self._pipelined("STRLEN", chunk, no_touch=exact) if read_sizes else [nominal] * len(chunk)
            for (name, key), size, idle_s in zip(names[start : start + BATCH], sizes, idle, strict=True):
                if idle_s is None or not isinstance(size, int) or size <= 0:  # deleted since the scan
                    continue
                mtime = now - idle_s if isinstance(idle_s, int) else now
                yield BlockInfo(name, key, size, mtime)

    def foreign(self) -> Iterator[str]:
        for name in self._scan(self.layout.pattern()):
            if self.layout.parse(name) is None:
                yield name

    def get_object(self, name: str) -> bytes | None:
        try:
            data = self._client.get(name)
        except Exception as exc:
            raise self._fail(f"GET of {name!r}", exc) from None
        return None if data is None else bytes(data)

    def delete_objects(self, digest: str, blocks: list[BlockInfo]) -> int:
        results = self._pipelined("UNLINK", [b.name for b in blocks])
        self._uncount(digest, [b.key for b in blocks])
        return sum(1 for r in results if r == 1)

    def _uncount(self, digest: str, keys: list[bytes]) -> None:
        """Take removed blocks out of the fleet's LRU (``eviction: "tier"``; a no-op when there is none)."""
        lru = self.layout.lru_key(digest)
        for start in range(0, len(keys), BATCH):
            try:
                self._client.zrem(lru, *(k.hex() for k in keys[start : start + BATCH]))
            except Exception as exc:
                raise self._fail(f"ZREM of {len(keys)} removed blocks from {lru!r}", exc) from None

    def remove_namespace(self, digest: str) -> int:
        self._check_digest(digest)
        blocks: list[str] = []
        others: list[str] = []
        for name in self._scan(self.layout.pattern(digest)):
            parsed = self.layout.parse(name)
            if parsed is None or parsed[0] != digest:
                continue
            (blocks if parsed[1] == "block" else others).append(name)
        removed = sum(1 for r in self._pipelined("UNLINK", blocks) if r == 1)
        self._pipelined("UNLINK", [*others, self.layout.lru_key(digest), self.layout.pins_key(digest)])
        return removed

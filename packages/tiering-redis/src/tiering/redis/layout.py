"""Key names of a redis tier: where each block and namespace record lives.

Layout (``:`` separated, the Redis convention)::

    <prefix>:<namespace digest>:namespace       the namespace's fields as JSON (clear text)
    <prefix>:<namespace digest>:<key hex>       one block: core header + payload
    <prefix>:<namespace digest>:probe:<32 hex>  a start-up probe (written, read and deleted at once)
    <prefix>:{<namespace digest>}:lru           eviction "tier": the fleet's shared LRU (a sorted set,
                                                see :mod:`tiering.redis.fleet`; one hash tag, one slot)
    <prefix>:{<namespace digest>}:pins          pinned blocks: key hex scored by the pin's expiry
                                                (a sorted set, see :mod:`tiering.redis.pins`)
    <prefix>:{<namespace digest>}:lru:t:<tag>   with tenants, one per tenant with a quota (the same slot;
                                                :mod:`tiering.redis.fleet_tenants`)

No block key carries a hash tag (``{...}``), so in Redis Cluster the blocks of one
namespace spread over every slot (and so every primary); the prefix may not
contain ``{`` or ``}`` for that reason. Block keys hold only lower-case hex
after the digest, so neither ``namespace`` nor ``probe:...`` can be mistaken
for a block.

Imported by the tier and the inspector alike, so both name keys the same way.
"""

from __future__ import annotations

import re

NAMESPACE_SUFFIX = "namespace"
PROBE_INFIX = "probe"
LRU_SUFFIX = "lru"
PINS_SUFFIX = "pins"
_DIGEST = re.compile(r"^[0-9a-f]{32}$")
_HEX = re.compile(r"^(?:[0-9a-f]{2})+$")
_PROBE = re.compile(r"^probe:[0-9a-f]{32}$")


def check_prefix(prefix: str) -> str | None:
    """Why ``prefix`` cannot be a key prefix, or None when it can (a check for the config schema)."""
    if not prefix:
        return "must not be empty"
    if "{" in prefix or "}" in prefix:
        return "must not contain '{' or '}' (a Redis Cluster hash tag would put every block in one slot)"
    if any(ch.isspace() for ch in prefix):
        return "must not contain whitespace"
    return None


def is_digest(text: str) -> bool:
    """Whether ``text`` is a namespace digest (32 lower-case hex characters)."""
    return bool(_DIGEST.match(text))


class KeyLayout:
    """The key names of one prefix.

    Args:
        prefix: the configured key prefix (checked by :func:`check_prefix`).

    Raises:
        ValueError: ``prefix`` is not usable (the message says why).
    """

    def __init__(self, prefix: str) -> None:
        problem = check_prefix(prefix)
        if problem:
            raise ValueError(f"redis tier: prefix {prefix!r} {problem}")
        self.prefix = prefix

    def base(self, digest: str) -> str:
        """``<prefix>:<digest>``: the start of every key of namespace ``digest``."""
        return f"{self.prefix}:{digest}"

    def block_key(self, digest: str, key: bytes) -> str:
        """The Redis key of block ``key`` (an OffloadKey) in namespace ``digest``."""
        return f"{self.prefix}:{digest}:{key.hex()}"

    def lru_key(self, digest: str) -> str:
        """The sorted set of the fleet-wide cap (``eviction: "tier"``); hash-tagged, so one cluster slot."""
        return f"{self.prefix}:{{{digest}}}:{LRU_SUFFIX}"

    def pins_key(self, digest: str) -> str:
        """The sorted set of pinned blocks (:mod:`tiering.redis.pins`); hash-tagged, so one cluster slot."""
        return f"{self.prefix}:{{{digest}}}:{PINS_SUFFIX}"

    def namespace_key(self, digest: str) -> str:
        """The Redis key holding the namespace's JSON record."""
        return f"{self.prefix}:{digest}:{NAMESPACE_SUFFIX}"

    def probe_key(self, digest: str, nonce: str) -> str:
        """A start-up probe key (``nonce``: 32 hex characters)."""
        return f"{self.prefix}:{digest}:{PROBE_INFIX}:{nonce}"

    def pattern(self, digest: str | None = None) -> str:
        """A ``SCAN MATCH`` pattern of every key of ``digest`` (of every namespace when None).

        Glob characters of the prefix are escaped, so the pattern matches only this prefix.
        """
        escaped = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix)
        return f"{escaped}:{digest}:*" if digest else f"{escaped}:*"

    def parse(self, name: str | bytes) -> tuple[str, str, bytes | None] | None:
        """Classify a key name of this prefix.

        Returns:
            ``(digest, kind, key)`` with kind ``"block"`` (``key`` the
            OffloadKey), ``"namespace"``, ``"probe"``, ``"lru"`` or ``"pins"`` (``key`` None); None
            for a name that is not ours (another prefix, or foreign under ours).
        """
        text = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
        head = self.prefix + ":"
        if not text.startswith(head):
            return None
        digest, sep, rest = text[len(head) :].partition(":")
        lru = rest == LRU_SUFFIX or rest.startswith(LRU_SUFFIX + ":t:")  # per-tenant sets: tiering.redis.fleet_tenants
        if digest[:1] == "{" and digest[-1:] == "}" and is_digest(digest[1:-1]) and (lru or rest == PINS_SUFFIX):
            return digest[1:-1], "lru" if lru else rest, None
        if not sep or not is_digest(digest):
            return None
        if rest == NAMESPACE_SUFFIX:
            return digest, "namespace", None
        if _PROBE.match(rest):
            return digest, "probe", None
        if _HEX.match(rest) and len(rest) <= 128:
            return digest, "block", bytes.fromhex(rest)
        return None

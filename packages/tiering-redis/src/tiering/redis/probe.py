"""The start-up probe of a redis tier: can we reach, write, read and delete, and who evicts?

Run by the tier's constructor (so ``tiering check --probe`` runs it too):

1. ``PING`` (reachability, credentials, TLS);
2. ``INFO`` of every primary: ``maxmemory`` and ``maxmemory_policy``,
   which say whether the server evicts (the eviction authority check), and
   who the primaries are (``run_id``, replication ids: :class:`Primaries`);
3. ``SET NX`` of the namespace record, then a write / read / delete probe of a
   throw-away key (``SET EX 60``, ``GET``, ``UNLINK``).

Any failure raises :class:`~tiering.redis.errors.RedisStartupError` whose
message names the server (never a credential) and what to check.

Later, :class:`PrimaryWatch` asks ``INFO`` again now and then to notice a
new primary (a restart or a failover) that raised no error.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.cluster import RedisCluster
from tiering.redis.errors import RedisStartupError, classify_error
from tiering.redis.layout import KeyLayout

logger = logging.getLogger(__name__)

EVICTING_POLICIES = ("allkeys-lru", "allkeys-lfu", "allkeys-random")
"""``maxmemory-policy`` values under which the server evicts blocks without a TTL."""

RUN_ID_CHECK_S = 1.0
"""Seconds between checks of the primary's ``run_id`` (one ``INFO``) while the tier sends pipelines, errors or not.

redis-py re-makes a pooled connection that the server closed without raising,
so a failover (the sentinel names the new primary) or a quick restart may
show no error at all.
"""


@dataclasses.dataclass(frozen=True)
class Primaries:
    """Which servers are the primaries, and the history of their data sets (``INFO``).

    Attributes:
        run_ids: the ``run_id`` of every primary (empty when INFO is not
            permitted); a change means a restart or a failover.
        lineage: per primary ``(master_replid, master_replid2)``: the
            replication id of its data set, and the one it continued when it was
            promoted from replica (``0`` otherwise).
    """

    run_ids: frozenset[str] = frozenset()
    lineage: frozenset[tuple[str, str]] = frozenset()

    @classmethod
    def from_info(cls, infos: Sequence[Mapping[str, Any]]) -> Primaries:
        """From the ``INFO`` (sections server and replication) of every primary."""
        return cls(
            frozenset(str(i.get("run_id", "")) for i in infos),
            frozenset((str(i.get("master_replid", "")), str(i.get("master_replid2", ""))) for i in infos),
        )

    def continues(self, old: Primaries) -> bool:
        """Whether every primary's data set continues one of ``old``'s: unchanged, or a promoted replica of it.

        A server restarted empty starts a new replication history, so it does not.
        """
        known = {replid for replid, _ in old.lineage} - {"", "0"}
        return bool(self.lineage) and all(r in known or r2 in known for r, r2 in self.lineage)


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """What the probe learnt about the server(s).

    Attributes:
        maxmemory: the smallest ``maxmemory`` over the primaries, bytes (0: no limit;
            -1: INFO not permitted).
        policy: ``maxmemory_policy`` (``"unknown"`` when INFO is not permitted;
            ``"mixed"`` when primaries differ).
        primaries: number of primaries answering INFO (1 for a single server).
        version: ``redis_version`` of the first primary (``"unknown"`` when not permitted).
        identity: who the primaries are (:class:`Primaries`; empty when not permitted).
    """

    maxmemory: int
    policy: str
    primaries: int
    version: str
    identity: Primaries = Primaries()

    @property
    def server_evicts(self) -> bool:
        """Whether the server evicts keys without a TTL when full."""
        return self.maxmemory > 0 and self.policy in EVICTING_POLICIES

    def warn_eviction_authority(self, location: str, capacity: int | None, has_ttl: bool) -> None:
        """Log a warning when nothing bounds the tier's blocks, or when two parties evict them.

        Args:
            location: the server, as logs name it.
            capacity: the tier's own cap in bytes (``capacity_bytes`` or the fleet cap); None: none.
            has_ttl: whether blocks are stored with a TTL.
        """
        info = self
        if capacity is None and info.maxmemory == 0:
            logger.warning(
                "redis tier: %s has no maxmemory and the tier no capacity_bytes: nothing bounds the blocks "
                "stored; set maxmemory with maxmemory-policy allkeys-lru on the server (or eviction 'tier')",
                location,
            )
        elif capacity is None and info.maxmemory > 0 and info.policy not in EVICTING_POLICIES:
            logger.warning(
                "redis tier: %s has maxmemory %d with policy %s, which does not evict blocks%s: stores fail "
                "with OOM when it is full; use allkeys-lru",
                location,
                info.maxmemory,
                info.policy,
                "" if has_ttl else " (they have no TTL)",
            )
        elif capacity is not None and info.server_evicts:
            logger.warning(
                "redis tier: the tier caps the blocks (eviction 'tier' or 'process') but %s also evicts "
                "(maxmemory %d, %s): blocks it evicts become misses",
                location,
                info.maxmemory,
                info.policy,
            )


def _info(client: Any, section: str) -> list[dict[str, Any]]:
    if isinstance(client, RedisCluster):
        answer = client.info(section, target_nodes=RedisCluster.PRIMARIES)
        # one primary: redis-py answers that node's dict; several: {node name: dict}
        if answer and all(isinstance(v, dict) for v in answer.values()):
            return list(answer.values())
        return [answer]
    return [client.info(section)]


def _default_info(client: Any) -> list[dict[str, Any]] | None:
    """``INFO`` (the default sections: server, memory, replication, ...) of every primary; None when not permitted.

    Raises:
        redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: the server is unreachable.
    """
    try:
        return _info(client, "default")
    except Exception as exc:
        if classify_error(exc) not in ("credentials", "other"):
            raise
        return None


def server_info(client: Any) -> ServerInfo:
    """``INFO`` of every primary, summarized; INFO refused (ACL) gives unknowns.

    Raises:
        redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: the server is unreachable.
    """
    infos = _default_info(client)
    if infos is None:
        logger.warning("redis tier: INFO is not permitted; cannot tell whether the server evicts")
        return ServerInfo(-1, "unknown", 0, "unknown")
    limits = [int(i.get("maxmemory", 0)) for i in infos]
    policies = {str(i.get("maxmemory_policy", "unknown")) for i in infos}
    limited = [x for x in limits if x > 0]
    maxmemory = min(limited) if len(limited) == len(limits) and limited else 0
    policy = policies.pop() if len(policies) == 1 else "mixed"
    version = str(infos[0].get("redis_version", "unknown")) if infos else "unknown"
    return ServerInfo(maxmemory, policy, len(infos), version, Primaries.from_info(infos))


def primaries(client: Any) -> Primaries:
    """Who the primaries are now (one ``INFO`` of each); empty when INFO is not permitted.

    Raises:
        redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: the server is unreachable.
    """
    infos = _default_info(client)
    return Primaries() if infos is None else Primaries.from_info(infos)


def probe(
    client: Any,
    layout: KeyLayout,
    digest: str,
    namespace_json: bytes,
    location: str,
    redact: Callable[[str], str],
) -> ServerInfo:
    """Run the start-up probe (see the module docstring).

    Args:
        client: the redis-py client.
        layout: the tier's key layout.
        digest: the namespace digest (hex).
        namespace_json: the namespace record written with ``SET NX``.
        location: where the server is, for messages (no credentials).
        redact: removes configured secrets from a text.

    Raises:
        RedisStartupError: the server is unreachable, refuses the credentials,
            or a probe step failed; ``cause`` says which.
    """
    step = "PING"
    try:
        client.ping()
        step = "INFO"
        info = server_info(client)
        step = "SET NX of the namespace record"
        client.set(layout.namespace_key(digest), namespace_json, nx=True)
        step = "the write/read/delete probe"
        key = layout.probe_key(digest, uuid.uuid4().hex)
        body = uuid.uuid4().bytes
        client.set(key, body, ex=60)
        back = client.get(key)
        client.unlink(key)
    except Exception as exc:
        cause = classify_error(exc)
        hint = {
            "credentials": "check username / password (ACL) of the tier entry",
            "connection": "check url / host / port and that the server runs",
            "timeout": "the server did not answer within socket_timeout_s / socket_connect_timeout_s",
            "readonly": "the server is a replica; point the tier at the primary (or use mode sentinel)",
            "no_space": "the server is out of memory and does not evict (maxmemory-policy noeviction)",
            "loading": "the server is still loading its data set; retry shortly",
            "moved": "the cluster is resharding or down",
        }.get(cause, "see the error")
        raise RedisStartupError(
            f"redis tier: {step} at {location} failed ({cause}): {redact(f'{type(exc).__name__}: {exc}')}; {hint}",
            cause,
        ) from None
    if back != body:
        raise RedisStartupError(
            f"redis tier: the probe key read back from {location} differs from what was written", "probe"
        )
    return info


class PrimaryWatch:
    """Notices a change of primary (a restart or a failover) by the primaries' ``run_id``, before round trips.

    Args:
        client: the tier's redis-py client.
        known: the primaries the start-up probe found (empty when ``INFO`` is not permitted: never checked).
        on_change: called once per change, on the thread that noticed it: ``on_change(kept)``, ``kept``
            True when the new primaries continue the old data set (:meth:`Primaries.continues`: a promoted
            replica), False for a new data set (a restart).
    """

    def __init__(self, client: Any, known: Primaries, on_change: Callable[[bool], None]) -> None:
        self._client = client
        self._known = known
        self._on_change = on_change
        self._recheck = False  # set after connection trouble: was the server restarted meanwhile?
        self._lock = threading.Lock()
        self._next = time.monotonic() + RUN_ID_CHECK_S  # the next check (the probe just learnt the primaries)

    def suspect(self) -> None:
        """A request failed in a way a change of primary explains: the next :meth:`check` asks at once."""
        self._recheck = True

    def check(self) -> None:
        """Ask ``INFO`` when due: every :data:`RUN_ID_CHECK_S`, or at once after :meth:`suspect`.

        A failed ``INFO`` is not raised (the request that follows fails and counts on its own). One thread
        checks at a time (the others go on with their requests), so a change is reported once.
        """
        if not self._known.run_ids or not (self._recheck or time.monotonic() >= self._next):
            return
        if not self._lock.acquire(blocking=False):
            return  # another thread is checking
        try:
            self._next = time.monotonic() + RUN_ID_CHECK_S
            try:
                now = primaries(self._client)
            except Exception:
                return  # still down (or no primary yet): the request fails, and the next one asks again
            self._recheck = False
            if not now.run_ids or now.run_ids == self._known.run_ids:
                return
            kept = now.continues(self._known)
            self._known = now
            self._on_change(kept)
        finally:
            self._lock.release()

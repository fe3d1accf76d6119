"""The per-tenant account a :class:`~tiering.core.store.index.CapacityIndex` keeps with a tenant policy.

:class:`TenantOrder` is the index's resident map that also keeps each
tenant's keys in LRU order; :class:`TenantBook` counts each tenant's bytes
and blocks, writes in flight, quota evictions and expirations, and each
block's store time. The policy, the key tags and the config are
:mod:`tiering.core.policies.tenancy`'s.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.policies.tenancy import TenantPolicy, tag_of
from tiering.core.store.index_types import Victim

__all__ = ["TenantBook", "TenantOrder"]


class TenantOrder(collections.OrderedDict[OffloadKey, tuple[int, int]]):
    """The index's resident map (LRU first) that also keeps each tenant's keys in the same order.

    Every way the index changes the map (set, ``pop``, ``popitem``, ``move_to_end``, ``del``) is mirrored
    in :attr:`by_tag`, so a tenant's least recently used blocks are found without walking other tenants'.
    """

    def __init__(self) -> None:
        super().__init__()
        self.by_tag: dict[bytes, collections.OrderedDict[OffloadKey, None]] = collections.defaultdict(
            collections.OrderedDict
        )

    def __setitem__(self, key: OffloadKey, value: tuple[int, int]) -> None:
        super().__setitem__(key, value)
        self.by_tag[tag_of(key)][key] = None

    # Python 3.10's OrderedDict.pop / popitem call an overridden __delitem__ and later versions do not:
    # each mirror removal tolerates the key being gone already.
    def __delitem__(self, key: OffloadKey) -> None:
        super().__delitem__(key)
        self.by_tag[tag_of(key)].pop(key, None)

    def pop(self, key: OffloadKey, *default: Any) -> Any:
        """As ``OrderedDict.pop``."""
        if key not in self:
            return super().pop(key, *default)
        value = super().pop(key)
        self.by_tag[tag_of(key)].pop(key, None)
        return value

    def popitem(self, last: bool = True) -> tuple[OffloadKey, tuple[int, int]]:
        """As ``OrderedDict.popitem``."""
        key, value = super().popitem(last)
        self.by_tag[tag_of(key)].pop(key, None)
        return key, value

    def move_to_end(self, key: OffloadKey, last: bool = True) -> None:
        """As ``OrderedDict.move_to_end``."""
        super().move_to_end(key, last)
        self.by_tag[tag_of(key)].move_to_end(key, last)


class TenantBook:
    """Per-tenant account of one capacity index; every method runs under the index's lock.

    Keeps per tenant tag the resident bytes and blocks, the bytes of writes in flight, the quota
    evictions and expirations; per resident key the wall-clock time (seconds since the epoch) of its store.

    Args:
        policy: the tier's tenant policy.
        order: the index's resident map (it keeps each tenant's LRU order).
        clock: wall-clock time in seconds (tests pass their own).
    """

    def __init__(self, policy: TenantPolicy, order: TenantOrder, clock: Callable[[], float] = time.time) -> None:
        self.policy = policy
        self.order = order
        self.clock = clock
        self._resident: collections.Counter[bytes] = collections.Counter()
        self._blocks: collections.Counter[bytes] = collections.Counter()
        self._writing: collections.Counter[bytes] = collections.Counter()
        self._born: dict[OffloadKey, float] = {}
        self.quota_evictions: collections.Counter[bytes] = collections.Counter()
        self.expirations: collections.Counter[bytes] = collections.Counter()
        self.expired: list[Victim] = []  # victims of expiry found by lookups, for the tier to delete

    def added(self, key: OffloadKey, size: int, born: float | None = None) -> None:
        """``key`` became resident; ``born``: when it was stored (None: now)."""
        tag = tag_of(key)
        self._resident[tag] += size
        self._blocks[tag] += 1
        self._born[key] = self.clock() if born is None else born

    def removed(self, key: OffloadKey, size: int) -> None:
        """``key`` left the resident set."""
        tag = tag_of(key)
        self._resident[tag] -= size
        self._blocks[tag] -= 1
        self._born.pop(key, None)

    def writing(self, key: OffloadKey, size: int) -> None:
        """A write of ``size`` bytes of ``key`` began (``size`` < 0: it ended); the empty key is not a block."""
        if key:
            self._writing[tag_of(key)] += size

    def writing_bytes(self, key: OffloadKey) -> int:
        """Bytes of ``key``'s tenant being written."""
        return self._writing[tag_of(key)]

    def over_quota(self, key: OffloadKey, size: int) -> int:
        """Bytes ``key``'s tenant must free before ``size`` more bytes fit its quota (0: they fit)."""
        tag = tag_of(key)
        quota = self.policy.limits(tag).quota_bytes
        if quota is None or not key:  # (the empty key stands for other processes' temporaries, not a block)
            return 0
        return max(0, self._resident[tag] + self._writing[tag] + size - quota)

    def quota_victims(
        self, key: OffloadKey, need: int, keep: Callable[[OffloadKey], bool] | None = None
    ) -> list[OffloadKey]:
        """The tenant's least recently used resident keys whose bytes add up to ``need`` (or all of them).

        Only the tenant's own keys are walked (:class:`TenantOrder`), oldest first; a key ``keep`` answers
        True for (a pinned block) is passed over.
        """
        tag = tag_of(key)
        out: list[OffloadKey] = []
        for k in self.order.by_tag.get(tag, ()):
            if need <= 0:
                break
            if keep is not None and keep(k):
                continue
            out.append(k)
            need -= self.order[k][0]
        self.quota_evictions[tag] += len(out)
        return out

    def is_expired(self, key: OffloadKey, now: float | None = None) -> bool:
        """Whether resident ``key`` is older than its tenant's TTL."""
        ttl = self.policy.limits(tag_of(key)).ttl_s
        if ttl is None:
            return False
        born = self._born.get(key)
        return born is not None and (self.clock() if now is None else now) - born >= ttl

    def expired_keys(self, keys: Iterable[OffloadKey]) -> Iterator[OffloadKey]:
        """The expired ones of ``keys`` (resident keys)."""
        now = self.clock()
        return (k for k in keys if self.is_expired(k, now))

    def count_expired(self, keys: Sequence[OffloadKey]) -> None:
        """Count ``keys`` as expirations of their tenants."""
        for key in keys:
            self.expirations[tag_of(key)] += 1

    def stats(self) -> dict[str, int]:
        """``quota_evictions``, ``expirations`` (totals) and ``tenant:<name>:<figure>`` per tenant seen.

        Figures per tenant: ``resident_bytes``, ``resident_blocks``, ``reserved_bytes``,
        ``quota_bytes`` (0: none), ``quota_evictions``, ``expirations``.
        """
        out = {"quota_evictions": sum(self.quota_evictions.values()), "expirations": sum(self.expirations.values())}
        tags = set(self._resident) | set(self._writing) | set(self.quota_evictions) | set(self.expirations)
        for tag in sorted(tags):
            name = f"tenant:{self.policy.name(tag)}:"
            out[name + "resident_bytes"] = self._resident[tag]
            out[name + "resident_blocks"] = self._blocks[tag]
            out[name + "reserved_bytes"] = self._writing[tag]
            out[name + "quota_bytes"] = self.policy.limits(tag).quota_bytes or 0
            out[name + "quota_evictions"] = self.quota_evictions[tag]
            out[name + "expirations"] = self.expirations[tag]
        return out

"""Eviction policies of the CPU primary tier: LRU and ARC.

A policy only orders keys; the primary tier owns slots and pins and asks the
policy for a victim among the keys it may evict. ARC follows Megiddo and
Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache" (FAST 2003), as
vLLM's ``kv_offload/cpu/policies/arc.py`` does.
"""

from __future__ import annotations

import abc
from collections import OrderedDict
from collections.abc import Callable

from tiering.core.base import OffloadKey


class CachePolicy(abc.ABC):
    """Orders resident keys for eviction.

    Args:
        capacity: number of slots of the primary tier (blocks).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    @abc.abstractmethod
    def insert(self, key: OffloadKey) -> None:
        """``key`` became resident."""

    @abc.abstractmethod
    def access(self, key: OffloadKey) -> None:
        """``key`` (resident) was used."""

    @abc.abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """``key`` left the tier for another reason than eviction (e.g. a failed write)."""

    @abc.abstractmethod
    def evict(self, can_evict: Callable[[OffloadKey], bool], incoming: OffloadKey | None = None) -> OffloadKey | None:
        """Choose, forget and return a resident key for which ``can_evict`` is True.

        Args:
            can_evict: False for pinned keys.
            incoming: the key the slot is wanted for (ARC adapts on it).

        Returns:
            The victim, or None when every resident key is pinned.
        """


class LRUCachePolicy(CachePolicy):
    """Least recently used first."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[OffloadKey, None] = OrderedDict()

    def insert(self, key: OffloadKey) -> None:
        self._order[key] = None

    def access(self, key: OffloadKey) -> None:
        self._order.move_to_end(key)

    def remove(self, key: OffloadKey) -> None:
        self._order.pop(key, None)

    def evict(self, can_evict: Callable[[OffloadKey], bool], incoming: OffloadKey | None = None) -> OffloadKey | None:
        for key in self._order:
            if can_evict(key):
                del self._order[key]
                return key
        return None


class ARCCachePolicy(CachePolicy):
    """Adaptive Replacement Cache: recency list T1 and frequency list T2, each with ghosts.

    ``p`` is the adaptive target size of T1; hits in the ghost lists B1/B2
    move it towards recency or frequency.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p = 0.0
        self.t1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.t2: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    def insert(self, key: OffloadKey) -> None:
        if key in self.b1:
            self.p = min(float(self.capacity), self.p + max(len(self.b2) / len(self.b1), 1.0))
            del self.b1[key]
            self.t2[key] = None
        elif key in self.b2:
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
            del self.b2[key]
            self.t2[key] = None
        else:
            self.t1[key] = None
        self._trim_ghosts()

    def access(self, key: OffloadKey) -> None:
        if key in self.t1:
            del self.t1[key]
        self.t2[key] = None
        self.t2.move_to_end(key)

    def remove(self, key: OffloadKey) -> None:
        for lst in (self.t1, self.t2, self.b1, self.b2):
            lst.pop(key, None)

    def evict(self, can_evict: Callable[[OffloadKey], bool], incoming: OffloadKey | None = None) -> OffloadKey | None:
        prefer_t1 = bool(self.t1) and (len(self.t1) > self.p or (incoming in self.b2 and len(self.t1) == int(self.p)))
        order = ((self.t1, self.b1), (self.t2, self.b2))
        for resident, ghosts in order if prefer_t1 else order[::-1]:
            for key in resident:
                if can_evict(key):
                    del resident[key]
                    ghosts[key] = None
                    self._trim_ghosts()
                    return key
        return None

    def _trim_ghosts(self) -> None:
        while self.b1 and len(self.b1) + len(self.t1) > self.capacity:
            self.b1.popitem(last=False)
        while self.b2 and len(self.b1) + len(self.b2) + len(self.t1) + len(self.t2) > 2 * self.capacity:
            self.b2.popitem(last=False)

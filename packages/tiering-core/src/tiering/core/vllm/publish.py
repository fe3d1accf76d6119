"""Publish a tiering stack's KV events in vLLM's wire format, through vLLM's own event publisher.

Inside a vLLM engine our tiers' events reach vLLM's publisher through
:meth:`~tiering.core.vllm.tier.TieringSecondaryTier.take_events`. A stack
used without the engine (the standalone API, a cache server) publishes them
with :class:`StackEventPublisher`: the same translation, the same vLLM
event types (``KVEventBatch`` of ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared``), sent by any vLLM ``EventPublisher`` (e.g.
``ZmqEventPublisher``), so a router that consumes vLLM's events consumes ours.

On the wire each event carries vLLM's ``medium`` (``"STORAGE"`` /
``"CPU"``), ``locality`` (``"LOCAL"`` for a local tier, ``"REMOTE"`` for a
remote or fleet one) and ``ownership`` (the tier's name as given here), so a
consumer keeps one index per tier. Stores carry vLLM's placeholder payload
(the block hash and group of the key, no tokens), as vLLM's own tiers do.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from tiering.core.base import OffloadKey
from tiering.core.capabilities import take_events
from tiering.core.events import BlockRemoved, BlockStored, HeldKeys
from tiering.core.vllm.compat import (
    AllBlocksCleared,
    BlockHash,
    EventPublisher,
    KVEventBatch,
    VLLMBlockRemoved,
    VLLMBlockStored,
    get_offload_block_hash,
    get_offload_group_idx,
    maybe_convert_block_hash,
)
from tiering.core.vllm.names import medium_for

_LOCALITY = {"local": "LOCAL", "remote": "REMOTE", "fleet": "REMOTE"}


def block_hash_of(key: OffloadKey) -> Any:
    """The block hash vLLM publishes for ``key`` (vLLM's own conversion: bytes, or int with its int-hash setting)."""
    return maybe_convert_block_hash(BlockHash(get_offload_block_hash(key)))


def to_vllm_events(
    events: Iterable[BlockStored | BlockRemoved], medium: str, ownership: str
) -> list[VLLMBlockStored | VLLMBlockRemoved]:
    """Our events (clears already resolved, see :class:`~tiering.core.events.HeldKeys`) as vLLM's.

    Args:
        events: one tier's events.
        medium: vLLM's medium string (``"STORAGE"``, ``"CPU"``).
        ownership: the tier's name on the wire.
    """
    out: list[VLLMBlockStored | VLLMBlockRemoved] = []
    for event in events:
        locality = _LOCALITY.get(event.locality)
        for key in event.keys:  # one per key: each key carries its own group
            common: dict[str, Any] = {
                "block_hashes": [block_hash_of(key)],
                "medium": medium,
                "group_idx": get_offload_group_idx(key),
                "locality": locality,
                "ownership": ownership,
            }
            if isinstance(event, BlockRemoved):
                out.append(VLLMBlockRemoved(**common))
            else:
                out.append(
                    VLLMBlockStored(
                        parent_block_hash=None, token_ids=[], block_size=0, lora_id=None, lora_name=None, **common
                    )
                )
    return out


class StackEventPublisher:
    """Publish the KV events of a stack's tiers through a vLLM ``EventPublisher``.

    The first batch is ``AllBlocksCleared``: a stack that starts holds
    nothing a consumer may remember from an earlier run of it; each tier then
    announces what it holds (its log begins with a clear and its blocks).
    Call :meth:`publish_pending` periodically (e.g. once per scheduler step);
    not thread safe (one caller).

    Args:
        tiers: the tier's name on the wire (``ownership``) -> a tiering tier, or the stack's
            :class:`~tiering.core.primary.tier.CPUPrimaryTier` (anything with ``take_events()``
            and a ``medium`` class attribute).
        publisher: a vLLM ``EventPublisher`` (``ZmqEventPublisher``...); not shut down here.
    """

    def __init__(self, tiers: Mapping[str, Any], publisher: EventPublisher) -> None:
        self.tiers = dict(tiers)
        self.publisher = publisher
        self._held = {name: HeldKeys() for name in self.tiers}
        self._media = {name: medium_for(type(tier)).name for name, tier in self.tiers.items()}
        publisher.publish(KVEventBatch(ts=time.time(), events=[AllBlocksCleared()]))

    def publish_pending(self) -> int:
        """Take every tier's events and publish them as one batch (none when empty); returns the events sent."""
        events: list[Any] = []
        for name, tier in self.tiers.items():
            resolved = self._held[name].resolve(take_events(tier))
            events.extend(to_vllm_events(resolved, self._media[name], name))
        if events:
            self.publisher.publish(KVEventBatch(ts=time.time(), events=events))
        return len(events)

"""Pinning prefixes across a tier stack: by keys, by token ids, and per request.

A pin keeps blocks in a secondary tier until it expires (see
:mod:`tiering.core.policies.pin_records` for what a tier keeps and
:meth:`tiering.core.capabilities.PinnableTier.pin` for the contract). This
module is what callers use:

- :func:`pin_in_tiers`: pin keys in every tier of a stack that can pin
  (``TieringManager.pin`` and ``tiering pin``);
- :func:`prefix_keys`: the keys of a prompt's full blocks from its token ids;
- :data:`PIN_PARAM`: the per-request entry of vLLM's ``kv_transfer_params``
  (also ``ReqContext.extra``) that pins the blocks a request stores, for a
  number of seconds or a duration (``"1h"``); :class:`RequestPins` queues
  those pins on one background thread, so the scheduler's thread never waits
  for a medium.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from typing import Any

from tiering.core.base import OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.capabilities import PinnableTier
from tiering.core.units import parse_duration

logger = logging.getLogger(__name__)

__all__ = ["PIN_PARAM", "RequestPins", "pin_in_tiers", "prefix_keys", "request_pin_ttl"]

PIN_PARAM = "tiering_pin_ttl"
"""``kv_transfer_params`` / ``ReqContext.extra`` key: pin the blocks the request stores for this long
(seconds as a number, or a duration string such as ``"30m"``)."""


def prefix_keys(token_ids: Sequence[int], block_size: int) -> list[OffloadKey]:
    """The keys of the full blocks of ``token_ids`` (:func:`tiering.core.keys.block_keys`), to pin a prompt.

    Raises:
        ValueError: ``block_size`` is not positive, or the prompt has no full block.
    """
    from tiering.core.keys import block_keys  # pins by token ids: the command and the API, not the engine path

    keys = block_keys(token_ids, block_size)
    if not keys:
        raise ValueError(f"{len(token_ids)} token ids make no full block of {block_size} tokens: nothing to pin")
    return keys


def pin_in_tiers(tiers: Sequence[SecondaryTierManager], keys: Sequence[OffloadKey], ttl_s: float) -> list[bool]:
    """Pin ``keys`` for ``ttl_s`` seconds in each tier (blocks on each medium in turn).

    Returns:
        Per tier, in order, whether it pinned every key (False: the tier cannot pin, refused, or raised;
        logged).

    Raises:
        ValueError: ``ttl_s`` is not positive.
    """
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0 seconds, got {ttl_s}")
    out = []
    for index, tier in enumerate(tiers):
        try:
            out.append(isinstance(tier, PinnableTier) and bool(tier.pin(keys, ttl_s)))
        except Exception:
            logger.exception("secondary tier %d (%s): pin raised", index, tier.tier_type)
            out.append(False)
    return out


def request_pin_ttl(req_context: ReqContext) -> float | None:
    """The pin lifetime a request asks for (:data:`PIN_PARAM`), in seconds; None when it asks none.

    A value that is not a positive number or duration is ignored with a warning (a request is never
    failed for it).
    """
    value: Any = req_context.extra.get(PIN_PARAM) if req_context.extra else None
    if value is None:
        return None
    try:
        ttl = parse_duration(value) if isinstance(value, str) else float(value)
        if isinstance(value, bool) or not ttl > 0:
            raise ValueError("must be > 0")
    except (TypeError, ValueError) as exc:
        logger.warning("request %s: %s=%r ignored: %s", req_context.req_id, PIN_PARAM, value, exc)
        return None
    return ttl


class RequestPins:
    """Pins asked by requests (:data:`PIN_PARAM`), taken on one background thread (started at first use).

    :meth:`submit` returns at once; a pin that fails or is refused is logged and counted by the tier
    (``pins_refused``); the thread survives every error. :meth:`close` takes the pins already queued,
    then stops the thread.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Sequence[SecondaryTierManager], list[OffloadKey], float] | None]
        self._queue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, tiers: Sequence[SecondaryTierManager], keys: Sequence[OffloadKey], req: ReqContext) -> None:
        """Queue a pin of ``keys`` in ``tiers`` when ``req`` asks for one; else nothing. Cheap."""
        ttl = request_pin_ttl(req) if req.extra else None
        if ttl is None or not keys or not tiers:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tiering-request-pins", daemon=True)
                self._thread.start()
        self._queue.put((tiers, list(keys), ttl))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            tiers, keys, ttl = item
            try:
                pin_in_tiers(tiers, keys, ttl)
            except Exception:  # pin_in_tiers logs per tier; this guards the thread itself
                logger.exception("request pins: pinning %d blocks failed", len(keys))

    def close(self, timeout_s: float = 10.0) -> None:
        """Take the queued pins, then stop the thread (waits up to ``timeout_s`` seconds)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout_s)

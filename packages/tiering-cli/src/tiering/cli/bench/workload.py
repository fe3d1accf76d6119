"""Workloads for replays: Mooncake JSONL traces and a synthetic multi-turn chat.

A workload is a sequence of :class:`Request`: the ordered block keys of one
prompt. Keys of equal prefixes are equal, so a replay sees real prefix reuse.

Two real traces ship inside tiering-core (``tiering/cli/bench/data``, with
their Apache-2.0 licence and attribution): :data:`SHIPPED_TRACES`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import sys
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:
    from importlib.abc import Traversable

from tiering.core.base import OffloadKey
from tiering.core.keys import block_keys, trace_block_key

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry in the Mooncake traces."""

SHIPPED_TRACES = {
    "mooncake-conversation": "mooncake_conversation_trace.jsonl",
    "mooncake-synthetic": "mooncake_synthetic_trace.jsonl",
}
"""Names of the traces shipped in the wheel -> their file in ``tiering/cli/bench/data``.
Source: kvcache-ai/Mooncake, ``FAST25-release/traces/`` (Apache-2.0)."""

DEFAULT_TRACE = "mooncake-conversation"


def resolve_trace(name_or_path: str | os.PathLike[str]) -> Traversable:
    """The file of a shipped trace name (:data:`SHIPPED_TRACES`) or of a path.

    Raises:
        ValueError: neither a shipped name nor an existing file; the message
            lists the shipped names.
    """
    text = os.fspath(name_or_path)
    if text in SHIPPED_TRACES:
        return files("tiering.cli.bench").joinpath("data", SHIPPED_TRACES[text])
    path = Path(text)
    if not path.is_file():
        names = ", ".join(SHIPPED_TRACES)
        raise ValueError(f"--trace {text!r} is neither a shipped trace ({names}) nor a file")
    return path


@dataclasses.dataclass(frozen=True)
class Request:
    """One prompt of a workload.

    Attributes:
        req_id: unique id within the workload.
        keys: the prompt's block keys, in order.
        timestamp_ms: arrival time in milliseconds since the workload start.
        tokens: the prompt's length in tokens (a trace's ``input_length``); None: every block full.
        block_tokens: tokens per block.
        tenant: who sent it (``""``: the default tenant; :func:`assign_tenants`).
    """

    req_id: str
    keys: tuple[OffloadKey, ...]
    timestamp_ms: float = 0.0
    tokens: int | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    tenant: str = ""

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the prompt: :attr:`tokens` when it fits the blocks (the last may be partial), else all full."""
        full = len(self.keys) * self.block_tokens
        if self.tokens is not None and full - self.block_tokens < self.tokens <= full:
            return self.tokens
        return full

    def tokens_of(self, blocks: int) -> int:
        """Tokens of the first ``blocks`` blocks of the prompt."""
        return min(blocks * self.block_tokens, self.prompt_tokens)


def tenant_rule(tenants: int) -> str:
    """How :func:`assign_tenants` gives ``tenants`` tenants their requests, in words (the report's header)."""
    return (
        f"tenants: {tenants}, request i of the trace belongs to tenant t<i mod {tenants}> (the trace names none); "
        "tenants never share a block, not even of identical prompts"
    )


def assign_tenants(requests: list[Request], tenants: int) -> list[Request]:
    """Give the requests to ``tenants`` tenants by a stated rule: request ``i`` to tenant ``f"t{i % tenants}"``.

    A Mooncake trace names no tenant. Round robin over the request index keeps
    every tenant's traffic the trace's mix (the same shared prefixes reach
    every tenant), so the cost of isolation shows: a prefix another tenant
    stored is a miss. One tenant (the default) keeps every request's tenant
    ``""``: the keys the trace names, unchanged.

    Raises:
        ValueError: ``tenants`` is below 1.
    """
    if tenants < 1:
        raise ValueError(f"tenants must be at least 1, got {tenants}")
    if tenants == 1:
        return requests
    return [dataclasses.replace(req, tenant=f"t{i % tenants}") for i, req in enumerate(requests)]


TRACE_FORMAT = (
    "Trace files (--trace FILE.jsonl) use Mooncake's format: one JSON object per line, one request each, "
    'e.g. {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}. Required: '
    '"hash_ids", a list of integers, one per 512-token block of the prompt, in order; an id names a block '
    "with everything before it (Mooncake's ids are prefix hashes), so an id seen before is a cache hit. "
    'Optional: "timestamp" (ms since the trace start, kept in the report\'s series; requests are replayed '
    'in file order, not paced); "input_length" (the prompt\'s tokens, which may end in a partial block) '
    'gives the token counts of the report (default: 512 per id); "output_length" is ignored. Other keys '
    "are ignored."
)
"""What a trace file holds (``tiering bench --help`` and the docs say the same)."""


def load_mooncake_trace(path: str | Path | Traversable, limit: int | None = None) -> Iterator[Request]:
    """Read a Mooncake-format JSONL trace (``timestamp``, ``input_length``, ``output_length``, ``hash_ids``).

    See :data:`TRACE_FORMAT`: ``hash_ids`` (a list of integers) is required,
    ``timestamp`` (milliseconds) optional, every other key ignored.

    Args:
        path: the ``.jsonl`` file (a path, or a shipped trace from :func:`resolve_trace`).
        limit: stop after this many requests (None: all).

    Raises:
        OSError: the file cannot be read.
        ValueError: a line is not a JSON object, lacks ``hash_ids``, or its
            ``hash_ids`` is not a list of integers; the message names the
            file and line number and what a record looks like.
    """
    source = Path(path) if isinstance(path, (str, os.PathLike)) else path
    with source.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and lineno > limit:
                return
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise TypeError(f"a line must hold a JSON object, got {type(record).__name__}")
                if "hash_ids" not in record:
                    raise ValueError("no 'hash_ids'")
                hash_ids = record["hash_ids"]
                if not isinstance(hash_ids, list) or not all(
                    isinstance(h, int) and not isinstance(h, bool) for h in hash_ids
                ):
                    raise TypeError(f"'hash_ids' must be a list of integers, got {hash_ids!r:.60}")
                timestamp = float(record.get("timestamp", 0))
                tokens = record.get("input_length")
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{path}:{lineno}: not a Mooncake trace record ({exc}); a record looks like "
                    '{"timestamp": 0, "hash_ids": [0, 1, 2]} (see tiering bench --help)'
                ) from exc
            keys = tuple(trace_block_key(h) for h in hash_ids)
            yield Request(f"trace-{lineno}", keys, timestamp, tokens if isinstance(tokens, int) else None)


def synthetic_chat(
    num_requests: int,
    block_size: int,
    *,
    conversations: int = 64,
    system_prompt_tokens: int = 1024,
    turn_tokens: tuple[int, int] = (64, 512),
    seed: int = 0,
) -> Iterator[Request]:
    """A multi-turn chat workload: each turn's prompt extends the conversation so far.

    ``conversations`` chats share a system prompt; each request picks a chat
    at random and appends a user message and the previous reply, so
    requests reuse their chat's earlier blocks and the shared prefix.

    Args:
        num_requests: requests to generate.
        block_size: tokens per block.
        conversations: concurrent chats.
        system_prompt_tokens: length of the shared prefix (tokens).
        turn_tokens: (min, max) tokens added per turn.
        seed: RNG seed; the same arguments always give the same workload.
    """
    rng = random.Random(seed)
    system = [rng.randrange(32000) for _ in range(system_prompt_tokens)]
    chats: list[list[int]] = [list(system) for _ in range(conversations)]
    max_tokens = 64 * 1024
    for i in range(num_requests):
        c = rng.randrange(conversations)
        chats[c].extend(rng.randrange(32000) for _ in range(rng.randint(*turn_tokens)))
        if len(chats[c]) > max_tokens:
            chats[c] = list(system)
        yield Request(f"chat-{i}", tuple(block_keys(chats[c], block_size)), float(i), block_tokens=block_size)

"""A shipped Mooncake trace, scaled down for a small CPU server and replayed by vLLM's ``timed_trace`` dataset.

vLLM's serving client (0.32) replays a JSONL trace with timestamps itself
(``--dataset-name timed_trace``, self-timed): each request is sent at its
``timestamp`` x ``--timed-trace-sec-multiplier`` seconds, its prompt built
from its ``hash_ids``, ``--timed-trace-chunk-hash-size`` tokens per id, the
same id giving the same tokens within one client run (so shared ids are
shared token blocks). :func:`scale_trace` writes the trace such a client
reads: the first requests of the trace in their order and relative timing,
one trace block (:data:`MOONCAKE_BLOCK_TOKENS`) as one engine block, inputs and outputs capped,
and returns what the header prints and the client flags that replay it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tiering.cli.bench.workload import MOONCAKE_BLOCK_TOKENS, resolve_trace


def scale_trace(
    source: str,
    dest: str,
    *,
    num_requests: int,
    block_tokens: int,
    max_blocks: int,
    output_len: int,
    request_rate: float,
) -> tuple[list[str], dict[str, Any]]:
    """Write the first ``num_requests`` requests of trace ``source`` (a shipped name or a file) scaled down to ``dest``.

    Each request keeps its first ``max_blocks`` hash ids (a prefix of the
    chain: shared prefixes stay shared), each id standing for ``block_tokens``
    tokens instead of :data:`MOONCAKE_BLOCK_TOKENS`; its input length is scaled by the same factor and
    capped at ``max_blocks * block_tokens``; its output length is capped at
    ``output_len``; timestamps (milliseconds) are rebased to the first
    request's and stretched so the mean rate is ``request_rate`` requests per second.

    Returns:
        ``(client_flags, sizes)``: vLLM's client flags replaying ``dest``
        (``--num-prompts`` included), and the sizes for the header:
        ``requests``, ``span_s`` (trace seconds), ``stretch``, ``block_refs``,
        ``unique_blocks``, ``mean_input`` / ``max_input`` tokens, ``output`` tokens.

    Raises:
        ValueError: ``source`` is neither a shipped trace nor a file, has fewer than two requests, or
            ``num_requests`` < 2.
    """
    if num_requests < 2:
        raise ValueError(f"num_requests must be >= 2 for a timed replay, got {num_requests}")
    rows = []
    with resolve_trace(source).open() as f:
        for line in f:
            if len(rows) == num_requests:
                break
            rows.append(json.loads(line))
    if len(rows) < 2:
        raise ValueError(f"{source}: {len(rows)} request(s), a timed replay needs >= 2")
    t0 = rows[0]["timestamp"]
    span_s = (rows[-1]["timestamp"] - t0) / 1e3
    # seconds per trace millisecond: len(rows) requests spread over len(rows) / rate seconds
    multiplier = len(rows) / request_rate / span_s / 1e3 if span_s > 0 else 1e-3
    factor = block_tokens / MOONCAKE_BLOCK_TOKENS
    refs: list[int] = []
    inputs = []
    with open(dest, "w") as out:
        for row in rows:
            hashes = row["hash_ids"][:max_blocks]
            tokens = max(1, min(math.ceil(row["input_length"] * factor), len(hashes) * block_tokens))
            refs += hashes[: math.ceil(tokens / block_tokens)]
            inputs.append(tokens)
            scaled = {
                "timestamp": row["timestamp"] - t0,
                "input_length": tokens,
                "output_length": min(row["output_length"], output_len),
                "hash_ids": hashes,
            }
            out.write(json.dumps(scaled) + "\n")
    flags = [
        "--dataset-name", "timed_trace", "--dataset-path", dest,
        "--timed-trace-chunk-hash-size", str(block_tokens),
        "--timed-trace-sec-multiplier", f"{multiplier:.6g}",
        "--num-prompts", str(len(rows)),
    ]  # fmt: skip
    sizes = {
        "requests": len(rows),
        "span_s": span_s,
        "stretch": multiplier * 1e3,
        "block_refs": len(refs),
        "unique_blocks": len(set(refs)),
        "mean_input": sum(inputs) / len(inputs),
        "max_input": max(inputs),
        "output": output_len,
    }
    return flags, sizes

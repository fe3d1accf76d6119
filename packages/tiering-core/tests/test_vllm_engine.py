"""tiering inside a real vLLM engine on CPU (vllm-cpu): generate, offload, restart, load, corrupt, recompute.

Needs the env of tests/vllm-cpu-requirements.txt (vLLM's CPU build); skipped
elsewhere. Every engine runs in a fresh process (spawned, see
:mod:`tiering.testing.vllm_engine`) over a tiny random Llama built here;
nothing is downloaded.

Per persistent tier (fs; s3 against a moto server): engine A generates
greedily and its blocks reach the tier; a fresh engine B with the same
prompt gets its prefix from our tier (``num_cached_tokens`` > 0 and our
tier's hit counter) and generates A's tokens, which equal a no-offloading
reference; with every stored block corrupted, B recomputes and still
generates the reference tokens. The in-memory example tier is tested within
one engine whose small GPU cache and primary tier other prompts evict.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from typing import Any

import pytest


def _is_vllm_cpu() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


pytestmark = pytest.mark.skipif(
    not _is_vllm_cpu(), reason="needs vLLM's CPU build (env of packages/tiering-core/tests/vllm-cpu-requirements.txt)"
)

HAS_FS = importlib.util.find_spec("tiering.fs") is not None

PROMPT_TOKENS = 330  # 10 full blocks of 32 tokens + 10
FULL_BLOCKS = PROMPT_TOKENS // 32
MAX_TOKENS = 12


def spec_config(*tiers: dict[str, Any], cpu_bytes: int = 16 << 20) -> dict[str, Any]:
    """The documented ``kv_connector_extra_config`` for vLLM's CPU backend."""
    from tiering.core.vllm.spec import SPEC_MODULE_PATH, SPEC_NAME

    return {
        "spec_name": SPEC_NAME,
        "spec_module_path": SPEC_MODULE_PATH,
        "cpu_bytes_to_use": cpu_bytes,
        "secondary_tiers": list(tiers),
    }


def transfer(*tiers: dict[str, Any], cpu_bytes: int = 16 << 20) -> dict[str, Any]:
    from tiering.testing.vllm_engine import offloading_transfer_config

    return offloading_transfer_config(spec_config(*tiers, cpu_bytes=cpu_bytes))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tiering.testing.vllm_engine import build_tiny_llama

    return build_tiny_llama(str(tmp_path_factory.mktemp("tiny-llama")), seed=0)


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    from tiering.testing.vllm_engine import prompt_ids

    return prompt_ids(PROMPT_TOKENS, seed=1)


@pytest.fixture(scope="module")
def reference(model: str, prompt: list[int]) -> list[int]:
    """Greedy tokens of the prompt without any KV offloading."""
    from tiering.testing.vllm_engine import run_engine

    result = run_engine({"model": model, "prompts": [prompt], "max_tokens": MAX_TOKENS})
    out = result["outputs"][0]
    assert out["num_cached_tokens"] == 0 and len(out["tokens"]) == MAX_TOKENS
    return list(out["tokens"])


def _tier_hits(metrics: dict[str, float], tier_type: str) -> float:
    """Our tier's chunk hits as vLLM's metrics report them (``vllm:kv_offload_tiering_chunk_hits``)."""
    return sum(v for k, v in metrics.items() if "tiering_chunk_hits" in k and tier_type in k)


def _fs_blocks(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".kvb"))


def _flip_middle_byte(data: bytes) -> bytes:
    mid = len(data) // 3
    return data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1 :]


def _corrupt_fs(root: str) -> int:
    paths = _fs_blocks(root)
    for path in paths:
        with open(path, "r+b") as f:
            data = f.read()
            f.seek(0)
            f.write(_flip_middle_byte(data))
    return len(paths)


def _s3_keys(s3: dict[str, Any], prefix: str) -> list[str]:
    pages = s3["client"].get_paginator("list_objects_v2").paginate(Bucket=s3["bucket"], Prefix=prefix)
    return [obj["Key"] for page in pages for obj in page.get("Contents", []) if obj["Size"] > 4096]


def _corrupt_s3(s3: dict[str, Any], prefix: str) -> int:
    keys = _s3_keys(s3, prefix)
    for key in keys:
        body = s3["client"].get_object(Bucket=s3["bucket"], Key=key)["Body"].read()
        s3["client"].put_object(Bucket=s3["bucket"], Key=key, Body=_flip_middle_byte(body))
    return len(keys)


def _check_restart_and_corruption(
    model: str, prompt: list[int], reference: list[int], tier: dict[str, Any], corrupt: Any, wait: dict[str, Any]
) -> None:
    from tiering.testing.vllm_engine import run_engine

    # Engine A: computes the prompt, its blocks go GPU(CPU) cache -> primary -> our tier.
    a = run_engine(
        {
            "model": model,
            "prompts": [prompt],
            "max_tokens": MAX_TOKENS,
            "kv_transfer_config": transfer(tier),
            "wait_for": wait,
        }
    )
    assert a["outputs"][0]["tokens"] == reference
    assert a["outputs"][0]["num_cached_tokens"] == 0
    # Engine B, a fresh process: the prefix comes from our tier.
    b = run_engine(
        {"model": model, "prompts": [prompt], "max_tokens": MAX_TOKENS, "kv_transfer_config": transfer(tier)}
    )
    out = b["outputs"][0]
    assert out["num_cached_tokens"] == FULL_BLOCKS * 32, b["log"][-3000:]
    assert out["tokens"] == reference
    assert _tier_hits(b["metrics"], tier["type"]) >= FULL_BLOCKS, b["metrics"]
    # Every stored block corrupted: our tier refuses them, B recomputes the right tokens.
    assert corrupt() >= FULL_BLOCKS
    c = run_engine(
        {"model": model, "prompts": [prompt], "max_tokens": MAX_TOKENS, "kv_transfer_config": transfer(tier)}
    )
    out = c["outputs"][0]
    assert out["tokens"] == reference
    assert out["num_cached_tokens"] == 0, c["log"][-3000:]


@pytest.mark.skipif(not HAS_FS, reason="tiering-fs is not installed")
def test_fs_tier_serves_a_fresh_engine_and_refuses_corrupted_blocks(
    model: str, prompt: list[int], reference: list[int], tmp_path: Any
) -> None:
    root = str(tmp_path / "kv")
    tier = {"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", "root": root, "model_revision": "t"}
    wait = {"tier": "fs", "config": {"root": root}, "count": FULL_BLOCKS}
    _check_restart_and_corruption(model, prompt, reference, tier, lambda: _corrupt_fs(root), wait)


def test_s3_tier_serves_a_fresh_engine_and_refuses_corrupted_blocks(
    model: str, prompt: list[int], reference: list[int], s3_server: dict[str, Any]
) -> None:
    prefix = f"engine-{uuid.uuid4().hex[:8]}"
    conn = {
        k: s3_server[k] for k in ("bucket", "endpoint_url", "region_name", "aws_access_key_id", "aws_secret_access_key")
    }
    tier = {
        "type": "tiering_s3",
        "module_path": "tiering.core.vllm.tiers",
        "prefix": prefix,
        "model_revision": "t",
        **conn,
    }
    wait = {"tier": "s3", "config": {**conn, "prefix": prefix}, "count": FULL_BLOCKS}
    _check_restart_and_corruption(model, prompt, reference, tier, lambda: _corrupt_s3(s3_server, prefix), wait)


def test_example_tier_serves_a_prompt_after_evictions_within_one_engine(
    model: str, prompt: list[int], reference: list[int]
) -> None:
    """A tiny engine cache and primary tier: three other prompts evict the first; its rerun loads from our tier."""
    from tiering.testing.vllm_engine import prompt_ids, run_engine

    tier = {"type": "tiering_example", "module_path": "tiering.core.vllm.tiers"}
    others = [prompt_ids(PROMPT_TOKENS, seed=s) for s in (2, 3, 4)]
    # 24 engine blocks (one prompt needs 11 + decode) and a primary tier of 16 rows of 32 KiB.
    result = run_engine(
        {
            "model": model,
            "prompts": [prompt, *others, prompt],
            "max_tokens": MAX_TOKENS,
            "kv_transfer_config": transfer(tier, cpu_bytes=16 * 32 * 1024),
            "engine_kwargs": {"num_gpu_blocks_override": 24},
            "max_model_len": 512,  # 24 blocks of 32 tokens hold at most 768
        }
    )
    first, *_, last = result["outputs"]
    assert first["tokens"] == reference and first["num_cached_tokens"] == 0
    assert last["tokens"] == reference
    assert last["num_cached_tokens"] == FULL_BLOCKS * 32, result["log"][-3000:]
    assert _tier_hits(result["metrics"], "tiering_example") >= FULL_BLOCKS, result["metrics"]

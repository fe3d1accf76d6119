"""Count what a deployment of tiering-core loads and crosses: the figures of the minimal-core targets.

Usage (from the repository root)::

    python scripts/count_core.py            # every figure this environment can measure
    python scripts/count_core.py --json     # the same as one JSON object

Run it in the ``vllm`` hatch environment (vLLM 0.33, scheduler side on CPU)
for the engine figures; without vLLM those are printed as not measured. To
count another revision, put its sources first on the path (``PYTHONPATH``,
one ``packages/*/src`` entry per package); the script finds the modules of
either layout.

What is counted (``docs/content/architecture.md``, "Counting the core"):

- ``engine``: the ``tiering.core`` modules in ``sys.modules`` of a process
  that built vLLM's own ``TieringOffloadingSpec`` with a ``tiering_fs`` tier
  (``module_path`` ``tiering.core.vllm.tiers``, the form vllm.md leads
  with), stored one request of 4 blocks, waited for the cascade to the fs
  tier, evicted the primary tier and loaded the request back from the fs
  tier; and the lines of those modules' files (``wc -l``). tiering-fs is
  counted apart.
- ``store_crossing``: the ``tiering.*`` modules (core and fs) whose
  functions ran, in any thread, from vLLM's ``complete_store`` of that
  request until the fs tier reported its job: a profile hook on every
  thread records each call's module.
- ``example``: the ``tiering.core`` modules in ``sys.modules`` of a fresh
  interpreter that built the example tier through the factory and did one
  store and one load (the primary view is a plain ``memoryview``, as an
  engine hands over its own buffer).
- ``wheel``: the lines of Python in tiering-core's sources (what its wheel
  ships), and the longest module.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

EXAMPLE_PROGRAM = """
import sys, time
from tiering.core.factory import create_secondary_tier
from tiering.core.spec import OffloadingSpec
from tiering.core.base import JobMetadata, ReqContext
spec = OffloadingSpec({"cpu_bytes_to_use": 4 * 4096, "block_bytes": 4096})
view = memoryview(bytearray(4 * 4096)).cast("B", (4, 4096))
tier = create_secondary_tier({"type": "example"}, view, spec)
ctx = ReqContext("r")
for job_id, block_id, load in ((1, 0, False), (2, 1, True)):
    tier.submit_store(JobMetadata(job_id, [b"k" * 16], [block_id], load, ctx)) if not load else \\
        tier.submit_load(JobMetadata(job_id, [b"k" * 16], [block_id], load, ctx))
    deadline = time.monotonic() + 30
    while not list(tier.get_finished()):
        assert time.monotonic() < deadline, "the example tier never reported its job"
        time.sleep(0.001)
print("\\n".join(sorted(m for m in sys.modules if m.startswith("tiering.core"))))
"""


def module_lines(names: list[str]) -> int:
    """The physical lines of the source files of the modules ``names`` (already imported)."""
    total = 0
    for name in names:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path and path.endswith(".py"):
            total += len(Path(path).read_text().splitlines())
    return total


def vllm_driver() -> Any:
    """The vLLM scheduler driver of either layout (``tiering.testing.vllm_driver`` or its old import path)."""
    for name in ("tiering.testing.vllm_driver", "tiering.core.vllm.testing"):
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == "vllm":
                raise
    raise ModuleNotFoundError("no vLLM scheduler driver in tiering.core")


def engine_figures() -> dict[str, Any]:
    """Build vLLM's spec with a tiering_fs tier, store one request, reload it from fs; see the module docstring."""
    crossed: set[str] = set()
    recording = threading.Event()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and recording.is_set():
            name = frame.f_globals.get("__name__", "")
            if name.startswith("tiering.") and not name.startswith("tiering.testing"):  # the driver stands for vLLM
                crossed.add(name)

    threading.setprofile(profile)  # the tier's I/O threads start after this
    sys.setprofile(profile)
    testing = vllm_driver()
    row = 16384
    with tempfile.TemporaryDirectory() as root:
        extra = {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 16 * row,
            "secondary_tiers": [{"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", "root": root}],
        }
        with testing.vllm_manager(extra, worker_kv_bytes_per_block=row) as (_, _manager, driver):
            keys = [testing.make_key(i, seed=b"count") for i in range(4)]
            recording.set()
            contexts = driver.store([keys], lambda k: testing.payload(k, driver.row_bytes))
            driver.wait_idle(60.0)
            recording.clear()
            driver.finish(contexts)
            driver.evict_all()
            ctx = driver.new_context("load")
            outcome = driver.lookup([keys], [ctx])
            if outcome.hits != [len(keys)]:
                raise RuntimeError(f"the fs tier served {outcome.hits} of {len(keys)} blocks")
            driver.read(keys, ctx)
            driver.finish([ctx])
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    core = sorted(m for m in sys.modules if m.startswith("tiering.core"))
    fs = sorted(m for m in sys.modules if m.startswith("tiering.fs"))
    return {
        "core_modules": len(core),
        "core_lines": module_lines(core),
        "fs_modules": len(fs),
        "fs_lines": module_lines(fs),
        "store_crossing": len(crossed),
        "crossed": sorted(crossed),
        "loaded": core,
    }


def example_figures() -> dict[str, Any]:
    """The core modules a fresh interpreter loads for the example tier's store and load."""
    out = subprocess.run([sys.executable, "-c", EXAMPLE_PROGRAM], capture_output=True, text=True, check=True)
    modules = out.stdout.split()
    return {"core_modules": len(modules), "loaded": modules}


def wheel_figures() -> dict[str, Any]:
    """Lines of Python under tiering-core's sources of the imported ``tiering.core`` (what its wheel ships)."""
    import tiering.core

    src = Path(tiering.core.__file__).parent
    sizes = {str(p.relative_to(src)): len(p.read_text().splitlines()) for p in sorted(src.rglob("*.py"))}
    longest = max(sizes, key=lambda k: sizes[k])
    return {"files": len(sizes), "lines": sum(sizes.values()), "longest": longest, "longest_lines": sizes[longest]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {"wheel": wheel_figures(), "example": example_figures()}
    try:
        t0 = time.monotonic()
        figures["engine"] = engine_figures()
        figures["engine"]["seconds"] = round(time.monotonic() - t0, 2)
    except ImportError as exc:  # vLLM absent or out of range
        figures["engine"] = {"not_measured": f"{exc} (run it in the vllm environment)"}
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    wheel, example, engine = figures["wheel"], figures["example"], figures["engine"]
    print(
        f"tiering-core sources: {wheel['lines']:,} lines in {wheel['files']} files (target <= 14,000); "
        f"longest {wheel['longest']} ({wheel['longest_lines']} lines, target <= 400)"
    )
    print(f"example tier, one store and one load: {example['core_modules']} core modules loaded (target <= 15)")
    if "not_measured" in engine:
        print(f"vLLM + fs engine: not measured: {engine['not_measured']}")
    else:
        print(
            f"vLLM + fs engine, start + one store + one load: {engine['core_lines']:,} lines of tiering-core in "
            f"{engine['core_modules']} modules (target <= 8,000; tiering-fs apart: {engine['fs_lines']:,} lines "
            f"in {engine['fs_modules']} modules)"
        )
        print(
            f"a vLLM store to an fs file crosses {engine['store_crossing']} modules (target <= 18): "
            + ", ".join(engine["crossed"])
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Compare the admission policies of the persistent tier on a trace: bytes written per hit and hit ratio.

Replays the same requests through the default ``tiering bench`` stack (a CPU
primary tier of 1,024 blocks plus the first installed local persistent tier,
tiering-fs) once per cap and policy, each on a fresh stack in a temporary
directory, and prints one row per run, the policies of one cap together:

    python scripts/bench_admission.py --requests 4000 --caps 64MiB,256MiB,1GiB \\
        --admission always,second_sighting [--json rows.json]

``written/hit`` is bytes written into the persistent tier per block served
from any tier; ``vs first policy`` gives the hit ratio and written/hit of a
row relative to the first policy at the same cap.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tiering.cli.bench.admission import admission_sweep, format_rows
from tiering.cli.bench.stack import DEFAULT_BENCH_BLOCK_BYTES
from tiering.cli.bench.workload import DEFAULT_TRACE, load_mooncake_trace, resolve_trace
from tiering.core.units import parse_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--trace", default=DEFAULT_TRACE, help=f"a shipped trace or a Mooncake JSONL file ({DEFAULT_TRACE})"
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests to replay (default 2000)")
    parser.add_argument("--caps", default="64MiB,256MiB,1GiB", help="persistent tier caps, comma-separated")
    parser.add_argument("--admission", default="always,second_sighting", help="policies, comma-separated")
    parser.add_argument("--block-bytes", default=str(DEFAULT_BENCH_BLOCK_BYTES), help="bytes per block (16KiB)")
    parser.add_argument("--cpu-bytes", help="bytes of the primary tier (default: 1,024 blocks)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    caps = [parse_size(c.strip()) for c in args.caps.split(",")]
    policies = [p.strip() for p in args.admission.split(",")]
    requests = list(load_mooncake_trace(resolve_trace(args.trace), args.requests))
    cpu_bytes = parse_size(args.cpu_bytes) if args.cpu_bytes else None

    def progress(row: dict[str, object]) -> None:
        print(f"done: cap {row['cap_bytes']} admission {row['policy']}", file=sys.stderr, flush=True)

    rows = admission_sweep(requests, caps, policies, parse_size(args.block_bytes), cpu_bytes, progress)
    print(f"trace {args.trace}, {len(requests)} requests, block {args.block_bytes}")
    print(format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# GPU check of the transfer path (tiering.core.transfer), one prepared run, < 5 minutes;
# with SGLANG_MODEL set and SGLang installed, also SGLang HiCache end to end over tiering (scripts/sglang_e2e.py).
#
# On a CUDA machine: installs nothing; runs the transfer tests on the GPU (they
# add a "cuda" device case when torch.cuda.is_available()), then prints pinned
# D2H (store) / H2D (load) GB/s of the transfer path next to a raw torch
# pinned copy of the same bytes, as a ratio (target >= 0.8x; exit 1 below it).
# Without CUDA (or without torch) it prints why and exits 0.
#
# Usage: scripts/gpu_check.sh            (PYTHON=... to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
MIN_RATIO="${MIN_RATIO:-0.8}"

if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: SKIP: no CUDA device visible to torch (or torch missing) under $PY"
    exit 0
fi
"$PY" -c 'import torch; print("gpu_check:", torch.__version__, torch.cuda.get_device_name(0))'

# tiering packages from the source tree when they are not installed
export PYTHONPATH="packages/tiering-core/src:packages/tiering-example/src${PYTHONPATH:+:$PYTHONPATH}"

echo "== transfer tests on CUDA"
timeout 180 "$PY" -m pytest -q -p no:cacheprovider packages/tiering-core/tests/test_transfer.py -k "cuda or geometry or plan or host_buffer"

echo "== pinned copy bandwidth: transfer path vs raw torch copy"
timeout 90 "$PY" scripts/bench_transfer.py --device cuda --threads 1 --blocks 512 --layers 32 --reps 10 \
    --prompt 0 --min-ratio "$MIN_RATIO"

echo "== SGLang HiCache with tiering's fs tier as L3 (python scripts/sglang_e2e.py)"
if ! "$PY" -c 'import sglang.srt.mem_cache.storage.backend_factory' 2>/dev/null; then
    echo "gpu_check: SKIP SGLang step: sglang is not installed under $PY"
elif [ -z "${SGLANG_MODEL:-}" ]; then
    echo "gpu_check: SKIP SGLang step: set SGLANG_MODEL to a model path or id SGLang can load"
else
    export PYTHONPATH="packages/tiering-fs/src:$PYTHONPATH"
    timeout 900 "$PY" scripts/sglang_e2e.py --model "$SGLANG_MODEL"
fi

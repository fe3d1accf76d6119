"""SGLang HiCache end to end with tiering's fs tier as L3 (needs CUDA and SGLang; run by scripts/gpu_check.sh).

Starts ``python -m sglang.launch_server`` with ``--hicache-storage-backend
dynamic`` naming :class:`tiering.sglang.storage.TieringHiCacheStorage`
over an fs tier in a temporary directory, sends one long prompt, stops the
server, checks that the tier holds blocks, starts a fresh server and sends
the same prompt again: SGLang must report cached tokens (its GPU and host
caches are empty after the restart, so they came from the tier).

Usage: python scripts/sglang_e2e.py --model MODEL [--port 30123] [--timeout 600]
Exit status 0 when the second request reused pages from the tier, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request


def extra_config(root: str) -> str:
    """SGLang's extra config for the tiering backend over an fs tier at ``root``."""
    return json.dumps(
        {
            "backend_name": "tiering",
            "module_path": "tiering.sglang.storage",
            "class_name": "TieringHiCacheStorage",
            "interface_v1": 1,
            "tiering": {"secondary_tiers": [{"type": "fs", "root": root}]},
        }
    )


def post(port: int, payload: dict[str, object], timeout: float) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate", json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        result: dict[str, object] = json.load(response)
        return result


def serve_once(model: str, port: int, root: str, prompt: str, timeout: float) -> int:
    """Start a server, send ``prompt``, stop the server; the cached tokens SGLang reported."""
    command = [
        sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(port),
        "--enable-hierarchical-cache", "--hicache-write-policy", "write_through",
        "--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config", extra_config(root),
    ]  # fmt: skip
    server = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"sglang_e2e: the server did not start (exit {server.poll()})") from None
                time.sleep(2)
        result = post(port, {"text": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}, timeout)
        meta = result.get("meta_info", {})
        cached = int(meta.get("cached_tokens", 0)) if isinstance(meta, dict) else 0
        time.sleep(5)  # let the write-back to the tier finish before the server stops
        return cached
    finally:
        server.terminate()
        server.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=30123)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    prompt = " ".join(f"word{i}" for i in range(2048))
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "kv")
        first = serve_once(args.model, args.port, root, prompt, args.timeout)
        blocks = sum(name.endswith(".kvb") for _, _, names in os.walk(root) for name in names)
        second = serve_once(args.model, args.port, root, prompt, args.timeout)
    print(f"sglang_e2e: first run cached {first} tokens, tier holds {blocks} blocks, after restart cached {second}")
    return 0 if blocks and second > 0 else 1


if __name__ == "__main__":
    sys.exit(main())

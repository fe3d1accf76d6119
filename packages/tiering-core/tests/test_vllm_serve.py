"""``vllm serve`` with tiering's fs tier, as users run it: the documented --kv-transfer-config, HTTP on 127.0.0.1.

The same long prompt twice, a server restart, the prompt a third time: the
three completions are identical and the third request's prompt comes from
our tier (``cached_tokens`` of the response, our tier's hits on /metrics).
Needs vLLM's CPU build (env of tests/vllm-cpu-requirements.txt).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest


def _is_vllm_cpu() -> bool:
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("tiering.fs") is None:
        return False
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


pytestmark = pytest.mark.skipif(
    not _is_vllm_cpu(), reason="needs vLLM's CPU build and tiering-fs (env of tests/vllm-cpu-requirements.txt)"
)

MAX_TOKENS = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(url: str, payload: dict[str, Any] | None = None, timeout: float = 120.0) -> Any:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read().decode()
    return json.loads(body) if payload is not None else body


class Server:
    """One ``vllm serve`` process on 127.0.0.1 (started by this test; stopped with SIGINT, then SIGKILL)."""

    def __init__(self, model: str, kv_transfer_config: dict[str, Any], log_path: str) -> None:
        from tiering.testing.vllm_engine import BLOCK_SIZE, ENGINE_ENV

        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        # `vllm serve` itself: vllm-cpu 0.32.0's `vllm` command fails at start (it asks importlib.metadata for the
        # distribution "vllm"; this build is "vllm-cpu"), so the same server is started as its module.
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enforce-eager",
            "--dtype",
            "float32",
            "--block-size",
            str(BLOCK_SIZE),
            "--max-model-len",
            "2048",
            "--seed",
            "0",
            "--enable-prompt-tokens-details",
            "--gpu-memory-utilization",
            "0.25",
            "--kv-transfer-config",
            json.dumps(kv_transfer_config),
        ]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **ENGINE_ENV})
        deadline = time.monotonic() + 300
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}; log in {log_path}")
            try:
                _http(f"{self.base}/health", timeout=2)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"vllm serve not healthy after 300 s; log in {log_path}") from None
                time.sleep(1)

    def complete(self, model: str, prompt: str) -> dict[str, Any]:
        payload = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
        result: dict[str, Any] = _http(f"{self.base}/v1/completions", payload)
        return result

    def metrics(self) -> str:
        text: str = _http(f"{self.base}/metrics")
        return text

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.close()


def _metric(text: str, name: str, label_fragment: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and label_fragment in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_vllm_serve_restart_serves_the_prompt_from_our_fs_tier(tmp_path: Any) -> None:
    from tiering.testing.vllm_engine import (
        build_tiny_llama,
        offloading_transfer_config,
        prompt_ids,
        prompt_text,
        stored_blocks,
    )

    model = build_tiny_llama(str(tmp_path / "model"))
    root = str(tmp_path / "kv")
    # The documented configuration for vLLM's CPU backend (docs/content/vllm.md).
    config = offloading_transfer_config(
        {
            "spec_name": "TieringSpec",
            "spec_module_path": "tiering.core.vllm.spec",
            "cpu_bytes_to_use": 16 << 20,
            "secondary_tiers": [
                {"type": "tiering_fs", "module_path": "tiering.core.vllm.tiers", "root": root, "model_revision": "t"}
            ],
        }
    )
    prompt = prompt_text(prompt_ids(330, seed=7))
    log = str(tmp_path / "serve.log")
    server = Server(model, config, log)
    try:
        first = server.complete(model, prompt)
        second = server.complete(model, prompt)  # from the engine's own prefix cache
        deadline = time.monotonic() + 120
        while stored_blocks({"tier": "fs", "config": {"root": root}}) < 10 and time.monotonic() < deadline:
            server.complete(model, "w1 w2")  # steps the engine so cascades to the tier are polled
            time.sleep(0.5)
        assert stored_blocks({"tier": "fs", "config": {"root": root}}) >= 10
    finally:
        server.stop()
    server = Server(model, config, log)
    try:
        third = server.complete(model, prompt)
        metrics = server.metrics()
    finally:
        server.stop()
    texts = [r["choices"][0]["text"] for r in (first, second, third)]
    assert texts[0] == texts[1] == texts[2], texts
    assert first["usage"]["completion_tokens"] == MAX_TOKENS
    cached = (third["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
    assert cached == 320, third["usage"]
    assert _metric(metrics, "vllm:kv_offload_tiering_chunk_hits", "tiering_fs") >= 10, [
        line for line in metrics.splitlines() if "kv_offload" in line
    ]

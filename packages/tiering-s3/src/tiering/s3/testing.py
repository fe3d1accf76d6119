"""Test fixtures of the s3 tier: S3-compatible servers on loopback, started for a test session or a benchmark.

- :func:`moto_server`: moto (``pip install "moto[server]"``), in this process
  (``ThreadedMotoServer``) or, with ``process=True``, in a child process (so a
  benchmark's client does not share its GIL); it accepts any credentials.
- :func:`nanio_server`: nanio (``pip install nanio``), a second S3
  implementation that checks credentials.
- :func:`localbucket_server`: localbucket (``pip install localbucket==1.2.1``),
  a server without batch delete (``DeleteObjects`` answers NotImplemented).

Each is a context manager yielding an :class:`S3Server` whose bucket exists,
and stops the server on exit. Nothing here imports moto, nanio or pytest until
a server is asked for: none of them is a dependency of tiering-s3 (the test
extra ``pip install 'tiering-s3[test]'`` installs moto).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import boto3

START_TIMEOUT_S = 30.0
MOTO_KEYS = ("testing-key-id", "testing-secret")  # made up: moto accepts any key pair


@dataclasses.dataclass
class S3Server:
    """A running S3 endpoint and the credentials, region and bucket to use with it.

    Attributes:
        external: True where the server is not moto (or not ours): a test then works under a random
            prefix of its own and cannot reset the server.
        batch_delete: whether the server takes ``DeleteObjects``, once someone has asked (None: not yet).
    """

    endpoint_url: str
    access_key: str
    secret_key: str
    region: str
    default_bucket: str
    external: bool
    batch_delete: bool | None = None

    @property
    def host_port(self) -> tuple[str, int]:
        """``(host, port)`` of the endpoint."""
        parsed = urllib.parse.urlsplit(self.endpoint_url)
        return parsed.hostname or "127.0.0.1", parsed.port or (443 if parsed.scheme == "https" else 80)

    def connection(self) -> dict[str, Any]:
        """The connection keys of an s3 tier entry: ``bucket``, ``endpoint_url``, ``region_name`` and the key pair."""
        return {
            "bucket": self.default_bucket,
            "endpoint_url": self.endpoint_url,
            "region_name": self.region,
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
        }

    def client(self) -> Any:
        """A plain boto3 S3 client of this server."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def create_bucket(self) -> None:
        """Create :attr:`default_bucket`."""
        self.client().create_bucket(Bucket=self.default_bucket)

    def moto_api(self, path: str, data: bytes = b"") -> None:
        """POST ``data`` to moto's control API at ``path`` (``/moto-api/reset``: forget every bucket).

        Raises:
            RuntimeError: the server is not moto.
            OSError: the request failed.
        """
        if self.external:
            raise RuntimeError(f"{self.endpoint_url} is not a moto server of ours: no {path}")
        req = urllib.request.Request(
            self.endpoint_url + path, data=data, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    def reset(self) -> None:
        """Empty a moto server (every bucket goes) and create :attr:`default_bucket` again."""
        self.moto_api("/moto-api/reset")
        self.create_bucket()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def moto_server(
    bucket: str = "tiering-test",
    *,
    port: int = 0,
    process: bool = False,
) -> Iterator[S3Server]:
    """A moto server on 127.0.0.1 with ``bucket`` created; stopped on exit.

    Args:
        bucket: the bucket to create.
        port: the TCP port; 0 picks a free one.
        process: run moto in a child process (``python -m moto.server``) instead of this one's threads.

    The credentials handed out are made up: moto accepts any.

    Raises:
        ImportError: moto is not installed (``pip install "moto[server]"``); with ``process=True`` a
            :class:`RuntimeError` says the server did not start instead.
    """
    if process:
        port = port or free_port()
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        server = S3Server(f"http://127.0.0.1:{port}", *MOTO_KEYS, "us-east-1", bucket, False)
        with _subprocess_server("moto", argv, dict(os.environ), server) as running:
            yield running
        return
    from moto.server import ThreadedMotoServer

    threaded = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    threaded.start()
    try:
        host, bound = threaded.get_host_and_port()
        server = S3Server(f"http://{host}:{bound}", *MOTO_KEYS, "us-east-1", bucket, False)
        server.create_bucket()
        yield server
    finally:
        threaded.stop()


@contextlib.contextmanager
def nanio_server(bucket: str = "tiering-test", data_dir: str | None = None) -> Iterator[S3Server]:
    """A nanio server on a free loopback port (data in ``data_dir``, default a temporary folder); stopped on exit.

    Raises:
        RuntimeError: nanio did not start (not installed, or it exited).
    """
    port = free_port()
    env = {**os.environ, "NANIO_ACCESS_KEY": "nanio-test-key", "NANIO_SECRET_KEY": "nanio-test-secret-0123456789"}
    server = S3Server(
        f"http://127.0.0.1:{port}", env["NANIO_ACCESS_KEY"], env["NANIO_SECRET_KEY"], "us-east-1", bucket, True
    )
    with _data_dir(data_dir) as folder:
        argv = [
            *(sys.executable, "-m", "nanio", "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir"),
            *(folder, "--no-access-log", "--log-level", "warning"),
        ]
        with _subprocess_server("nanio", argv, env, server) as running:
            yield running


@contextlib.contextmanager
def localbucket_server(bucket: str = "tiering-test", data_dir: str | None = None) -> Iterator[S3Server]:
    """A localbucket server (no batch delete) on a free loopback port; stopped on exit.

    Raises:
        RuntimeError: localbucket did not start (not installed next to this Python, or it exited).
    """
    port = free_port()
    server = S3Server(f"http://127.0.0.1:{port}", "lb-key", "lb-secret", "us-east-1", bucket, True)
    with _data_dir(data_dir) as folder:
        argv = [localbucket_script(), "--host", "127.0.0.1", "--port", str(port), folder]
        with _subprocess_server("localbucket", argv, dict(os.environ), server) as running:
            yield running


def localbucket_script() -> str:
    """Where the ``localbucket`` program of this Python's environment is (it may not exist)."""
    return os.path.join(os.path.dirname(sys.executable), "localbucket")


@contextlib.contextmanager
def _data_dir(data_dir: str | None) -> Iterator[str]:
    if data_dir is not None:
        yield data_dir
        return
    with tempfile.TemporaryDirectory(prefix="tiering-s3-") as folder:
        yield folder


@contextlib.contextmanager
def _subprocess_server(name: str, argv: Sequence[str], env: dict[str, str], server: S3Server) -> Iterator[S3Server]:
    """Run an S3 server process: wait for its port, create the bucket, yield; stop it on exit."""
    try:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as exc:
        raise RuntimeError(f"{name} did not start: {exc}") from exc
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                socket.create_connection(server.host_port, timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start on {server.endpoint_url}") from None
                time.sleep(0.1)
        server.create_bucket()
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

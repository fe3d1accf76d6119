"""Fixtures of the tiering-s3 tests: a real S3 server on loopback, proxies, a test CA.

The servers are started by :mod:`tiering.s3.testing`. By default one moto
server (``moto.server.ThreadedMotoServer``) runs on 127.0.0.1 for the whole
session and is reset (``POST /moto-api/reset``) before every test. With
``TIERING_S3_SERVER=nanio`` (or ``localbucket``) a second S3 implementation
is started instead, in a subprocess on 127.0.0.1 with a temporary data
folder; it is used like an external endpoint (a random prefix per test; the
moto-only tests skip). With ``TIERING_S3_ENDPOINT`` set (plus
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, optionally
``TIERING_S3_BUCKET`` and ``TIERING_S3_REGION``) the suite runs against that
endpoint instead; each test then works under its own random prefix and the
moto-only tests are skipped. Without that variable no test talks to anything
but loopback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import ipaddress
import os
import re
import select
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tiering.core import OffloadingSpec
from tiering.core.primary import allocate_host_buffer
from tiering.s3.testing import S3Server, localbucket_script, localbucket_server, moto_server, nanio_server

LOOPBACK = ("127.0.0.1", "localhost", "::1")
sys.path.insert(0, os.path.dirname(__file__))  # s3_helpers, shared by the test modules


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost,.s3.test")
    os.environ.setdefault("no_proxy", os.environ["NO_PROXY"])
    endpoint = os.environ.get("TIERING_S3_ENDPOINT")
    if endpoint:
        yield S3Server(
            endpoint,
            os.environ.get("AWS_ACCESS_KEY_ID", ""),
            os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
            os.environ.get("TIERING_S3_REGION", "us-east-1"),
            os.environ.get("TIERING_S3_BUCKET", "tiering-s3-test"),
            external=True,
        )
        return
    start = {"nanio": nanio_server, "localbucket": localbucket_server}.get(
        os.environ.get("TIERING_S3_SERVER", "moto"), moto_server
    )
    with start() as server:
        yield server


class S3Env:
    """One test's view of the server: a bucket, a unique prefix and a raw client."""

    def __init__(self, server: S3Server) -> None:
        self.server = server
        self.endpoint_url = server.endpoint_url
        self.bucket = server.default_bucket
        self.prefix = f"t-{uuid.uuid4().hex[:12]}" if server.external else "kv"
        self.client = self.make_client()

    def make_client(self, **config: Any) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.server.access_key,
            aws_secret_access_key=self.server.secret_key,
            region_name=self.server.region,
            config=Config(
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                max_pool_connections=32,
                **config,
            ),
        )

    def tier_config(self, **overrides: Any) -> dict[str, Any]:
        config: dict[str, Any] = {
            "type": "s3",
            "bucket": self.bucket,
            "prefix": self.prefix,
            "endpoint_url": self.endpoint_url,
            "region_name": self.server.region,
            "aws_access_key_id": self.server.access_key,
            "aws_secret_access_key": self.server.secret_key,
            "max_concurrency": 4,
            "connect_timeout": 2,
            "read_timeout": 5,
        }
        config.update(overrides)
        return {k: v for k, v in config.items() if v is not None}

    def list_keys(self, prefix: str = "") -> list[str]:
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            out.extend(obj["Key"] for obj in page.get("Contents", ()))
        return out

    def tier_client(self) -> Any:
        """A :class:`tiering.s3.client.S3Client` as the tier builds it (close it after use)."""
        from tiering.s3.client import S3Client
        from tiering.s3.config import SCHEMA, ConnectionSettings

        return S3Client(ConnectionSettings.from_entry(SCHEMA.validate(self.tier_config())), 4)

    def batch_delete(self) -> bool:
        """Whether the server takes ``DeleteObjects``, as the tier's start-up probe finds it (asked once per server)."""
        from tiering.s3.probe import probe_features

        if self.server.batch_delete is None:
            client = self.tier_client()
            try:
                self.server.batch_delete = probe_features(
                    client, f"{self.prefix}/.probe-{uuid.uuid4().hex}"
                ).batch_delete
            finally:
                client.close()
        return self.server.batch_delete

    def delete_keys(self, keys: list[str]) -> None:
        """Delete ``keys`` as the tier does: in batches where the server takes ``DeleteObjects``, else one by one."""
        batch_delete = self.batch_delete()
        client = self.tier_client()
        try:
            client.batch_delete = batch_delete
            failed = client.delete_many(keys)
        finally:
            client.close()
        assert not failed, f"cleanup could not delete: {failed}"

    def cleanup(self) -> None:
        if self.server.external:
            keys = self.list_keys(self.prefix + "/")
            if keys:
                self.delete_keys(keys)


@pytest.fixture
def s3(s3_server: S3Server) -> Iterator[S3Env]:
    if not s3_server.external:
        host = urllib.parse.urlsplit(s3_server.endpoint_url).hostname
        assert host in LOOPBACK, f"tests must stay on loopback, got {host}"
        s3_server.reset()
    env = S3Env(s3_server)
    yield env
    env.cleanup()


@pytest.fixture(scope="session")
def localbucket_session(s3_server: S3Server) -> Iterator[S3Server]:
    """A localbucket server (no batch delete): the session's own one, else one started for these tests.

    Skips where localbucket is not installed (``pip install localbucket==1.2.1``; the ``s3-localbucket``
    hatch env has it).
    """
    if os.environ.get("TIERING_S3_SERVER") == "localbucket":
        yield s3_server
        return
    if not os.path.exists(localbucket_script()):
        pytest.skip("localbucket is not installed (pip install localbucket==1.2.1)")
    with localbucket_server() as server:
        yield server


@pytest.fixture
def localbucket(localbucket_session: S3Server) -> Iterator[S3Env]:
    """One test's view of a localbucket server (a random prefix, removed afterwards)."""
    env = S3Env(localbucket_session)
    yield env
    env.cleanup()


@pytest.fixture
def moto_only(s3_server: S3Server) -> None:
    if s3_server.external:
        pytest.skip("needs the local moto server (TIERING_S3_ENDPOINT is set)")


def make_spec(block_bytes: int = 16 * 1024, num_blocks: int = 16, **fields: Any) -> OffloadingSpec:
    return OffloadingSpec(
        {"cpu_bytes_to_use": num_blocks * block_bytes, "block_bytes": block_bytes, "model": "test/model", **fields}
    )


@pytest.fixture
def spec_view() -> tuple[OffloadingSpec, memoryview]:
    return make_spec(), allocate_host_buffer(16, 16 * 1024)


# -- a loopback TCP proxy that forwards, fails or hangs on demand ------------------
_REQUEST_LINE = re.compile(rb"(GET|PUT|HEAD|POST|DELETE) (\S+) HTTP/1\.1\r\n")
_HOST_LINE = re.compile(rb"\r\n[Hh]ost: ([^\r]+)\r\n")

SLOW_DOWN = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
)
SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


class LoopbackProxy:
    """A TCP proxy on 127.0.0.1 in front of the S3 server.

    ``mode`` (applies to connections accepted after it is set; setting it
    closes open ones so pooled connections reconnect):

    - ``"pass"``: forward bytes both ways, recording request lines and Host headers;
    - ``"503"``: answer every request with 503 SlowDown;
    - ``"drop"``: read the request head, then close the connection;
    - ``"hang"``: accept and never answer.

    With ``ssl_context`` the proxy terminates TLS (the upstream stays plain HTTP).
    """

    def __init__(self, upstream: tuple[str, int], ssl_context: ssl.SSLContext | None = None) -> None:
        self.upstream = upstream
        self.ssl_context = ssl_context
        self.mode = "pass"
        self.requests: list[tuple[str, str, str]] = []  # (method, target, host)
        self.accepted = 0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            _close(conn)

    def close(self) -> None:
        self._stop = True
        _close(self._listener)
        self.set_mode("closed")

    def _accept_loop(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._handle, args=(conn, self.mode), daemon=True).start()

    def _handle(self, conn: socket.socket, mode: str) -> None:
        try:
            if self.ssl_context is not None:
                conn.settimeout(10)
                conn = self.ssl_context.wrap_socket(conn, server_side=True)
                conn.settimeout(None)
                with self._lock:
                    self._conns.add(conn)
            if mode == "pass":
                self._forward(conn)
            elif mode == "hang":
                while conn.recv(65536):
                    pass
            elif mode in ("503", "drop"):
                while True:
                    head = _read_head(conn)
                    if head is None or mode == "drop":
                        break
                    length = re.search(rb"\r\n[Cc]ontent-[Ll]ength: (\d+)", head)
                    if length and b"100-continue" not in head.lower():
                        _drain(conn, int(length.group(1)))
                    conn.sendall(SLOW_DOWN % (len(SLOW_DOWN_BODY), SLOW_DOWN_BODY))
                    break
        except OSError:
            pass
        finally:
            _close(conn)

    def _forward(self, conn: socket.socket) -> None:
        # One thread per connection does both directions: an ssl.SSLSocket must not be read and
        # written from two threads at once (that race corrupted response bytes now and then).
        upstream = socket.create_connection(self.upstream)
        with self._lock:
            self._conns.add(upstream)
        pending = getattr(conn, "pending", lambda: 0)  # bytes already decrypted inside the TLS layer
        try:
            while True:
                ready = [conn] if pending() else select.select([conn, upstream], [], [])[0]
                if conn in ready:
                    data = conn.recv(262144)
                    if not data:
                        return
                    for match in _REQUEST_LINE.finditer(data):
                        host = _HOST_LINE.search(data, match.end() - 2)
                        self.requests.append(
                            (match.group(1).decode(), match.group(2).decode(), host.group(1).decode() if host else "")
                        )
                    upstream.sendall(data)
                if upstream in ready:
                    data = upstream.recv(262144)
                    if not data:
                        return
                    conn.sendall(data)
        except (OSError, ValueError):  # ValueError: select on a socket closed by set_mode
            pass
        finally:
            _close(upstream)


def _read_head(conn: socket.socket) -> bytes | None:
    head = b""
    while b"\r\n\r\n" not in head:
        data = conn.recv(65536)
        if not data:
            return None
        head += data
    return head


def _drain(conn: socket.socket, n: int) -> None:
    while n > 0:
        data = conn.recv(min(n, 65536))
        if not data:
            return
        n -= len(data)


def _close(sock: socket.socket) -> None:
    # shutdown() first: it sends FIN at once and wakes a thread blocked on the socket; close() alone does
    # neither while another thread is inside recv()/select() on it, so a client could reuse a pooled
    # connection the proxy meant to drop (a connection error where the test expects a timeout).
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


@pytest.fixture
def proxy_factory(s3: S3Env) -> Iterator[Any]:
    proxies: list[LoopbackProxy] = []

    def make(ssl_context: ssl.SSLContext | None = None) -> LoopbackProxy:
        proxy = LoopbackProxy(s3.server.host_port, ssl_context)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


# -- a throw-away CA and a server certificate for *.s3.test, localhost, 127.0.0.1 --------
@dataclasses.dataclass
class TestCA:
    ca_path: str
    server_context: ssl.SSLContext


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder = tmp_path_factory.mktemp("ca")
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tiering-s3 test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "s3.test")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("s3.test"),
                    x509.DNSName("*.s3.test"),
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = folder / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path = folder / "server.pem"
    cert_path.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert_path))
    return TestCA(str(ca_path), context)


@pytest.fixture
def resolve_s3_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``s3.test`` and ``*.s3.test`` resolve to 127.0.0.1 in this process (no DNS, no /etc/hosts)."""
    real = socket.getaddrinfo

    def fake(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and (host == "s3.test" or host.endswith(".s3.test")):
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)


def wait_until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)

"""Test fixtures of the redis tier: throw-away local Redis servers (standalone, a 3-primary Cluster, Sentinel).

Each runs Debian's ``redis-server`` / ``redis-sentinel`` (``apt-get install
redis-server redis-sentinel``) on 127.0.0.1 at a free port, in a temporary
directory, with persistence off (no RDB, no AOF), and is stopped (and its
directory removed) by :meth:`LocalRedis.stop` or the ``with`` block. The
tier's own tests, the other packages' tests and ``scripts/bench_redis.py``
start their servers from here; the tier's runtime code never imports it.
Nothing here imports pytest (the benchmarks run without it).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

START_TIMEOUT_S = 20.0


def have_redis_server() -> bool:
    """Whether ``redis-server`` is on PATH."""
    return shutil.which("redis-server") is not None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (cluster bus port + 10000 checked too)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 < 65536:
            with socket.socket() as s, contextlib.suppress(OSError):
                s.bind(("127.0.0.1", port + 10000))
                return port


def _wait_ping(port: int, proc: subprocess.Popen[bytes], password: str | None = None, ca: str | None = None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    tls: dict[str, Any] = {"ssl": True, "ssl_ca_certs": ca} if ca else {}
    client = redis.Redis(port=port, password=password, socket_timeout=1, socket_connect_timeout=1, **tls)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"redis server on port {port} exited with status {proc.returncode}")
            try:
                if client.ping():
                    return
            except redis.exceptions.ResponseError:  # e.g. LOADING, or sentinel before it knows a master
                return
            except redis.exceptions.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis server on port {port} did not answer within {START_TIMEOUT_S}s")
            time.sleep(0.05)
    finally:
        client.close()


class LocalRedis:
    """One ``redis-server`` on 127.0.0.1 (no persistence).

    Args:
        port: the port; None picks a free one.
        args: extra ``redis-server`` arguments (``["--maxmemory", "10mb"]``).
        directory: working directory; None: a new temporary one (removed by :meth:`stop`).
        password: ``requirepass`` (None: no password).
        binary: the server program (``redis-sentinel`` for a sentinel).
        tls: ``(certificate file, key file)`` of a self-signed certificate:
            the server then speaks only TLS on ``port`` (clients need not
            present a certificate); the certificate is its own CA.
    """

    def __init__(
        self,
        port: int | None = None,
        args: Sequence[str] = (),
        directory: Path | None = None,
        password: str | None = None,
        binary: str = "redis-server",
        tls: tuple[str, str] | None = None,
    ) -> None:
        self.tls = tls
        self.port = port or free_port()
        self.args = list(args)
        self.password = password
        self.binary = binary
        self._own_dir = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="tiering-redis-")) if directory is None else directory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (``rediss://`` with TLS; without the password)."""
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        """The command line that starts the server."""
        cmd = [self.binary]
        if self.binary == "redis-sentinel":
            conf = self.directory / "sentinel.conf"
            if not conf.exists():
                conf.write_text("")
            cmd = ["redis-sentinel", str(conf)]
        if self.tls:
            cert, key = self.tls
            cmd += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", cert, "--tls-key-file", key]
            cmd += ["--tls-ca-cert-file", cert, "--tls-auth-clients", "no"]
        else:
            cmd += ["--port", str(self.port)]
        cmd += ["--bind", "127.0.0.1", "--dir", str(self.directory)]
        cmd += ["--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no"]
        cmd += ["--logfile", str(self.directory / f"redis-{self.port}.log")]
        if self.password:
            cmd += ["--requirepass", self.password]
        return cmd + self.args

    def start(self) -> LocalRedis:
        """Start the server and wait until it answers PING.

        Raises:
            RuntimeError: it exited or did not answer within :data:`START_TIMEOUT_S`.
        """
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_ping(self.port, self.proc, self.password, self.tls[0] if self.tls else None)
        return self

    def client(self, **kwargs: object) -> redis.Redis:
        """A redis-py client of this server."""
        return redis.Redis(port=self.port, password=self.password, **kwargs)  # type: ignore[arg-type]

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), keeping its directory (for :meth:`start` again)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        """Kill the server and remove its temporary directory; idempotent."""
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class LocalCluster:
    """A Redis Cluster of ``primaries`` nodes on 127.0.0.1, made with ``redis-cli --cluster create``.

    Args:
        primaries: number of primary nodes (>= 3, as ``redis-cli`` requires).
        args: extra ``redis-server`` arguments for every node.
    """

    def __init__(self, primaries: int = 3, args: Sequence[str] = ()) -> None:
        if primaries < 3:
            raise ValueError(f"a cluster needs >= 3 primaries, got {primaries}")
        cluster_args = ["--cluster-enabled", "yes", "--cluster-node-timeout", "5000", *args]
        self.nodes = [LocalRedis(args=cluster_args) for _ in range(primaries)]
        for node in self.nodes:
            node.args += ["--cluster-config-file", str(node.directory / "nodes.conf")]

    @property
    def url(self) -> str:
        """The URL of the first node (any node bootstraps a cluster client)."""
        return self.nodes[0].url

    def start(self) -> LocalCluster:
        """Start the nodes, create the cluster and wait until every slot is served.

        Raises:
            RuntimeError: a node did not start, or the cluster did not become ``ok``.
        """
        try:
            for node in self.nodes:
                node.start()
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run(
                ["redis-cli", "--cluster", "create", *addrs, "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=60,
            )
            deadline = time.monotonic() + START_TIMEOUT_S
            for node in self.nodes:
                with contextlib.closing(node.client(socket_timeout=2)) as client:
                    while client.cluster("info").get("cluster_state") != "ok":
                        if time.monotonic() > deadline:
                            raise RuntimeError("the cluster did not reach state ok")
                        time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def reshard(self, slots: int, source: LocalRedis, target: LocalRedis) -> None:
        """Move ``slots`` slots from ``source`` to ``target`` with ``redis-cli --cluster reshard`` (keys move too).

        Raises:
            subprocess.CalledProcessError: redis-cli failed.
        """

        def node_id(node: LocalRedis) -> str:
            with contextlib.closing(node.client()) as client:
                return str(client.execute_command("CLUSTER MYID").decode())  # type: ignore[no-untyped-call]

        subprocess.run(
            [
                "redis-cli", "--cluster", "reshard", f"127.0.0.1:{source.port}",
                "--cluster-from", node_id(source), "--cluster-to", node_id(target),
                "--cluster-slots", str(slots), "--cluster-yes", "--cluster-pipeline", "50",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )  # fmt: skip

    def stop(self) -> None:
        """Stop every node; idempotent."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class LocalSentinel:
    """A primary ``redis-server`` (and ``replicas`` replicas of it) watched by one ``redis-sentinel``.

    Args:
        service_name: the master name the sentinel monitors.
        replicas: replica servers (``--replicaof`` the primary); needed for :meth:`failover`
            and :meth:`kill_primary`.
        down_after_ms: milliseconds without an answer after which the sentinel holds the primary
            down (``down-after-milliseconds``); with a quorum of 1 the failover starts then.
    """

    def __init__(self, service_name: str = "tiering", replicas: int = 0, down_after_ms: int = 5000) -> None:
        self.service_name = service_name
        self.down_after_ms = down_after_ms
        self.primary = LocalRedis()
        self.replicas = [LocalRedis(args=["--replicaof", "127.0.0.1", str(self.primary.port)]) for _ in range(replicas)]
        self.sentinel = LocalRedis(binary="redis-sentinel")
        self.dead: list[LocalRedis] = []  # primaries killed by kill_primary (their directories go at stop)

    @property
    def sentinels(self) -> list[list[str | int]]:
        """The ``sentinels`` config value: ``[["127.0.0.1", port]]``."""
        return [["127.0.0.1", self.sentinel.port]]

    def master_port(self) -> int | None:
        """The port the sentinel names as the current primary (None: it names none)."""
        with contextlib.closing(self.sentinel.client(socket_timeout=2)) as client:
            addr: Any = client.sentinel_get_master_addr_by_name(self.service_name)
        return int(addr[1]) if addr else None

    def _wait(self, done: Any, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} within {timeout_s}s")
            time.sleep(0.1)

    def start(self) -> LocalSentinel:
        """Start the primary, its replicas (in sync), then the sentinel; wait until the sentinel names the primary.

        Raises:
            RuntimeError: a server did not start, a replica did not sync, or the sentinel did not report the primary.
        """
        try:
            self.primary.start()
            for replica in self.replicas:
                replica.start()
                with contextlib.closing(replica.client(socket_timeout=2)) as client:
                    self._wait(
                        lambda c=client: c.info("replication").get("master_link_status") == "up",
                        "a replica did not sync",
                    )
            (self.sentinel.directory / "sentinel.conf").write_text(
                f"sentinel monitor {self.service_name} 127.0.0.1 {self.primary.port} 1\n"
                f"sentinel down-after-milliseconds {self.service_name} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.service_name} 10000\n"
            )
            self.sentinel.start()
            self._wait(lambda: self.master_port() == self.primary.port, "the sentinel did not report the primary")
            if self.replicas:
                with contextlib.closing(self.sentinel.client(socket_timeout=2)) as client:
                    self._wait(
                        lambda: len(client.sentinel_slaves(self.service_name)) == len(self.replicas),
                        "the sentinel did not discover the replicas",
                    )
        except BaseException:
            self.stop()
            raise
        return self

    def failover(self, timeout_s: float = 30.0) -> LocalRedis:
        """``SENTINEL FAILOVER``: a replica becomes the primary; returns it once the old primary replicates it.

        Writes that reach the old primary before the sentinel demotes it are
        lost with its data set (Redis replication is asynchronous): a miss.

        Raises:
            RuntimeError: no replica, or the failover did not finish within ``timeout_s``.
        """
        if not self.replicas:
            raise RuntimeError("a failover needs a replica (LocalSentinel(replicas=1))")
        old = self.primary
        with contextlib.closing(self.sentinel.client(socket_timeout=5)) as client:
            client.sentinel_failover(self.service_name)
        self._wait(lambda: self.master_port() not in (None, old.port), "the failover did not finish", timeout_s)
        port = self.master_port()
        new = next(r for r in self.replicas if r.port == port)
        with contextlib.closing(new.client(socket_timeout=2)) as c:
            self._wait(lambda: c.info("replication").get("role") == "master", "the new primary is not a master")
        with contextlib.closing(old.client(socket_timeout=2)) as c:  # demoted (its clients killed): the end
            self._wait(
                lambda: c.info("replication").get("master_port") == new.port,
                "the old primary was not demoted",
                timeout_s,
            )
        self.replicas = [r for r in self.replicas if r is not new] + [old]
        self.primary = new
        return new

    def kill_primary(self, timeout_s: float = 60.0) -> LocalRedis:
        """Kill the primary's process (SIGKILL) and wait until the sentinel has promoted a replica; returns it.

        The sentinel notices after ``down_after_ms`` and then promotes; the old
        primary stays dead. Writes it acknowledged but had not yet sent to the
        replica are lost (Redis replicates asynchronously).

        Raises:
            RuntimeError: no replica, or no replica was promoted within ``timeout_s``.
        """
        if not self.replicas:
            raise RuntimeError("a failover needs a replica (LocalSentinel(replicas=1))")
        old = self.primary
        old.kill()
        self.dead.append(old)
        self._wait(lambda: self.master_port() not in (None, old.port), "no replica was promoted", timeout_s)
        port = self.master_port()
        new = next(r for r in self.replicas if r.port == port)
        with contextlib.closing(new.client(socket_timeout=2)) as c:
            self._wait(lambda: c.info("replication").get("role") == "master", "the new primary is not a master")
        self.replicas = [r for r in self.replicas if r is not new]
        self.primary = new
        return new

    def stop(self) -> None:
        """Stop the sentinel, the replicas and the primary; idempotent."""
        self.sentinel.stop()
        for replica in [*self.replicas, *self.dead]:
            replica.stop()
        self.primary.stop()

    def __enter__(self) -> LocalSentinel:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


@contextlib.contextmanager
def local_redis(args: Sequence[str] = ()) -> Iterator[LocalRedis]:
    """A :class:`LocalRedis` started before and stopped after a ``with`` block."""
    server = LocalRedis(args=args).start()
    try:
        yield server
    finally:
        server.stop()

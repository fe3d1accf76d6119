"""Pipelines packed by hand on a redis-py connection: block stores without copying the block, fast reply reading.

redis-py's pipeline costs about 10 us of Python per command. For a block
store the value is the 128-byte header followed by the primary slot's
bytes, so :func:`set_nx_parts` writes the RESP framing around them and the
slot's ``memoryview`` itself goes to the socket (the kernel's copy into the
socket is the only one). :func:`set_nx_many` computes each block's header
(its payload checksum) just before that block is sent, so the connection
carries the first block while the others are still to be hashed, and sends
each block with one ``sendmsg`` (the framing of the block before joined to
this one's). :func:`read_replies` reads a batch of replies with one
:class:`hiredis.Reader` fed from the socket in 64 KiB chunks (about 0.3 us
per reply; a larger receive buffer costs an ``mmap`` / ``munmap`` pair per
call), or through redis-py's ``read_response`` when hiredis is not installed.

Everything runs on a connection taken from the client's own pool, so
authentication, TLS, ``socket_timeout`` and the pool's size are redis-py's;
:func:`run_on_connection` retries with the client's :class:`redis.retry.Retry`
(``SET NX`` is safe to resend: a block the first attempt stored answers nil,
"already present"). A ``READONLY`` reply drops the connection and is retried
(:class:`NowReplicaError`: after a Sentinel failover the next connection
goes to the new primary). Used for a single server and a Sentinel-managed primary;
a cluster goes through redis-py's cluster pipeline, which routes per slot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tiering.core.format import HEADER_SIZE, BlockFormatError, TruncatedBlockError, verify_block
from tiering.redis.sends import send_groups

try:
    import hiredis
except ImportError:  # the hiredis extra is not installed: replies are read through redis-py
    hiredis = None  # type: ignore[assignment]

T = TypeVar("T")
R = TypeVar("R", bytes, int)


class NowReplicaError(RedisConnectionError, ReadOnlyError):
    """A write answered ``READONLY``: the server was a primary and is now a replica (a failover).

    The connection is dropped, so its next use connects again (asking the
    sentinels for the new primary, as redis-py's own Sentinel connections do);
    as a connection error the client's ``Retry`` retries the request, and
    :func:`tiering.redis.errors.classify_error` still names it ``readonly``.
    """


def _raise_if_replica(conn: Any, replies: Sequence[Any]) -> None:
    for reply in replies:
        if isinstance(reply, ResponseError) and str(reply).startswith("READONLY"):
            conn.disconnect()
            raise NowReplicaError(str(reply))


Chunk = bytes | memoryview  # (the same as tiering.redis.sends.Chunk)

_RECV_BYTES = 1 << 16
"""Bytes asked of one ``recv`` of replies: below glibc's ``mmap`` threshold, so a receive maps no memory."""


def set_nx_parts(name: bytes, header: bytes, payload: memoryview, ttl_s: int | None) -> list[Chunk]:
    """The RESP of ``SET name header+payload NX [EX ttl_s]`` as chunks; ``payload`` is not copied.

    Args:
        name: the Redis key.
        header: the block header (:data:`tiering.core.format.HEADER_SIZE` bytes).
        payload: the block's bytes (a C-contiguous byte view of the primary slot).
        ttl_s: seconds until the key expires, or None.
    """
    argc = 4 if ttl_s is None else 6
    size = len(header) + payload.nbytes
    head = b"*%d\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s" % (argc, len(name), name, size, header)
    tail = b"\r\n$2\r\nNX\r\n"
    if ttl_s is not None:
        ttl = b"%d" % ttl_s
        tail += b"$2\r\nEX\r\n$%d\r\n%s\r\n" % (len(ttl), ttl)
    return [head, payload, tail]


def command(*args: bytes) -> bytes:
    """The RESP of one command whose arguments are ``bytes`` (e.g. ``command(b"STRLEN", name)``)."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _received(receive: Callable[[Any], R], arg: Any, what: str) -> R:
    """``receive(arg)``, one socket receive (``recv(size)`` / ``recv_into(view)``), its failures as redis-py's.

    Raises:
        redis.exceptions.TimeoutError: no data within the socket's timeout.
        redis.exceptions.ConnectionError: the receive failed, or returned nothing (the server closed the connection).
    """
    try:
        got = receive(arg)
    except TimeoutError as exc:
        raise RedisTimeoutError(f"timeout reading {what}") from exc
    except OSError as exc:
        raise RedisConnectionError(f"error reading {what}: {exc}") from exc
    if not got:
        raise RedisConnectionError("the server closed the connection")
    return got


def read_replies(conn: Any, n: int) -> list[Any]:
    """The next ``n`` replies of ``conn``; an error reply is returned (a :class:`ResponseError`), not raised.

    The connection must have no unread reply before this request (it comes
    fresh from its pool, and a connection that failed is disconnected).

    Raises:
        redis.exceptions.ConnectionError: the connection broke or closed.
        redis.exceptions.TimeoutError: no reply within the connection's ``socket_timeout``.
    """
    sock = getattr(conn, "_sock", None)  # redis-py's socket (TLS included); connected by send_packed_command
    if hiredis is None or sock is None:
        out: list[Any] = []
        for _ in range(n):
            try:
                out.append(conn.read_response())
            except ResponseError as exc:
                out.append(exc)
        return out
    reader = hiredis.Reader(replyError=ResponseError)
    out = []
    while len(out) < n:
        reader.feed(_received(sock.recv, _RECV_BYTES, f"{n} replies"))
        while (reply := reader.gets()) is not False:
            out.append(reply)
    return out


def run_on_connection(client: Any, parts: Sequence[Chunk] | Callable[[Any], None], n: int) -> list[Any]:
    """Send ``parts`` (``n`` packed commands) on one pooled connection of ``client``; its ``n`` replies.

    ``parts`` may also be a function that sends the commands itself (``parts(conn)``, once per attempt).
    Retried on connection errors and timeouts by the client's ``Retry`` (its
    backoff between attempts); the connection is disconnected after a failure,
    so no unread reply is ever left on a pooled connection.

    Raises:
        redis.exceptions.ConnectionError / TimeoutError: every attempt failed.
    """
    pool = client.connection_pool
    conn = pool.get_connection()
    try:

        def attempt() -> list[Any]:
            if callable(parts):
                parts(conn)
            else:
                conn.send_packed_command(list(parts))
            replies = read_replies(conn, n)
            _raise_if_replica(conn, replies)
            return replies

        def failed(_error: BaseException) -> None:
            conn.disconnect()

        retry = client.get_retry()
        if retry is None:
            return _once(attempt, failed)
        return list(retry.call_with_retry(attempt, failed))
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def _once(attempt: Callable[[], T], failed: Callable[[BaseException], None]) -> T:
    try:
        return attempt()
    except BaseException as exc:
        failed(exc)
        raise


class InSlot:
    """A ``GET`` reply whose payload was read straight into the destination slot; ``header`` holds its header."""

    __slots__ = ("header",)

    def __init__(self, header: bytearray) -> None:
        self.header = header


class _Stream:
    """Buffered reads of one socket: reply lines through a small buffer, block payloads straight into slots."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.pos = 0

    def _fill(self) -> None:
        data = _received(self.sock.recv, 1 << 16, "a reply")
        if self.pos:
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += data

    def line(self) -> bytes:
        while (end := self.buf.find(b"\r\n", self.pos)) < 0:
            self._fill()
        out = bytes(self.buf[self.pos : end])
        self.pos = end + 2
        return out

    def read_into(self, view: memoryview) -> None:
        """Fill ``view`` exactly: first from the buffer, the rest with ``recv_into`` (no intermediate copy)."""
        want = view.nbytes
        k = min(len(self.buf) - self.pos, want)
        view[:k] = self.buf[self.pos : self.pos + k]
        self.pos += k
        while k < want:
            k += _received(self.sock.recv_into, view[k:], "a reply")


def get_into(client: Any, names: Sequence[bytes], slots: Sequence[memoryview], header_size: int) -> list[Any]:
    """Pipelined ``GET`` of ``names`` on one pooled connection, each value of the expected size read into its slot.

    Args:
        client: a :class:`redis.Redis` (single server or Sentinel primary).
        names: the keys.
        slots: the destination of each key's payload (the bytes after the header).
        header_size: bytes of header before the payload.

    Returns:
        One per key: :class:`InSlot` (header + ``len(slot)`` payload bytes: the
        payload is in the slot, unverified), None (no such key), ``bytes`` (a
        value of another size, left for the caller to refuse) or a
        :class:`ResponseError`. A slot's contents are undefined unless its
        block then verifies.

    Raises:
        redis.exceptions.ConnectionError / TimeoutError: every attempt (the client's ``Retry``) failed.
    """
    request = b"".join(command(b"GET", name) for name in names)
    pool = client.connection_pool
    conn = pool.get_connection()

    def attempt() -> list[Any]:
        conn.send_packed_command([request])
        sock = getattr(conn, "_sock", None)
        if sock is None:  # not a socket connection redis-py exposes: read with redis-py and copy
            out = []
            for raw, slot in zip(read_replies(conn, len(names)), slots, strict=True):
                if isinstance(raw, bytes) and len(raw) == header_size + slot.nbytes:
                    slot[:] = memoryview(raw)[header_size:]
                    raw = InSlot(bytearray(raw[:header_size]))
                out.append(raw)
            return out
        stream = _Stream(sock)
        replies: list[Any] = []
        for slot in slots:
            line = stream.line()
            if line[:1] == b"-":
                replies.append(ResponseError(line[1:].decode("utf-8", "replace")))
                continue
            if line == b"_":  # RESP3 null: no such key
                replies.append(None)
                continue
            if line[:1] != b"$":
                raise RedisConnectionError(f"unexpected reply to GET: {line[:40]!r}")
            size = int(line[1:])
            if size < 0:
                replies.append(None)
                continue
            if size == header_size + slot.nbytes:
                header = bytearray(header_size)
                stream.read_into(memoryview(header))
                stream.read_into(slot)
                replies.append(InSlot(header))
            else:
                value = bytearray(size)
                stream.read_into(memoryview(value))
                replies.append(bytes(value))
            if stream.line() != b"":
                raise RedisConnectionError("a GET reply did not end where its length said")
        _raise_if_replica(conn, replies)
        return replies

    def failed(_error: BaseException) -> None:
        conn.disconnect()

    try:
        retry = client.get_retry()
        return _once(attempt, failed) if retry is None else list(retry.call_with_retry(attempt, failed))
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def set_nx_many(
    client: Any,
    is_cluster: bool,
    names: Sequence[bytes],
    header_of: Callable[[int], bytes],
    payloads: Sequence[memoryview],
    ttls: Sequence[int | None],
) -> list[Any]:
    """``SET name header+payload NX [EX ttl]`` of every block in one round trip; one reply (or error) per block.

    ``header_of(i)`` is block ``i``'s header (called once per block and attempt, in order). A single server or
    Sentinel primary: packed by hand, one ``sendmsg`` per block (:func:`~tiering.redis.sends.send_groups`, the
    payload not copied); a cluster: redis-py's cluster pipeline (it routes per slot and follows ``MOVED`` / ``ASK``).

    Raises:
        redis.exceptions.RedisError: the whole request failed (every attempt of the client's ``Retry``).
    """
    if is_cluster:
        pipe = client.pipeline(transaction=False)
        for i, (name, payload, ttl) in enumerate(zip(names, payloads, ttls, strict=True)):
            pipe.set(name, b"".join((header_of(i), payload)), nx=True, ex=ttl)
        return list(pipe.execute(raise_on_error=False))
    return run_on_connection(client, lambda conn: send_groups(conn, _set_nx_groups(names, header_of, payloads, ttls)),
                             len(names))  # fmt: skip


def _set_nx_groups(
    names: Sequence[bytes],
    header_of: Callable[[int], bytes],
    payloads: Sequence[memoryview],
    ttls: Sequence[int | None],
) -> Iterator[list[Chunk]]:
    """The chunks of each ``SET NX`` (the framing of the one before joined to its own), each header made when due."""
    carry: Chunk = b""
    for i, (name, payload, ttl) in enumerate(zip(names, payloads, ttls, strict=True)):
        head, body, tail = set_nx_parts(name, header_of(i), payload, ttl)
        yield [b"".join((carry, head)), body]
        carry = tail
    yield [carry]


def get_many(
    client: Any, is_cluster: bool, names: Sequence[bytes], slots: Sequence[memoryview], header_size: int
) -> list[Any]:
    """``GET`` of every key in one round trip: :func:`get_into` (a single server / Sentinel), or a cluster pipeline.

    Returns:
        As :func:`get_into`; a cluster's replies are ``bytes`` (or None, or an error), never :class:`InSlot`.
    """
    if not is_cluster:
        return get_into(client, names, slots, header_size)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
    return list(pipe.execute(raise_on_error=False))


def verify_into(
    reply: bytes | InSlot, view: memoryview, digest: bytes, key: bytes, stored_bytes: int
) -> BlockFormatError | None:
    """Verify a ``GET`` reply of :func:`get_many` whose payload is in ``view`` already, or is moved there once verified.

    Args:
        reply: an :class:`InSlot` (header read, payload in ``view``) or the whole value.
        view: the block's primary slot.
        digest: the namespace digest (raw bytes) the header must carry.
        key: the block's key, which the header must carry.
        stored_bytes: the size of a stored block (header + payload).

    Returns:
        None (verified; the payload is in ``view``) or why not (the slot's bytes are not to be used).
    """
    try:
        if isinstance(reply, InSlot):
            header, payload, stored = memoryview(reply.header), view, stored_bytes
        else:
            value = memoryview(reply)
            if value.nbytes != stored_bytes:
                raise TruncatedBlockError(f"value is {value.nbytes} bytes, expected {stored_bytes}")
            header, payload, stored = value[:HEADER_SIZE], value[HEADER_SIZE:], value.nbytes
        verify_block(header, payload, digest, key, stored_size=stored)
    except BlockFormatError as exc:
        return exc
    if not isinstance(reply, InSlot):
        view[:] = payload
    return None

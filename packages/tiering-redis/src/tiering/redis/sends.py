"""Sending packed commands on a redis-py connection with one ``sendmsg`` per group of chunks.

redis-py's ``send_packed_command`` calls ``sendall`` once per chunk; a block
store's ``SET`` is three chunks (its framing, the primary slot's bytes, the
framing's tail), each a system call and, with ``TCP_NODELAY``, its own
segment. :func:`send_groups` hands each group of chunks (one block's, with
the tail of the block before) to the kernel in one ``sendmsg``, on a plain
TCP or Unix socket; on any other socket (TLS) it falls back to redis-py's
``send_packed_command``. The groups may be a generator: the next group is
made only once the one before is sent (a block's header, with its
checksum, is computed just before the block goes out).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

Chunk = bytes | memoryview

IOV_MAX = 1024
"""Buffers one ``sendmsg`` takes at most (Linux's ``IOV_MAX``)."""


def sendmsg_all(sock: socket.socket, chunks: list[Chunk]) -> None:
    """Send every byte of ``chunks`` on ``sock``: ``sendmsg`` again with what a partial send left.

    Raises:
        OSError: the send failed, or (``TimeoutError``) the socket's timeout passed.
    """
    views = [memoryview(c).cast("B") for c in chunks]
    while views:
        sent = sock.sendmsg(views[:IOV_MAX])
        while views and sent >= views[0].nbytes:
            sent -= views.pop(0).nbytes
        if sent and views:
            views[0] = views[0][sent:]


def send_groups(conn: Any, groups: Iterable[list[Chunk]]) -> None:
    """Send each group of chunks on redis-py connection ``conn`` (connected first when it is not).

    Raises:
        redis.exceptions.TimeoutError: the socket's timeout passed while sending (the connection is dropped).
        redis.exceptions.ConnectionError: the connection or a send failed (the connection is dropped).
    """
    if getattr(conn, "_sock", None) is None:
        conn.connect()
    sock = getattr(conn, "_sock", None)
    plain = sock if isinstance(sock, socket.socket) and not isinstance(sock, ssl.SSLSocket) else None
    try:
        for chunks in groups:
            if plain is not None:
                sendmsg_all(plain, chunks)
            else:  # redis-py maps its errors and disconnects on its own
                conn.send_packed_command(chunks, check_health=False)
    except TimeoutError as exc:  # socket.timeout
        conn.disconnect()
        raise RedisTimeoutError("timeout writing to the socket") from exc
    except OSError as exc:
        conn.disconnect()
        raise RedisConnectionError(f"error writing to the socket: {exc}") from exc

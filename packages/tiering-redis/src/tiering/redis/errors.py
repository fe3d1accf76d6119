"""What went wrong talking to Redis, in a few classes that become failure causes and counters.

redis-py raises one exception hierarchy for single servers, Cluster and
Sentinel (:mod:`redis.exceptions`); :func:`classify_error` maps it onto the
causes a tier reports (``store_failed_<cause>`` / ``load_failed_<cause>``,
``errors_<cause>``):

==================  =============================================================
cause               exceptions
==================  =============================================================
``timeout``         ``TimeoutError``, ``socket.timeout``
``loading``         ``BusyLoadingError`` (the server is loading its data set)
``credentials``     ``AuthenticationError``, ``AuthorizationError``,
                    ``NoPermissionError`` (ACL), ``WRONGPASS`` / ``NOAUTH`` replies
``connection``      ``ConnectionError`` (refused, reset, closed), ``OSError``
``readonly``        ``ReadOnlyError`` (a replica after a failover)
``no_space``        ``OutOfMemoryError`` (maxmemory reached with ``noeviction``)
``moved``           ``MovedError``, ``AskError``, ``TryAgainError``,
                    ``ClusterDownError``, ``SlotNotCoveredError``, other
                    ``RedisClusterException`` (the cluster is resharding or down)
``other``           anything else
==================  =============================================================
"""

from __future__ import annotations

import socket

from redis import exceptions as rx

ERROR_CLASSES = ("timeout", "loading", "credentials", "connection", "readonly", "no_space", "moved", "other")
"""Every cause :func:`classify_error` returns."""


class RedisStartupError(OSError):
    """The tier or inspector could not start: server unreachable, credentials refused, probe failed.

    Also an ``OSError``, so the ``tiering`` commands report it as a clear error (exit status 2).

    Attributes:
        cause: one of :data:`ERROR_CLASSES` (or ``"probe"``), saying what to fix.
    """

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


def classify_error(exc: BaseException) -> str:
    """The cause class of an exception raised by redis-py (see the module docstring)."""
    if isinstance(exc, (rx.TimeoutError, socket.timeout, TimeoutError)):
        return "timeout"
    if isinstance(exc, rx.BusyLoadingError) or (isinstance(exc, rx.ResponseError) and str(exc).startswith("LOADING")):
        return "loading"
    if isinstance(exc, (rx.AuthenticationError, rx.AuthorizationError, rx.NoPermissionError)):
        return "credentials"
    if isinstance(exc, rx.ResponseError) and str(exc).startswith(("WRONGPASS", "NOAUTH", "NOPERM")):
        return "credentials"
    if isinstance(exc, rx.ReadOnlyError) or (isinstance(exc, rx.ResponseError) and str(exc).startswith("READONLY")):
        return "readonly"
    if isinstance(exc, rx.OutOfMemoryError) or (isinstance(exc, rx.ResponseError) and str(exc).startswith("OOM")):
        return "no_space"
    if isinstance(exc, (rx.AskError, rx.TryAgainError, rx.ClusterDownError, rx.RedisClusterException)):
        return "moved"
    if isinstance(exc, rx.ClusterError):
        return "moved"
    if isinstance(exc, (rx.ConnectionError, OSError)):
        return "connection"
    return "other"

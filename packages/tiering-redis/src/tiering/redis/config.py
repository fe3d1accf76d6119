"""The keys of a ``redis`` tier entry, and the redis-py client they describe.

Every key is declared once in :data:`SCHEMA` (type, default, range, secret);
:class:`RedisSettings` holds a validated entry and builds the client:

- ``mode: "standalone"`` (default): :meth:`redis.Redis.from_url` when ``url``
  is given (``redis://``, ``rediss://`` for TLS, ``unix://``), else
  :class:`redis.Redis` from ``host`` / ``port`` / ``db``;
- ``mode: "cluster"``: :class:`redis.cluster.RedisCluster` (``url`` or
  ``host`` / ``port`` name any one node; the client discovers the rest);
- ``mode: "sentinel"``: :class:`redis.sentinel.Sentinel` over ``sentinels``,
  and its ``master_for(service_name)`` client (which follows failovers).

The keyword keys (``username``, ``password``, ``ssl_*``, timeouts,
``max_connections``) are passed along with ``url`` the way redis-py's
``from_url`` takes them; a value given both in the URL and as a key is
refused, so it is never ambiguous which one applies. Retries are redis-py's
:class:`redis.retry.Retry` with :class:`redis.backoff.ExponentialWithJitterBackoff`
(``retries`` attempts after the first, waits between ``retry_backoff_base_s``
and ``retry_backoff_cap_s``), so a dead server costs a request at most about
``(retries + 1) * socket_connect_timeout_s + retries * retry_backoff_cap_s``.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import Mapping
from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel
from tiering.core.policies.pin_records import MAX_PINNED_BYTES, pins_below_capacity
from tiering.core.policies.tenancy import TENANTS_KEY
from tiering.core.redact import Redactor
from tiering.core.schema import ConfigKey, ConfigSchema
from tiering.redis.layout import check_prefix

MODES = ("standalone", "cluster", "sentinel")
EVICTION = ("server", "tier", "process")
CERT_REQS = ("required", "optional", "none")
URL_SCHEMES = ("redis", "rediss", "unix")


def _check_url(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in URL_SCHEMES:
        return f"must start with {', '.join(s + '://' for s in URL_SCHEMES)}"
    return None


def _check_sentinels(value: list[Any]) -> str | None:
    for item in value:
        ok = (
            isinstance(item, (list, tuple))
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], int)
            and not isinstance(item[1], bool)
        )
        if not ok:
            return 'must be a list of ["host", port] pairs'
    return None


def _check_file(path: str) -> str | None:
    return None if os.path.isfile(path) else "names no file"


def _cross_check(v: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first combination of keys that cannot work, as ``(key, problem)``."""
    mode = v["mode"]
    if mode == "sentinel":
        if not v["sentinels"]:
            return "sentinels", 'is required with mode "sentinel"'
        if not v["service_name"]:
            return "service_name", 'is required with mode "sentinel"'
        if v["url"] or v["host"] or v["port"]:
            return "url", 'mode "sentinel" finds the master through "sentinels"; drop url / host / port'
    else:
        for key in ("sentinels", "service_name", "sentinel_username", "sentinel_password"):
            if v[key] is not None:
                return key, 'applies only with mode "sentinel"'
    if mode == "cluster" and v["db"] not in (None, 0):
        return "db", "Redis Cluster has only database 0"
    url = v["url"]
    if url:
        parts = urllib.parse.urlsplit(url)
        given = {
            "host": parts.hostname,
            "port": parts.port if parts.scheme != "unix" else None,
            "username": parts.username,
            "password": parts.password,
            "db": parts.path.strip("/") or urllib.parse.parse_qs(parts.query).get("db"),
        }
        for key, in_url in given.items():
            if key in ("host", "port") and v[key] is not None:
                return key, "is given by url; set one of them"
            if in_url and v[key] is not None:
                return key, "is also given inside url; set one of them"
        if mode == "cluster" and parts.scheme == "unix":
            return "url", "Redis Cluster needs a redis:// or rediss:// url"
    if v["eviction"] != "server" and v["capacity_bytes"] is None:
        return (
            "capacity_bytes",
            f'is required with eviction "{v["eviction"]}" (the tier is then the eviction authority)',
        )
    if v["eviction"] == "server" and v["capacity_bytes"] is not None:
        return "capacity_bytes", (
            'applies only with eviction "tier" or "process"; with "server" set maxmemory on the server'
        )
    if v["retry_backoff_cap_s"] < v["retry_backoff_base_s"]:
        return "retry_backoff_cap_s", "must be >= retry_backoff_base_s"
    return None


SCHEMA = ConfigSchema(
    "redis",
    [
        ConfigKey("url", (str,), nullable=True, non_empty=True, check=_check_url, secret=False,
                  doc="redis://[user[:password]@]host:port/db, rediss:// (TLS) or unix:///path; "
                  "the password part is never shown"),
        ConfigKey("mode", (str,), default="standalone", choices=MODES,
                  doc="standalone, cluster (RedisCluster) or sentinel (Sentinel.master_for)"),
        ConfigKey("host", (str,), nullable=True, non_empty=True, doc="server host when no url (default 127.0.0.1)"),
        ConfigKey("port", (int,), nullable=True, minimum=1, maximum=65535, doc="server port when no url (6379)"),
        ConfigKey("db", (int,), nullable=True, minimum=0, doc="database number (standalone / sentinel; 0)"),
        ConfigKey("username", (str,), nullable=True, non_empty=True, doc="ACL user name"),
        ConfigKey("password", (str,), nullable=True, non_empty=True, secret=True, doc="password (ACL or requirepass)"),
        ConfigKey("sentinels", (list,), nullable=True, non_empty=True, check=_check_sentinels,
                  doc='mode sentinel: [["host", port], ...] of the sentinels'),
        ConfigKey("service_name", (str,), nullable=True, non_empty=True, doc="mode sentinel: the monitored master"),
        ConfigKey("sentinel_username", (str,), nullable=True, non_empty=True, doc="ACL user of the sentinels"),
        ConfigKey("sentinel_password", (str,), nullable=True, non_empty=True, secret=True,
                  doc="password of the sentinels"),
        ConfigKey("ssl", (bool,), default=False, doc="TLS (also implied by a rediss:// url)"),
        ConfigKey("ssl_ca_certs", (str,), nullable=True, non_empty=True, check=_check_file,
                  doc="PEM CA bundle verifying the server"),
        ConfigKey("ssl_certfile", (str,), nullable=True, non_empty=True, check=_check_file,
                  doc="client certificate (mutual TLS)"),
        ConfigKey("ssl_keyfile", (str,), nullable=True, non_empty=True, check=_check_file,
                  doc="client key (mutual TLS)"),
        ConfigKey("ssl_cert_reqs", (str,), default="required", choices=CERT_REQS,
                  doc="server certificate check: required, optional, none (test servers only)"),
        ConfigKey("ssl_check_hostname", (bool,), default=True, doc="check the certificate's host name"),
        ConfigKey("socket_timeout_s", (float,), duration=True, default=5.0, minimum=0, exclusive_minimum=True,
                  doc="seconds a command may wait for its reply"),
        ConfigKey("socket_connect_timeout_s", (float,), duration=True, default=2.0, minimum=0, exclusive_minimum=True,
                  doc="seconds to open a connection"),
        ConfigKey("retries", (int,), default=2, minimum=0, maximum=20,
                  doc="retries of a command after a connection error or timeout (redis-py Retry)"),
        ConfigKey("retry_backoff_base_s", (float,), duration=True, default=0.05, minimum=0, exclusive_minimum=True,
                  doc="first backoff wait (ExponentialWithJitterBackoff base)"),
        ConfigKey("retry_backoff_cap_s", (float,), duration=True, default=0.5, minimum=0, exclusive_minimum=True,
                  doc="longest backoff wait"),
        ConfigKey("health_check_interval_s", (float,), duration=True, default=0.0, minimum=0,
                  doc="PING an idle connection before use after this many seconds (0: off)"),
        ConfigKey("max_connections", (int,), default=8, minimum=1, maximum=512,
                  doc="connections (per node) and I/O threads"),
        ConfigKey("pipeline_blocks", (int,), default=8, minimum=1, maximum=4096,
                  doc="blocks per pipeline (one round trip per node)"),
        ConfigKey("prefix", (str,), default="tiering", check=check_prefix, doc="key prefix (no hash tags)"),
        ConfigKey("ttl_s", (int,), nullable=True, minimum=1, duration=True,
                  doc="expire blocks after this many seconds (SET EX)"),
        ConfigKey("eviction", (str,), default="server", choices=EVICTION,
                  doc="eviction authority: server (maxmemory + allkeys-lru), tier (capacity_bytes for the whole "
                      "fleet, a shared LRU on the server) or process (capacity_bytes per process)"),
        ConfigKey("capacity_bytes", (int,), nullable=True, minimum=1, size=True,
                  doc="eviction tier: bytes the fleet keeps in this namespace; process: bytes this process keeps "
                      "(headers included)"),
        ConfigKey("startup_scan", (bool,), default=True,
                  doc="at start and after a change of primary, SCAN the namespace's keys in the background to "
                      "learn what is stored"),
        ConfigKey("lookup_negative_ttl_s", (float,), duration=True, default=2.0, minimum=0, exclusive_minimum=True,
                  doc="seconds a 'not there' lookup answer is trusted (another replica may store it)"),
        MAX_PINNED_BYTES,
        TENANTS_KEY,
    ],
    checks=[_cross_check, pins_below_capacity],
)  # fmt: skip
"""Every key of a ``redis`` tier entry."""


@dataclasses.dataclass(frozen=True)
class RedisSettings:
    """A validated ``redis`` entry (``values``: every key of :data:`SCHEMA`, defaults filled in).

    Build with :meth:`from_config`; secrets are kept out of ``repr``.
    """

    values: Mapping[str, Any] = dataclasses.field(repr=False)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], entry: str | None = None) -> RedisSettings:
        """Validate an entry (``type`` / ``module_path`` ignored).

        Raises:
            tiering.core.schema.TierConfigError: a wrong, missing or unknown key; the
                message names it (never a secret's value).
        """
        return cls(SCHEMA.validate(config, entry))

    def __getitem__(self, name: str) -> Any:
        """The value of key ``name``."""
        return self.values[name]

    @property
    def secrets(self) -> list[str]:
        """The secret values configured (passwords, also one inside ``url``), for redaction."""
        out = [self.values[k] for k in SCHEMA.secret_keys if self.values.get(k)]
        url = self.values.get("url")
        if url:
            password = urllib.parse.urlsplit(url).password
            if password:
                out.append(password)
                out.append(urllib.parse.unquote(password))
        return out

    def redact(self, text: str) -> str:
        """``text`` without any configured secret or URL password (core's :class:`~tiering.core.redact.Redactor`)."""
        return Redactor(dict(self.values), SCHEMA.secret_keys, self.secrets)(text)

    def location(self) -> str:
        """Where the server is, without credentials: ``redis://host:port/db``, ``sentinel mymaster@h:p,...``."""
        v = self.values
        if v["mode"] == "sentinel":
            nodes = ",".join(f"{h}:{p}" for h, p in v["sentinels"] or ())
            return f"sentinel {v['service_name']}@{nodes}"
        if v["url"]:
            parts = urllib.parse.urlsplit(v["url"])
            netloc = parts.netloc.rpartition("@")[2]
            where = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        else:
            scheme = "rediss" if v["ssl"] else "redis"
            where = f"{scheme}://{v['host'] or '127.0.0.1'}:{v['port'] or 6379}/{v['db'] or 0}"
        return f"cluster {where}" if v["mode"] == "cluster" else where

    # -- the client -------------------------------------------------------------
    def retry(self) -> Retry:
        """redis-py's :class:`~redis.retry.Retry` of this entry (connection errors and timeouts)."""
        backoff = ExponentialWithJitterBackoff(cap=self["retry_backoff_cap_s"], base=self["retry_backoff_base_s"])
        return Retry(backoff, self["retries"])

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of redis-py's connection classes (timeouts, retry, credentials, TLS)."""
        v = self.values
        kwargs: dict[str, Any] = {
            "socket_timeout": v["socket_timeout_s"],
            "socket_connect_timeout": v["socket_connect_timeout_s"],
            "retry": self.retry(),
            "health_check_interval": v["health_check_interval_s"],
            "max_connections": v["max_connections"],
            "client_name": "tiering-redis",
        }
        for key in ("username", "password"):
            if v[key] is not None:
                kwargs[key] = v[key]
        if v["db"] is not None and v["mode"] != "cluster":
            kwargs["db"] = v["db"]
        tls = v["ssl"] or (v["url"] or "").startswith("rediss://")
        if tls:
            if not (v["url"] or "").startswith("rediss://"):
                kwargs["ssl"] = True
            kwargs["ssl_cert_reqs"] = v["ssl_cert_reqs"]
            kwargs["ssl_check_hostname"] = v["ssl_check_hostname"] and v["ssl_cert_reqs"] != "none"
            for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
                if v[key] is not None:
                    kwargs[key] = v[key]
        return kwargs

    def make_client(self) -> Any:
        """The redis-py client (no command is sent for standalone and Sentinel; Cluster reads its topology).

        Returns:
            :class:`redis.Redis` or :class:`redis.cluster.RedisCluster`.

        Raises:
            redis.exceptions.RedisError: the cluster's topology could not be read.
            redis.exceptions.RedisClusterException: the cluster does not serve every slot.
        """
        v = self.values
        kwargs = self.connection_kwargs()
        if v["mode"] == "sentinel":
            sentinel_kwargs = {
                "socket_timeout": v["socket_timeout_s"],
                "socket_connect_timeout": v["socket_connect_timeout_s"],
            }
            if v["sentinel_username"]:
                sentinel_kwargs["username"] = v["sentinel_username"]
            if v["sentinel_password"]:
                sentinel_kwargs["password"] = v["sentinel_password"]
            sentinel = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
                [(h, p) for h, p in v["sentinels"]], sentinel_kwargs=sentinel_kwargs
            )
            return sentinel.master_for(v["service_name"], **kwargs)  # type: ignore[no-untyped-call,unused-ignore]
        if v["mode"] == "cluster":
            kwargs.pop("health_check_interval")
            if v["url"]:
                return RedisCluster.from_url(v["url"], **kwargs)
            return RedisCluster(host=v["host"] or "127.0.0.1", port=v["port"] or 6379, **kwargs)
        if v["url"]:
            return redis.Redis.from_url(v["url"], **kwargs)
        return redis.Redis(host=v["host"] or "127.0.0.1", port=v["port"] or 6379, **kwargs)

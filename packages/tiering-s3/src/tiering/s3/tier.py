"""An S3 secondary tier on boto3: blocks are objects, I/O runs on a bounded thread pool.

Object layout under ``bucket``::

    <prefix>/<namespace digest>/namespace.json       all Namespace fields, clear text
    <prefix>/<namespace digest>/<shard>/<key hex>    one block: core header + payload

``<shard>`` is two hex digits of the XXH3-64 of the key (256 key prefixes,
spreading load over S3 partitions). A block object is
:func:`tiering.core.format.encode_header` followed by the primary slot's
bytes and is verified with :func:`tiering.core.format.verify_block` on every
load; an object that does not verify is a miss, is deleted, and is counted
by cause.

Every scheduler-facing method only touches in-memory state under one lock
and hands I/O to the pool; nothing on the caller's thread waits for S3.
Retries, timeouts and connection pooling are botocore's, configured through
:class:`botocore.config.Config`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from tiering.core.base import JobMetadata, JobResult, OffloadKey, ReqContext, SecondaryTierManager
from tiering.core.format import (
    HEADER_SIZE,
    BlockFormatError,
    TruncatedBlockError,
    checksum,
    encode_header,
    verify_block,
)
from tiering.core.inspection import TierInspector
from tiering.core.spec import OffloadingSpec
from tiering.s3.errors import (
    ERROR_CLASSES,
    Redactor,
    S3StartupError,
    classify_error,
    error_code,
    http_status,
)

logger = logging.getLogger(__name__)

ADDRESSING_STYLES = ("auto", "path", "virtual")
RETRY_MODES = ("standard", "adaptive", "legacy")
CHECKSUM_MODES = ("when_supported", "when_required")
NEGATIVE_LOOKUP_TTL_S = 5.0
"""How long a HEAD that found nothing answers ``lookup`` with False before asking again."""
DELETE_BATCH = 1000
"""Keys per DeleteObjects request (the S3 maximum)."""
NAMESPACE_OBJECT = "namespace.json"
PROBE_PREFIX = ".probe-"
"""Name start of the startup probe object ``<prefix>/<digest>/.probe-<32 hex>`` (written and deleted at once)."""
_HEX = frozenset("0123456789abcdef")
_STAT_NAMES = (
    "lookups_hit",
    "lookups_miss",
    "lookups_pending",
    "heads_sent",
    "heads_skipped",
    "blocks_stored",
    "bytes_stored",
    "stores_already_present",
    "stores_failed",
    "stores_rejected_capacity",
    "blocks_loaded",
    "bytes_loaded",
    "loads_failed",
    "loads_missing",
    "corrupt_truncated",
    "corrupt_checksum",
    "corrupt_foreign",
    "evictions",
    "delete_requests",
    "objects_deleted",
    "delete_failures",
    "startup_listed_blocks",
)


def _check_str(name: str, value: Any, *, allow_none: bool = True, choices: Sequence[str] = ()) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, str) or not value:
        raise ValueError(f"s3 tier: config key {name!r} must be a non-empty string, got {type(value).__name__}")
    if choices and value not in choices:
        raise ValueError(f"s3 tier: config key {name!r} is {value!r}; allowed: {', '.join(map(repr, choices))}")


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
        bound = f">= {minimum}" + (f" and <= {maximum}" if maximum else "")
        raise ValueError(f"s3 tier: config key {name!r} must be an integer {bound}, got {value!r}")


def _check_seconds(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"s3 tier: config key {name!r} must be a number of seconds > 0, got {value!r}")


def parse_block_name(base: str, name: str) -> bytes | None:
    """The key of a block object named ``name`` under ``base`` (``<prefix>/<digest>``), else None.

    Only ``<base>/<shard>/<key hex>`` whose shard is the one :meth:`S3SecondaryTierManager.object_key`
    gives the key is a block object; anything else (``namespace.json``, probe objects, foreign
    objects) answers None.
    """
    if not name.startswith(base + "/"):
        return None
    rest = name[len(base) + 1 :]
    shard, _, keyhex = rest.partition("/")
    if len(shard) != 2 or not keyhex or len(keyhex) % 2 or not set(keyhex) <= _HEX:
        return None
    key = bytes.fromhex(keyhex)
    return key if f"{checksum(key) & 0xFF:02x}" == shard else None


@dataclasses.dataclass(frozen=True)
class ConnectionSettings:
    """The keys of an ``s3`` tier entry that say where the bucket is and how to talk to it.

    Shared by the tier and its offline inspector (:mod:`tiering.s3.inspection`), so both
    validate the same keys alike, build the same client and classify startup failures the
    same way. The credentials are kept out of ``repr``. Fields: the constructor keys of
    :class:`S3SecondaryTierManager` of the same names (whose defaults are the only ones).
    """

    bucket: str | None
    prefix: str
    endpoint_url: str | None
    region_name: str | None
    addressing_style: str
    aws_access_key_id: str | None = dataclasses.field(repr=False)
    aws_secret_access_key: str | None = dataclasses.field(repr=False)
    aws_session_token: str | None = dataclasses.field(repr=False)
    profile_name: str | None
    ca_bundle: str | None
    verify: bool
    max_concurrency: int
    retry_mode: str
    max_attempts: int
    connect_timeout: float
    read_timeout: float
    request_checksum_calculation: str | None
    response_checksum_validation: str | None

    @property
    def redact(self) -> Redactor:
        """A redactor of the configured secrets."""
        return Redactor([self.aws_access_key_id, self.aws_secret_access_key, self.aws_session_token])

    @property
    def bucket_name(self) -> str:
        """The bucket (call :meth:`validate` first)."""
        if not isinstance(self.bucket, str) or not self.bucket:
            raise ValueError("s3 tier: config key 'bucket' is required")
        return self.bucket

    @property
    def normalized_prefix(self) -> str:
        """The prefix without empty parts (no leading, trailing or doubled ``/``)."""
        return "/".join(part for part in self.prefix.split("/") if part)

    def validate(self) -> None:
        """Check every value's type and range.

        Raises:
            ValueError: a wrong value; the message names the key (never a secret's value).
        """
        if self.bucket is None:
            raise ValueError("s3 tier: config key 'bucket' is required")
        _check_str("bucket", self.bucket, allow_none=False)
        if not isinstance(self.prefix, str):
            raise ValueError(f"s3 tier: config key 'prefix' must be a string, got {type(self.prefix).__name__}")
        endpoint_url = self.endpoint_url
        _check_str("endpoint_url", endpoint_url)
        if endpoint_url is not None and not endpoint_url.startswith(("http://", "https://")):
            raise ValueError(
                f"s3 tier: config key 'endpoint_url' must start with http:// or https://, got {endpoint_url!r}"
            )
        _check_str("region_name", self.region_name)
        _check_str("addressing_style", self.addressing_style, allow_none=False, choices=ADDRESSING_STYLES)
        for name, secret in (
            ("aws_access_key_id", self.aws_access_key_id),
            ("aws_secret_access_key", self.aws_secret_access_key),
            ("aws_session_token", self.aws_session_token),
        ):
            if secret is not None and (not isinstance(secret, str) or not secret):
                raise ValueError(f"s3 tier: config key {name!r} must be a non-empty string")
        if (self.aws_access_key_id is None) != (self.aws_secret_access_key is None):
            raise ValueError("s3 tier: 'aws_access_key_id' and 'aws_secret_access_key' must be given together")
        _check_str("profile_name", self.profile_name)
        _check_str("ca_bundle", self.ca_bundle)
        if not isinstance(self.verify, bool):
            raise ValueError(f"s3 tier: config key 'verify' must be true or false, got {self.verify!r}")
        if self.ca_bundle is not None:
            if not self.verify:
                raise ValueError("s3 tier: 'ca_bundle' is set but 'verify' is false; set one or the other")
            if not os.path.isfile(self.ca_bundle):
                raise ValueError(f"s3 tier: config key 'ca_bundle' names {self.ca_bundle!r}, which is not a file")
        _check_int("max_concurrency", self.max_concurrency, 1, 1024)
        _check_str("retry_mode", self.retry_mode, allow_none=False, choices=RETRY_MODES)
        _check_int("max_attempts", self.max_attempts, 1, 100)
        _check_seconds("connect_timeout", self.connect_timeout)
        _check_seconds("read_timeout", self.read_timeout)
        _check_str("request_checksum_calculation", self.request_checksum_calculation, choices=CHECKSUM_MODES)
        _check_str("response_checksum_validation", self.response_checksum_validation, choices=CHECKSUM_MODES)

    def make_client(self, max_pool_connections: int) -> Any:
        """A boto3 S3 client configured through :class:`botocore.config.Config` (no request is sent).

        Raises:
            S3StartupError: botocore refused the configuration (e.g. an unknown profile).
        """
        default_checksum = "when_required" if self.endpoint_url else "when_supported"
        config = Config(
            region_name=self.region_name,
            max_pool_connections=max_pool_connections,
            retries={"mode": self.retry_mode, "total_max_attempts": self.max_attempts},
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            s3={"addressing_style": self.addressing_style},
            request_checksum_calculation=self.request_checksum_calculation or default_checksum,
            response_checksum_validation=self.response_checksum_validation or default_checksum,
        )
        try:
            session = boto3.session.Session(
                aws_access_key_id=self.aws_access_key_id,
                aws_secret_access_key=self.aws_secret_access_key,
                aws_session_token=self.aws_session_token,
                profile_name=self.profile_name,
                region_name=self.region_name,
            )
            return session.client(
                "s3",
                endpoint_url=self.endpoint_url,
                verify=self.ca_bundle if self.ca_bundle else self.verify,
                config=config,
            )
        except BotoCoreError as exc:
            raise S3StartupError(
                f"s3 tier: cannot create the S3 client: {self.redact(exc)}", classify_error(exc)
            ) from None

    def check_bucket(self, client: Any, list_prefix: str) -> None:
        """``HeadBucket``; on 403, a one-key ``ListObjectsV2`` of ``list_prefix`` tells credentials from permissions.

        Raises:
            S3StartupError: see :meth:`startup_error`.
        """
        try:
            client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if http_status(exc) == 403:
                # HEAD responses carry no error code: ask again with a GET to learn
                # whether the credentials or the permissions are at fault.
                try:
                    client.list_objects_v2(Bucket=self.bucket, Prefix=list_prefix, MaxKeys=1)
                except (ClientError, BotoCoreError) as inner:
                    raise self.startup_error("ListObjectsV2", inner, client, list_prefix) from None
            raise self.startup_error("HeadBucket", exc, client, list_prefix) from None
        except BotoCoreError as exc:
            raise self.startup_error("HeadBucket", exc, client, list_prefix) from None

    def startup_error(
        self, what: str, exc: BaseException, client: Any, scope: str, action: str = "startup probe"
    ) -> S3StartupError:
        """An :class:`S3StartupError` saying what is wrong (endpoint, bucket, region, credentials, ...).

        Args:
            what: the request that failed (``"HeadBucket"``), for the message.
            exc: what it raised.
            client: the client that sent it (its region is named on a region mismatch).
            scope: the keys it concerned (``"<prefix>/<digest>/"``), named on access denied.
            action: what was under way, for the message of an unclassified failure.
        """
        where = f"endpoint {self.endpoint_url!r}" if self.endpoint_url else "AWS"
        code, status, cls = error_code(exc), http_status(exc), classify_error(exc)
        detail = self.redact(exc)
        if isinstance(exc, NoCredentialsError):
            return S3StartupError(
                "s3 tier: no credentials found in boto3's default chain (environment, shared config files, "
                "instance or container role); set aws_access_key_id / aws_secret_access_key or profile_name",
                "credentials",
            )
        if cls == "credentials":
            return S3StartupError(
                f"s3 tier: credentials were rejected by {where} during {what} ({code or type(exc).__name__}): "
                "check aws_access_key_id / aws_secret_access_key / aws_session_token / profile_name "
                "or the environment's AWS credentials",
                "credentials",
            )
        if cls == "tls":
            return S3StartupError(
                f"s3 tier: TLS certificate verification of {where} failed during {what}: {detail}; "
                "check 'ca_bundle' (or 'verify')",
                "tls",
            )
        if cls == "timeout":
            return S3StartupError(f"s3 tier: {where} did not answer in time during {what}: {detail}", "timeout")
        if cls == "connection":
            return S3StartupError(
                f"s3 tier: cannot reach {where} during {what}: {detail}; check 'endpoint_url' and the network",
                "endpoint",
            )
        if code in ("NoSuchBucket", "404", "NotFound") or status == 404:
            return S3StartupError(
                f"s3 tier: bucket {self.bucket!r} does not exist at {where} (HTTP {status or code}); check 'bucket'",
                "bucket",
            )
        if status == 301 or code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraint"):
            headers = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPHeaders", {})
            actual = headers.get("x-amz-bucket-region", "another region")
            return S3StartupError(
                f"s3 tier: bucket {self.bucket!r} is in {actual}, not the configured region "
                f"{client.meta.region_name!r}; check 'region_name'",
                "region",
            )
        if cls == "access_denied":
            return S3StartupError(
                f"s3 tier: access denied to s3://{self.bucket}/{scope} at {where} during {what} "
                f"({code or status}): the credentials are valid but lack permission "
                "(s3:ListBucket, s3:GetObject, s3:PutObject, s3:DeleteObject needed)",
                "permission",
            )
        return S3StartupError(f"s3 tier: {action} failed at {where} during {what}: {detail}", "other")


class _Job:
    """Bookkeeping of one submitted job: blocks left and whether all succeeded."""

    __slots__ = ("job_id", "keys", "loaded", "ok", "remaining")

    def __init__(self, job_id: int, keys: Sequence[OffloadKey], is_load: bool) -> None:
        self.job_id = job_id
        self.keys = keys
        self.remaining = len(keys)
        self.ok = True
        self.loaded: set[bytes] | None = set() if is_load else None


class S3SecondaryTierManager(SecondaryTierManager):
    """A secondary tier that keeps blocks as objects in an S3 (or S3-compatible) bucket.

    Config (the ``secondary_tiers`` entry): ``{"type": "s3", "bucket": "b",
    ...}``; every key is documented in the package README and below.

    Args:
        offloading_spec: the stack's spec (block geometry, namespace).
        primary_kv_view: the primary tier's ``(num_blocks, block_bytes)`` host buffer.
        tier_type: the registered name (injected by the factory).
        bucket: the bucket name (required; must exist).
        prefix: key prefix inside the bucket (``"kv/tenantA"``); leading and
            trailing ``/`` are ignored. Nothing outside it is read or written.
        endpoint_url: ``http(s)://host:port`` of a non-AWS server; None: AWS.
        region_name: the bucket's region; None: boto3's default chain.
        addressing_style: ``"auto"``, ``"path"`` or ``"virtual"``.
        aws_access_key_id: explicit access key id; None: boto3's default
            chain (environment, profile, instance role). Never logged or shown.
        aws_secret_access_key: the secret of ``aws_access_key_id``. Never logged or shown.
        aws_session_token: the session token of temporary credentials. Never logged or shown.
        profile_name: a profile of the shared AWS config files.
        ca_bundle: path of a PEM CA bundle to verify the endpoint's TLS certificate.
        verify: False turns TLS certificate verification off (test servers only).
        max_concurrency: worker threads, and botocore ``max_pool_connections``.
        retry_mode: botocore retry mode: ``"standard"``, ``"adaptive"`` or ``"legacy"``.
        max_attempts: total attempts per request, first one included (>= 1).
        connect_timeout: seconds to open a connection.
        read_timeout: seconds to wait for bytes on an open connection.
        request_checksum_calculation: ``"when_supported"`` or
            ``"when_required"``; None: ``when_required`` with a custom
            ``endpoint_url``, ``when_supported`` on AWS.
        response_checksum_validation: same values and default.
        capacity_bytes: cap on the bytes of this tier's objects (headers
            included); None: unbounded. Least recently used blocks are evicted.
        head_fallback: on an index miss, ask the server with HEAD (other
            writers share the prefix); ``lookup`` answers None meanwhile.

    Raises:
        ValueError: a config value has the wrong type or range (the message names the key).
        S3StartupError: the startup probe failed (wrong endpoint, bucket,
            region, credentials, permissions or TLS); the message says which.
    """

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        bucket: str | None = None,
        prefix: str = "",
        endpoint_url: str | None = None,
        region_name: str | None = None,
        addressing_style: str = "auto",
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        profile_name: str | None = None,
        ca_bundle: str | None = None,
        verify: bool = True,
        max_concurrency: int = 16,
        retry_mode: str = "standard",
        max_attempts: int = 3,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        request_checksum_calculation: str | None = None,
        response_checksum_validation: str | None = None,
        capacity_bytes: int | None = None,
        head_fallback: bool = True,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        self._conn = conn = ConnectionSettings(
            bucket=bucket,
            prefix=prefix,
            endpoint_url=endpoint_url,
            region_name=region_name,
            addressing_style=addressing_style,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
            profile_name=profile_name,
            ca_bundle=ca_bundle,
            verify=verify,
            max_concurrency=max_concurrency,
            retry_mode=retry_mode,
            max_attempts=max_attempts,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            request_checksum_calculation=request_checksum_calculation,
            response_checksum_validation=response_checksum_validation,
        )
        self._redact = conn.redact
        conn.validate()
        self.object_bytes = HEADER_SIZE + self.block_bytes
        if capacity_bytes is not None:
            _check_int("capacity_bytes", capacity_bytes, self.object_bytes)
        if not isinstance(head_fallback, bool):
            raise ValueError(f"s3 tier: config key 'head_fallback' must be true or false, got {head_fallback!r}")

        self.bucket = conn.bucket_name
        self.prefix = conn.normalized_prefix
        self.endpoint_url = endpoint_url
        self.capacity_bytes = capacity_bytes
        self.head_fallback = head_fallback
        self.max_concurrency = max_concurrency
        namespace = offloading_spec.namespace
        self._namespace = namespace
        self._digest = namespace.digest_bytes
        self.base = f"{self.prefix}/{namespace.digest}" if self.prefix else namespace.digest
        self._client: Any = conn.make_client(max_concurrency + 1)  # + the deleter thread

        # -- state, all guarded by self._lock ---------------------------------
        self._lock = threading.Lock()
        self._index: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # key -> size, LRU first
        self._used = 0  # bytes of index entries + reservations
        self._reserved: dict[bytes, int] = {}  # stores in flight: key -> reserved bytes
        self._store_refs: collections.Counter[bytes] = collections.Counter()
        self._store_ok: set[bytes] = set()
        self._loading: collections.Counter[bytes] = collections.Counter()  # pins against eviction
        self._heads: dict[bytes, float | None] = {}  # None: HEAD in flight; float: absent since
        self._heads_inflight = 0
        self._delete_queue: dict[bytes, str] = {}  # key -> reason, not yet sent
        self._deleting: dict[bytes, threading.Event] = {}  # queued or in flight; set when done
        self._delete_scheduled = False
        self._jobs: dict[int, _Job] = {}
        self._finished: list[JobResult] = []
        self._closed = False
        self._stats: collections.Counter[str] = collections.Counter()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix="tiering-s3")
        self._deleter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tiering-s3-delete")
        self.conditional_put_supported = True

        started = time.monotonic()
        try:
            self._probe(region_name)
            listed = self._rebuild_index()
        except BaseException:
            self._executor.shutdown(wait=False)
            self._deleter.shutdown(wait=False)
            self._client.close()
            raise
        self.startup_seconds = time.monotonic() - started
        with self._lock:
            self._make_room(0)
        logger.info(
            "s3 tier %r ready: s3://%s/%s (endpoint %s), %d blocks (%d bytes) found in %.2f s, capacity %s",
            tier_type,
            bucket,
            self.base,
            endpoint_url or "AWS",
            listed,
            self._used,
            self.startup_seconds,
            capacity_bytes if capacity_bytes is not None else "unbounded",
        )

    @classmethod
    def inspector(cls, tier_config: Mapping[str, Any]) -> TierInspector:
        """An :class:`~tiering.s3.inspection.S3Inspector` of a config entry's prefix (``tiering ls/gc/verify``)."""
        from tiering.s3.inspection import S3Inspector

        return S3Inspector.from_config(tier_config)

    # -- naming ------------------------------------------------------------
    def object_key(self, key: bytes) -> str:
        """The object key of block ``key``: ``<prefix>/<digest>/<shard>/<key hex>``."""
        return f"{self.base}/{checksum(key) & 0xFF:02x}/{key.hex()}"

    def _parse_object_key(self, name: str) -> bytes | None:
        return parse_block_name(self.base, name)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(bucket={self.bucket!r}, base={self.base!r}, "
            f"endpoint_url={self.endpoint_url!r}, capacity_bytes={self.capacity_bytes!r})"
        )

    # -- startup -----------------------------------------------------------
    def _startup_error(self, what: str, exc: BaseException) -> S3StartupError:
        return self._conn.startup_error(what, exc, self._client, f"{self.base}/")

    def _probe(self, region_name: str | None) -> None:
        client, bucket = self._client, self.bucket
        self._conn.check_bucket(client, self.base + "/")
        body = json.dumps(
            {**self._namespace.to_dict(), "digest": self._namespace.digest}, indent=1, sort_keys=True
        ).encode()
        probe_key = f"{self.base}/{PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            self._put_if_absent(f"{self.base}/{NAMESPACE_OBJECT}", body, content_type="application/json")
            client.put_object(Bucket=bucket, Key=probe_key, Body=b"probe", IfNoneMatch="*")
            try:
                client.put_object(Bucket=bucket, Key=probe_key, Body=b"probe", IfNoneMatch="*")
                self.conditional_put_supported = False
                logger.warning(
                    "s3 tier: the server ignores If-None-Match (conditional put); concurrent writers of one "
                    "key may overwrite each other (harmless: a key's bytes are fixed within a namespace)"
                )
            except ClientError as exc:
                if http_status(exc) != 412:
                    raise
            client.delete_object(Bucket=bucket, Key=probe_key)
        except (ClientError, BotoCoreError) as exc:
            raise self._startup_error("the write/delete probe", exc) from None

    def _put_if_absent(self, name: str, body: bytes, content_type: str = "application/octet-stream") -> bool:
        """PUT ``body`` at ``name`` unless an object exists; True when this call created it."""
        try:
            self._client.put_object(Bucket=self.bucket, Key=name, Body=body, IfNoneMatch="*", ContentType=content_type)
        except ClientError as exc:
            if http_status(exc) == 412 or error_code(exc) == "PreconditionFailed":
                return False
            raise
        return True

    def _rebuild_index(self) -> int:
        entries: list[tuple[float, bytes, int]] = []
        bad: list[bytes] = []
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.base + "/"):
                for obj in page.get("Contents", ()):
                    key = self._parse_object_key(obj["Key"])
                    if key is None:
                        continue
                    if obj["Size"] != self.object_bytes:
                        bad.append(key)
                        continue
                    entries.append((obj["LastModified"].timestamp(), key, obj["Size"]))
        except (ClientError, BotoCoreError) as exc:
            raise self._startup_error("ListObjectsV2 of the namespace prefix", exc) from None
        entries.sort()
        with self._lock:
            for _, key, size in entries:
                self._index[key] = size
                self._used += size
            for key in bad:
                self._stats["corrupt_truncated"] += 1
                self._queue_delete(key, "bad_size")
        self._stats["startup_listed_blocks"] = len(entries)
        return len(entries)

    # -- capacity (call with the lock held) ----------------------------------
    def _make_room(self, need: int) -> bool:
        """Evict LRU, unpinned blocks until ``need`` more bytes fit; False if they cannot."""
        if self.capacity_bytes is None:
            return True
        if self._used + need <= self.capacity_bytes:
            return True
        victims = []
        freed = 0
        for key, size in self._index.items():
            if self._used - freed + need <= self.capacity_bytes:
                break
            if self._loading[key]:
                continue
            victims.append(key)
            freed += size
        if self._used - freed + need > self.capacity_bytes:
            return False
        for key in victims:
            self._used -= self._index.pop(key)
            self._stats["evictions"] += 1
            self._queue_delete(key, "eviction")
        return True

    def _index_add(self, key: bytes, size: int) -> None:
        if key in self._index:
            self._index.move_to_end(key)
            return
        self._index[key] = size
        self._used += size
        self._heads.pop(key, None)

    def _index_remove(self, key: bytes) -> None:
        size = self._index.pop(key, None)
        if size is not None:
            self._used -= size

    def _queue_delete(self, key: bytes, reason: str) -> None:
        self._delete_queue[key] = reason
        self._deleting.setdefault(key, threading.Event())
        self._heads.pop(key, None)
        if not self._delete_scheduled:
            self._delete_scheduled = True
            try:
                self._deleter.submit(self._delete_loop)
            except RuntimeError:  # shut down: shutdown() drains the queue itself
                self._delete_scheduled = False

    def _delete_loop(self) -> None:
        """Send queued deletes as DeleteObjects batches until the queue is empty (deleter thread)."""
        while True:
            with self._lock:
                batch = list(self._delete_queue)[:DELETE_BATCH]
                if not batch:
                    self._delete_scheduled = False
                    return
                for key in batch:
                    del self._delete_queue[key]
            self._delete_batch(batch)

    def _delete_batch(self, batch: list[bytes]) -> None:
        failed = len(batch)
        try:
            response = self._client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": self.object_key(k)} for k in batch], "Quiet": True},
            )
            errors = response.get("Errors", [])
            failed = len(errors)
            for err in errors[:3]:
                logger.warning("s3 tier: delete of %s failed: %s", err.get("Key"), err.get("Code"))
        except BaseException as exc:
            self._count_error(exc, f"DeleteObjects of {len(batch)} keys")
        finally:
            with self._lock:
                self._stats["delete_requests"] += 1
                self._stats["objects_deleted"] += len(batch) - failed
                self._stats["delete_failures"] += failed
                for key in batch:
                    event = self._deleting.pop(key, None)
                    if event is not None:
                        event.set()

    # -- error accounting ----------------------------------------------------
    def _count_error(self, exc: BaseException, what: str) -> str:
        cls = classify_error(exc)
        with self._lock:
            self._stats[f"errors_{cls}"] += 1
        if cls == "other":
            logger.error("s3 tier: %s failed: %s", what, self._redact(repr(exc)))
        else:
            logger.warning("s3 tier: %s failed (%s): %s", what, cls, self._redact(exc))
        return cls

    # -- the contract ----------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """Whether ``key`` is stored: from the in-memory index, else a background HEAD.

        Returns:
            True: present (in the index). False: absent (or evicted, or the
            tier is shut down). None: a store of it or a HEAD probe is in
            flight; ask again.
        """
        with self._lock:
            if self._closed:
                return False
            if key in self._index:
                self._index.move_to_end(key)
                self._stats["lookups_hit"] += 1
                return True
            if key in self._reserved:
                self._stats["lookups_pending"] += 1
                return None
            if key in self._deleting or not self.head_fallback:
                self._stats["lookups_miss"] += 1
                return False
            state = self._heads.get(key, float("-inf"))
            if state is None:
                self._stats["lookups_pending"] += 1
                return None
            now = time.monotonic()
            if now - state < NEGATIVE_LOOKUP_TTL_S:
                self._stats["lookups_miss"] += 1
                return False
            if len(self._heads) > 100_000:
                self._heads = {k: v for k, v in self._heads.items() if v is None or now - v < NEGATIVE_LOOKUP_TTL_S}
            if self._heads_inflight >= 4 * self.max_concurrency:
                self._stats["lookups_miss"] += 1
                self._stats["heads_skipped"] += 1
                return False
            self._heads[key] = None
            self._heads_inflight += 1
            self._stats["lookups_pending"] += 1
            self._stats["heads_sent"] += 1
        try:
            self._executor.submit(self._head, key)
        except RuntimeError:  # shut down concurrently
            with self._lock:
                self._heads.pop(key, None)
                self._heads_inflight -= 1
            return False
        return None

    def _head(self, key: bytes) -> None:
        found: int | None = None
        try:
            if not self._closed:
                response = self._client.head_object(Bucket=self.bucket, Key=self.object_key(key))
                found = int(response["ContentLength"])
        except BaseException as exc:
            if classify_error(exc) != "not_found":
                self._count_error(exc, "HEAD")
        finally:
            with self._lock:
                self._heads_inflight -= 1
                if found == self.object_bytes and key not in self._deleting:
                    self._index_add(key, found)
                    self._make_room(0)
                else:
                    self._heads[key] = time.monotonic()
                    if found is not None and found != self.object_bytes:
                        self._stats["corrupt_truncated"] += 1
                        self._queue_delete(key, "bad_size")

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` most recently used (eviction order)."""
        with self._lock:
            for key in keys:
                if key in self._index:
                    self._index.move_to_end(key)

    def _new_job(self, job: JobMetadata) -> _Job:
        tracker = _Job(job.job_id, job.keys, job.is_promotion)
        self._jobs[job.job_id] = tracker
        if not job.keys:
            self._finish_block(tracker, True)
        return tracker

    def _finish_block(self, tracker: _Job, ok: bool, key: bytes | None = None) -> None:
        """Record one block's outcome (lock held); report the job when its last block is done."""
        tracker.ok = tracker.ok and ok
        tracker.remaining -= 1
        if ok and tracker.loaded is not None and key is not None:
            tracker.loaded.add(key)
        if tracker.remaining <= 0:
            self._jobs.pop(tracker.job_id, None)
            successful = None
            if not tracker.ok and tracker.loaded:
                successful = [k for k in tracker.keys if k in tracker.loaded]
            self._finished.append(JobResult(tracker.job_id, tracker.ok, successful))

    def _spawn(self, tracker: _Job, fn: Callable[[bytes, int], bool], key: bytes, block_id: int) -> None:
        """Run ``fn(key, block_id)`` on the pool; any exception becomes a failed block, counted."""

        def run() -> None:
            ok = False
            try:
                ok = (not self._closed) and fn(key, block_id)
            except BaseException as exc:
                cause = self._count_error(exc, f"{fn.__name__.strip('_')} of block {key.hex()[:16]}")
                with self._lock:
                    self._stats[f"{'store' if fn == self._put else 'load'}_failed_{cause}"] += 1
            finally:
                with self._lock:
                    self._after_block(fn, key, ok)
                    self._finish_block(tracker, ok, key)

        try:
            self._executor.submit(run)
        except RuntimeError:  # shut down between the check and here
            with self._lock:
                self._after_block(fn, key, False)
                self._finish_block(tracker, False)

    def _after_block(self, fn: Callable[[bytes, int], bool], key: bytes, ok: bool) -> None:
        """Index bookkeeping after a PUT or GET (lock held)."""
        if fn == self._put:
            self._store_refs[key] -= 1
            if ok:
                self._store_ok.add(key)
            if self._store_refs[key] <= 0:
                del self._store_refs[key]
                reserved = self._reserved.pop(key, 0)
                self._used -= reserved
                if key in self._store_ok:
                    self._store_ok.discard(key)
                    self._index_add(key, self.object_bytes)
                    self._make_room(0)
                self._heads.pop(key, None)
            if not ok:
                self._stats["stores_failed"] += 1
        else:
            self._loading[key] -= 1
            if self._loading[key] <= 0:
                del self._loading[key]
            if ok:
                self._index_add(key, self.object_bytes)
            else:
                self._stats["loads_failed"] += 1

    def submit_store(self, job: JobMetadata) -> None:
        """Queue one conditional PUT per block not yet stored; return at once.

        A key already in the index counts as stored without I/O; a PUT
        answered 412 (another writer got there first) counts as stored. With
        ``capacity_bytes``, least recently used blocks are evicted to make
        room; a block that cannot fit (everything else pinned by loads) fails
        the job and is counted in ``stores_rejected_capacity``.
        """
        with self._lock:
            tracker = self._new_job(job)
            for key, block_id in zip(job.keys, job.block_ids, strict=True):
                if self._closed:
                    self._finish_block(tracker, False)
                    continue
                if key in self._index:
                    self._index.move_to_end(key)
                    self._stats["stores_already_present"] += 1
                    self._finish_block(tracker, True)
                    continue
                if key not in self._reserved:
                    if not self._make_room(self.object_bytes):
                        self._stats["stores_rejected_capacity"] += 1
                        self._stats["store_failed_no_space"] += 1
                        self._finish_block(tracker, False)
                        continue
                    self._reserved[key] = self.object_bytes
                    self._used += self.object_bytes
                self._store_refs[key] += 1
                self._spawn(tracker, self._put, key, block_id)

    def _put(self, key: bytes, block_id: int) -> bool:
        with self._lock:
            pending_delete = self._deleting.get(key)
        if pending_delete is not None:  # an eviction of this key is queued or in flight: let it finish
            pending_delete.wait()
        slot = self.block(block_id)
        body = b"".join((encode_header(self._digest, key, slot), slot))
        if self._put_if_absent(self.object_key(key), body):
            with self._lock:
                self._stats["blocks_stored"] += 1
                self._stats["bytes_stored"] += len(body)
        else:
            with self._lock:
                self._stats["stores_already_present"] += 1
        return True

    def submit_load(self, job: JobMetadata) -> None:
        """Queue one GET per block; each is verified before its bytes reach the slot.

        A missing, truncated, corrupt or foreign object fails the job; the
        object is deleted and the key answers False from then on.
        """
        with self._lock:
            tracker = self._new_job(job)
            for key, block_id in zip(job.keys, job.block_ids, strict=True):
                if self._closed or key in self._deleting:
                    self._stats["loads_failed"] += 1
                    self._finish_block(tracker, False)
                    continue
                if key in self._index:
                    self._index.move_to_end(key)
                self._loading[key] += 1
                self._spawn(tracker, self._get, key, block_id)

    def _get(self, key: bytes, block_id: int) -> bool:
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self.object_key(key))
        except ClientError as exc:
            if classify_error(exc) != "not_found":
                raise
            with self._lock:
                self._stats["loads_missing"] += 1
                self._stats["load_failed_missing"] += 1
                self._index_remove(key)
                self._heads[key] = time.monotonic()
            return False
        with response["Body"] as stream:
            data = stream.read()
        slot = self.block(block_id)
        view = memoryview(data)
        try:
            if len(data) != self.object_bytes:
                raise TruncatedBlockError(f"object is {len(data)} bytes, expected {self.object_bytes}")
            verify_block(view[:HEADER_SIZE], view[HEADER_SIZE:], self._digest, key, stored_size=len(data))
        except BlockFormatError as exc:
            logger.warning("s3 tier: block %s is unusable (%s): %s; deleting it", self.object_key(key), exc.reason, exc)
            with self._lock:
                self._stats[f"corrupt_{exc.reason}"] += 1
                self._stats[f"load_failed_{exc.reason}"] += 1
                self._index_remove(key)
                self._queue_delete(key, exc.reason)
                self._heads[key] = time.monotonic()  # absent for the negative-lookup TTL
            return False
        slot[:] = view[HEADER_SIZE:]
        with self._lock:
            self._stats["blocks_loaded"] += 1
            self._stats["bytes_loaded"] += len(data)
        return True

    def get_finished(self) -> Iterable[JobResult]:
        """The jobs finished since the last call; each job appears exactly once."""
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def has_pending_work(self) -> bool:
        """Whether any job is still in flight."""
        with self._lock:
            return bool(self._jobs)

    def stats(self) -> dict[str, int | float]:
        """Counters: lookups, blocks/bytes stored and loaded, evictions, corruption and errors by class.

        Keys: ``lookups_hit``, ``lookups_miss``, ``lookups_pending``,
        ``heads_sent``, ``heads_skipped``, ``blocks_stored``, ``bytes_stored``,
        ``stores_already_present``, ``stores_failed``,
        ``stores_rejected_capacity``, ``blocks_loaded``, ``bytes_loaded``,
        ``loads_failed``, ``loads_missing``, ``corrupt_truncated``,
        ``corrupt_checksum``, ``corrupt_foreign``, ``evictions``,
        ``delete_requests``, ``objects_deleted``, ``delete_failures``,
        ``errors_<class>`` for every class of
        :data:`tiering.s3.errors.ERROR_CLASSES`, ``resident_blocks``,
        ``resident_bytes``, ``capacity_bytes`` (0: unbounded),
        ``inflight_jobs``, ``inflight_stores``, ``inflight_loads``,
        ``startup_listed_blocks``, ``startup_seconds``,
        ``conditional_put_supported`` (1/0); and, per the core convention,
        ``store_failed_<cause>`` / ``load_failed_<cause>`` (blocks; cause: an
        error class, ``no_space``, ``missing``, ``checksum``, ``truncated``,
        ``foreign``), present once non-zero.
        """
        with self._lock:
            out: dict[str, int | float] = {name: self._stats[name] for name in _STAT_NAMES}
            out.update(
                {k: v for k, v in self._stats.items() if k.startswith(("corrupt_", "store_failed_", "load_failed_"))}
            )
            out.update({f"errors_{c}": self._stats[f"errors_{c}"] for c in ERROR_CLASSES})
            out["resident_blocks"] = len(self._index)
            out["resident_bytes"] = sum(self._index.values())
            out["capacity_bytes"] = self.capacity_bytes or 0
            out["inflight_jobs"] = len(self._jobs)
            out["inflight_stores"] = sum(self._store_refs.values())
            out["inflight_loads"] = sum(self._loading.values())
        out["startup_seconds"] = round(getattr(self, "startup_seconds", 0.0), 3)
        out["conditional_put_supported"] = int(self.conditional_put_supported)
        return out

    def shutdown(self) -> None:
        """Stop: queued blocks fail fast, running requests finish, queued deletes are sent; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.shutdown(wait=True)
        self._deleter.shutdown(wait=True)
        self._delete_loop()  # anything queued after the deleter stopped
        self._client.close()
        logger.info("s3 tier %r shut down: %s", self.tier_type, self.stats())

"""The one request path of the s3 tier: client construction and :meth:`S3Client.call`.

Every S3 request of the tier and of its inspector goes through
:meth:`S3Client.call` (after s3fs's single ``_call_s3``), which translates
botocore's exceptions once into :class:`~tiering.s3.errors.S3RequestError`
(error class, code, status; message redacted). Retries, timeouts and
connection pooling are botocore's, configured through
:class:`botocore.config.Config`.

:class:`ServerFeatures` is what the server supports of what the tier relies
on (conditional put, batch delete, credential checking): servers differ in
the field. :mod:`tiering.s3.probe` finds it at start-up; the client falls
back on the first refusal it meets.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import botocore.loaders
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tiering.s3.config import ConnectionSettings
from tiering.s3.errors import S3RequestError, S3StartupError, classify_error

logger = logging.getLogger(__name__)

DELETE_BATCH = 1000
"""Keys per DeleteObjects request (the S3 maximum)."""
LIST_PAGE = 1000
"""Keys per ListObjectsV2 page (the S3 maximum)."""
_REFUSALS = frozenset({"NotImplemented", "MethodNotAllowed", "InvalidRequest", "InvalidArgument", "501", "405"})
"""Error codes of a server that does not support a request or header (batch delete, If-None-Match)."""
_BATCH_DELETE_REFUSALS = frozenset({"MissingContentMD5"})
"""Error codes with which a server refuses ``DeleteObjects`` as botocore sends it (no ``Content-MD5``)."""


_LOADER_LOCK = threading.Lock()
_LOADER: list[botocore.loaders.Loader] = []


def _rearm_after_fork() -> None:
    # A thread building a client in the parent may have held the lock at fork time: the child's stack needs its own.
    global _LOADER_LOCK
    _LOADER_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_rearm_after_fork)


def shared_loader() -> botocore.loaders.Loader:
    """One botocore data loader per process: it caches the parsed service models.

    A fresh botocore session parses the S3 service model (JSON, about 0.5 s of
    CPU) for its first client; sharing the loader makes every later client
    cost milliseconds. Credentials stay per session (never shared).
    """
    with _LOADER_LOCK:
        if not _LOADER:
            _LOADER.append(botocore.loaders.create_loader())
        return _LOADER[0]


def new_boto_client(settings: ConnectionSettings, max_pool_connections: int) -> Any:
    """A botocore S3 client configured through :class:`botocore.config.Config` (no request is sent).

    Each client has its own session (its own credential chain); the parsed
    service models come from :func:`shared_loader`.

    Raises:
        S3StartupError: botocore refused the configuration (e.g. an unknown profile).
    """
    default_checksum = "when_required" if settings.endpoint_url else "when_supported"
    config = Config(
        region_name=settings.region_name,
        max_pool_connections=max_pool_connections,
        retries={"mode": settings.retry_mode, "total_max_attempts": settings.max_attempts},
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        s3={"addressing_style": settings.addressing_style},
        request_checksum_calculation=settings.request_checksum_calculation or default_checksum,
        response_checksum_validation=settings.response_checksum_validation or default_checksum,
    )
    try:
        session = botocore.session.Session(profile=settings.profile_name)
        session.register_component("data_loader", shared_loader())
        return session.create_client(
            "s3",
            region_name=settings.region_name,
            endpoint_url=settings.endpoint_url,
            verify=settings.ca_bundle if settings.ca_bundle else settings.verify,
            aws_access_key_id=settings.aws_access_key_id,
            aws_secret_access_key=settings.aws_secret_access_key,
            aws_session_token=settings.aws_session_token,
            config=config,
        )
    except BotoCoreError as exc:
        raise S3StartupError(
            f"s3 tier: cannot create the S3 client: {settings.redact(exc)}", classify_error(exc)
        ) from None


@dataclasses.dataclass(frozen=True)
class ServerFeatures:
    """What the server supports of the optional S3 features the tier uses (see :mod:`tiering.s3.probe`).

    Attributes:
        conditional_put: ``PutObject`` with ``If-None-Match: *`` is refused (412) when the
            object exists. Without it the tier writes unconditionally (harmless: a key's
            bytes are fixed within a namespace).
        batch_delete: ``DeleteObjects`` works. Without it the tier deletes one object per request.
        checks_credentials: a request signed with wrong credentials is refused. None: not probed.
    """

    conditional_put: bool = True
    batch_delete: bool = True
    checks_credentials: bool | None = None

    def describe(self) -> list[str]:
        """One line per feature, for ``tiering check --probe`` and the start-up log."""
        creds = {True: "checked", False: "NOT checked (any key is accepted)", None: "not probed"}
        return [
            "conditional put (If-None-Match): "
            + ("supported" if self.conditional_put else "ignored by the server; falling back to plain PUT"),
            "batch delete (DeleteObjects): "
            + ("supported" if self.batch_delete else "refused by the server; falling back to DeleteObject per key"),
            f"credentials: {creds[self.checks_credentials]}",
        ]


class S3Client:
    """A boto3 S3 client bound to one bucket; every request goes through :meth:`call`.

    Args:
        settings: validated connection settings.
        max_pool_connections: botocore's connection pool size (the worker threads that send requests).

    Raises:
        S3StartupError: botocore refused the configuration.
    """

    def __init__(self, settings: ConnectionSettings, max_pool_connections: int) -> None:
        self.settings = settings
        self.bucket = settings.bucket_name
        self.redact = settings.redact
        self.boto: Any = new_boto_client(settings, max_pool_connections)
        """The boto3 client (its ``meta.events`` take botocore event handlers)."""
        self.batch_delete = True
        """Whether DeleteObjects is used (False once the server refused it)."""
        self.conditional_put = True
        """Whether PUTs send ``If-None-Match: *`` (False once the server refused or ignored it)."""
        self.checks_credentials: bool | None = None
        """Whether the server checks credentials (None until :func:`tiering.s3.probe.probe_credentials`)."""

    def __repr__(self) -> str:
        return f"S3Client(bucket={self.bucket!r}, endpoint_url={self.settings.endpoint_url!r})"

    def call(self, op: str, **kwargs: Any) -> Any:
        """Send one request: ``boto3_client.<op>(Bucket=<bucket>, **kwargs)``; returns its response.

        Raises:
            S3RequestError: the request failed (after botocore's retries); translated here, once.
        """
        try:
            return getattr(self.boto, op)(Bucket=self.bucket, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise S3RequestError.from_botocore(op, exc, self.redact) from None

    # -- the requests, each through call() -------------------------------------------------
    def head(self, name: str) -> int | None:
        """``HeadObject``: the object's size in bytes, None when it does not exist.

        Raises:
            S3RequestError: any other failure.
        """
        try:
            return int(self.call("head_object", Key=name)["ContentLength"])
        except S3RequestError as exc:
            if exc.not_found:
                return None
            raise

    def get(self, name: str) -> bytes | None:
        """``GetObject``: the whole object, None when it does not exist.

        Raises:
            S3RequestError: any other failure (a broken stream included).
        """
        try:
            response = self.call("get_object", Key=name)
            with response["Body"] as stream:
                data: bytes = stream.read()
        except S3RequestError as exc:
            if exc.not_found:
                return None
            raise
        except (ClientError, BotoCoreError) as exc:  # raised while streaming the body
            raise S3RequestError.from_botocore("get_object", exc, self.redact) from None
        return data

    def put(self, name: str, body: bytes, *, if_absent: bool, content_type: str = "application/octet-stream") -> bool:
        """``PutObject``; with ``if_absent`` conditional (``If-None-Match: *``) while the server supports it.

        A server that refuses the header (501, 400 ``NotImplemented``...) switches this client to
        plain PUTs, with one warning, and the PUT is sent again without it.

        Returns:
            True when written; False when ``if_absent`` and the object existed (HTTP 412).

        Raises:
            S3RequestError: any other failure.
        """
        if if_absent and self.conditional_put:
            try:
                self.call("put_object", Key=name, Body=body, ContentType=content_type, IfNoneMatch="*")
                return True
            except S3RequestError as exc:
                if exc.precondition_failed:
                    return False
                if not self._refused(exc):
                    raise
                self.no_conditional_put("refuses")
        self.call("put_object", Key=name, Body=body, ContentType=content_type)
        return True

    def no_conditional_put(self, how: str) -> None:
        """Stop sending ``If-None-Match``: the server ``how`` (``"refuses"`` / ``"ignores"``) it; warns once."""
        if self.conditional_put:
            self.conditional_put = False
            logger.warning(
                "s3 tier: the server at %s %s If-None-Match (conditional put); falling back to plain PUT "
                "(concurrent writers of one key may overwrite each other: harmless, a key's bytes are fixed "
                "within a namespace)",
                self.settings.endpoint_url or "AWS",
                how,
            )

    @staticmethod
    def _refused(exc: S3RequestError) -> bool:
        return exc.code in _REFUSALS or exc.status in (405, 501)

    def delete_many(self, names: Sequence[str]) -> dict[str, str]:
        """Delete ``names`` (batches of :data:`DELETE_BATCH`; one request per key without batch delete).

        An object already gone counts as deleted. A server that refuses
        ``DeleteObjects`` (at any time, not only at start-up) switches this
        client to one ``DeleteObject`` per key, with one warning.

        Returns:
            The names that were NOT deleted -> the error code (empty when all went).
        """
        failed: dict[str, str] = {}
        for start in range(0, len(names), DELETE_BATCH):
            batch = names[start : start + DELETE_BATCH]
            batch_failed = self.delete_batch(batch) if self.batch_delete else None
            if batch_failed is not None:
                failed.update(batch_failed)
                continue
            for name in batch:
                code = self.delete_one(name)
                if code is not None:
                    failed[name] = code
        return failed

    def delete_or_refuse(self, names: Sequence[str]) -> dict[str, str] | None:
        """:meth:`delete_many` of at most :data:`DELETE_BATCH` names, but None when the server refuses them as a batch.

        Then nothing was deleted and the client sends one ``DeleteObject`` per key from now on: the caller sends
        them again, in parallel, rather than one after another here.
        """
        return self.delete_batch(names) if self.batch_delete and len(names) > 1 else self.delete_many(names)

    def delete_batch(self, names: Sequence[str]) -> dict[str, str] | None:
        """One ``DeleteObjects`` of up to :data:`DELETE_BATCH` ``names``.

        Returns:
            The names NOT deleted -> error code; None when the server refuses
            batch deletes (``NotImplemented``, 400 ``MissingContentMD5``...):
            the client has switched to :meth:`delete_one`, nothing was deleted.

        Raises:
            S3RequestError: the request failed otherwise.
        """
        try:
            response = self.call("delete_objects", Delete={"Objects": [{"Key": k} for k in names], "Quiet": True})
        except S3RequestError as exc:
            if not (self._refused(exc) or exc.code in _BATCH_DELETE_REFUSALS):
                raise
            self._no_batch_delete(exc)
            return None
        return {
            str(err.get("Key")): str(err.get("Code") or "error")
            for err in response.get("Errors", ())
            if err.get("Code") not in ("NoSuchKey", "404")
        }

    def delete_one(self, name: str) -> str | None:
        """One ``DeleteObject``; returns None when gone (already gone included), else the error code."""
        try:
            self.call("delete_object", Key=name)
        except S3RequestError as exc:
            if not exc.not_found:
                return exc.code or exc.error_class
        return None

    def _no_batch_delete(self, exc: S3RequestError) -> None:
        if self.batch_delete:
            self.batch_delete = False
            logger.warning(
                "s3 tier: the server at %s refuses DeleteObjects (%s); falling back to one DeleteObject per key",
                self.settings.endpoint_url or "AWS",
                exc.code or exc.status,
            )

    def list_pages(self, prefix: str, delimiter: str = "", page_size: int = LIST_PAGE) -> Iterator[dict[str, Any]]:
        """``ListObjectsV2`` pages under ``prefix`` (each a response dict with ``Contents`` / ``CommonPrefixes``).

        Raises:
            S3RequestError: a page request failed.
        """
        kwargs: dict[str, Any] = {"Prefix": prefix, "MaxKeys": page_size}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        while True:
            page = self.call("list_objects_v2", **kwargs)
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token

    def close(self) -> None:
        """Close the client's connections."""
        self.boto.close()

    def features(self) -> ServerFeatures:
        """What this client found so far (the start-up probe, and any refusal met since)."""
        return ServerFeatures(self.conditional_put, self.batch_delete, self.checks_credentials)

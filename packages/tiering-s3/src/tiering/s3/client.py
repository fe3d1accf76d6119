"""The one request path of the s3 tier: client construction, the bucket probe, and :meth:`S3Client.call`.

Every S3 request of the tier and of its inspector goes through
:meth:`S3Client.call` (after s3fs's single ``_call_s3``), which translates
botocore's exceptions once into :class:`~tiering.s3.errors.S3RequestError`
(error class, code, status; message redacted). Retries, timeouts and
connection pooling are botocore's, configured through
:class:`botocore.config.Config`.

:meth:`S3Client.probe_features` finds what the server supports of what the
tier relies on (conditional put, batch delete, credential checking): servers
differ in the field. The tier follows what the probe found.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import boto3
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


def new_boto_client(settings: ConnectionSettings, max_pool_connections: int) -> Any:
    """A boto3 S3 client configured through :class:`botocore.config.Config` (no request is sent).

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
        session = boto3.session.Session(
            aws_access_key_id=settings.aws_access_key_id,
            aws_secret_access_key=settings.aws_secret_access_key,
            aws_session_token=settings.aws_session_token,
            profile_name=settings.profile_name,
            region_name=settings.region_name,
        )
        return session.client(
            "s3",
            endpoint_url=settings.endpoint_url,
            verify=settings.ca_bundle if settings.ca_bundle else settings.verify,
            config=config,
        )
    except BotoCoreError as exc:
        raise S3StartupError(
            f"s3 tier: cannot create the S3 client: {settings.redact(exc)}", classify_error(exc)
        ) from None


@dataclasses.dataclass(frozen=True)
class ServerFeatures:
    """What the server supports of the optional S3 features the tier uses (found by :meth:`S3Client.probe_features`).

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
        """Whether the server checks credentials (None until :meth:`probe_credentials`)."""

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
        ``DeleteObjects`` itself switches this client to one ``DeleteObject``
        per key, with one warning.

        Returns:
            The names that were NOT deleted -> the error code (empty when all went).
        """
        failed: dict[str, str] = {}
        for start in range(0, len(names), DELETE_BATCH):
            batch = names[start : start + DELETE_BATCH]
            if self.batch_delete:
                try:
                    response = self.call(
                        "delete_objects", Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                    )
                except S3RequestError as exc:
                    if not self._refused(exc):
                        raise
                    self._no_batch_delete(exc)
                else:
                    for err in response.get("Errors", ()):
                        if err.get("Code") not in ("NoSuchKey", "404"):
                            failed[str(err.get("Key"))] = str(err.get("Code") or "error")
                    continue
            for name in batch:
                try:
                    self.call("delete_object", Key=name)
                except S3RequestError as exc:
                    if not exc.not_found:
                        failed[name] = exc.code or exc.error_class
        return failed

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

    # -- start-up --------------------------------------------------------------------------------
    def check_bucket(self, list_prefix: str) -> None:
        """``HeadBucket``; on 403, a one-key ``ListObjectsV2`` of ``list_prefix`` tells credentials from permissions.

        Raises:
            S3StartupError: see :meth:`startup_error`.
        """
        try:
            self.call("head_bucket")
        except S3RequestError as exc:
            if exc.status == 403:
                # HEAD responses carry no error code: ask again with a GET to learn
                # whether the credentials or the permissions are at fault.
                try:
                    self.call("list_objects_v2", Prefix=list_prefix, MaxKeys=1)
                except S3RequestError as inner:
                    raise self.startup_error("ListObjectsV2", inner, list_prefix) from None
            raise self.startup_error("HeadBucket", exc, list_prefix) from None

    def probe_features(self, probe_name: str) -> ServerFeatures:
        """Write ``probe_name`` twice with ``If-None-Match: *`` and delete it with ``DeleteObjects``.

        The second conditional PUT must be refused (412); a server that
        accepts it ignores conditional puts. A server that refuses
        ``DeleteObjects`` is asked with ``DeleteObject``. Each missing feature
        is logged once, naming the fallback.

        Raises:
            S3StartupError: a write or delete failed for another reason (permissions...).
        """
        try:
            self.put(probe_name, b"probe", if_absent=True)
            if self.conditional_put and self.put(probe_name, b"probe", if_absent=True):
                self.no_conditional_put("ignores")
            failed = self.delete_many([probe_name])
            if failed:
                raise S3RequestError(
                    "delete_objects", "other", failed[probe_name], 0, "DeleteError", f"delete refused: {failed}"
                )
        except S3RequestError as exc:
            raise self.startup_error("the write/delete probe", exc, probe_name.rpartition("/")[0] + "/") from None
        return self.features()

    def features(self) -> ServerFeatures:
        """What this client found so far (the probe, and any refusal met since)."""
        return ServerFeatures(self.conditional_put, self.batch_delete, self.checks_credentials)

    def probe_credentials(self) -> bool | None:
        """Whether the server refuses a request signed with made-up credentials (one ``HeadBucket``).

        Sets :attr:`checks_credentials` (None when the answer was neither: unreachable...). Never raises.
        """
        fake = dataclasses.replace(
            self.settings,
            aws_access_key_id="AKIATIERINGPROBE0000",
            aws_secret_access_key="tiering-credential-probe",
            aws_session_token=None,
            profile_name=None,
            max_attempts=1,
        )
        other = S3Client(fake, 1)
        try:
            other.call("head_bucket")
            self.checks_credentials = False
        except S3RequestError as exc:
            self.checks_credentials = True if exc.error_class in ("credentials", "access_denied") else None
        finally:
            other.close()
        return self.checks_credentials

    def startup_error(
        self, what: str, exc: S3RequestError, scope: str, action: str = "startup probe"
    ) -> S3StartupError:
        """An :class:`S3StartupError` saying what is wrong (endpoint, bucket, region, credentials, ...).

        Args:
            what: the request that failed (``"HeadBucket"``), for the message.
            exc: what it raised.
            scope: the keys it concerned (``"<prefix>/<digest>/"``), named on access denied.
            action: what was under way, for the message of an unclassified failure.
        """
        settings = self.settings
        where = f"endpoint {settings.endpoint_url!r}" if settings.endpoint_url else "AWS"
        code, status, cls, detail = exc.code, exc.status, exc.error_class, str(exc)
        if exc.no_credentials:
            return S3StartupError(
                "s3 tier: no credentials found in boto3's default chain (environment, shared config files, "
                "instance or container role); set aws_access_key_id / aws_secret_access_key or profile_name",
                "credentials",
            )
        if cls == "credentials":
            return S3StartupError(
                f"s3 tier: credentials were rejected by {where} during {what} ({code or exc.kind}): "
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
            return S3StartupError(
                f"s3 tier: bucket {self.bucket!r} is in {exc.bucket_region or 'another region'}, not the configured "
                f"region {self.boto.meta.region_name!r}; check 'region_name'",
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

"""Start-up checks of an s3 tier: bucket, credentials, optional server features; errors that say what is wrong.

The tier's medium (:class:`tiering.s3.medium.S3Medium`) and its inspector call these
once when they open a bucket; :func:`probe_entry` is ``tiering check
--probe`` (creates nothing: its one probe object is removed at once, no
``namespace.json`` is written). Every request goes through
:meth:`tiering.s3.client.S3Client.call`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

from tiering.s3.client import S3Client, ServerFeatures
from tiering.s3.config import SCHEMA, ConnectionSettings
from tiering.s3.errors import S3RequestError, S3StartupError
from tiering.s3.layout import PROBE_PREFIX


def probe_entry(tier_config: Mapping[str, Any]) -> str:
    """``tiering check --probe`` of an ``s3`` entry: bucket, credentials and features; creates nothing.

    Sends ``HeadBucket``, writes one probe object ``<prefix>/.probe-<32 hex>`` twice
    (conditional put) and deletes it (batch delete), then one ``HeadBucket`` signed with
    made-up credentials (whether the server checks them). No ``namespace.json`` is written.

    Returns:
        One line: where, and what was found (never a credential).

    Raises:
        TierConfigError: a wrong value or unknown key (a ``ValueError``; the message names the key).
        S3StartupError: the bucket cannot be used (an ``OSError``; the message says why).
    """
    settings = ConnectionSettings.from_entry(SCHEMA.validate(tier_config))
    settings.validate()
    prefix = settings.normalized_prefix
    root = f"{prefix}/" if prefix else ""
    client = S3Client(settings, 2)
    try:
        check_bucket(client, root)
        probe_features(client, f"{root}{PROBE_PREFIX}{uuid.uuid4().hex}")
        probe_credentials(client)
        found = "; ".join(client.features().describe())
    finally:
        client.close()
    where = settings.redact(f"s3://{client.bucket}/{root} at {settings.endpoint_url or 'AWS'}")
    return f"{where}: {found}"


def check_bucket(client: S3Client, list_prefix: str) -> None:
    """``HeadBucket``; on 403, a one-key ``ListObjectsV2`` of ``list_prefix`` tells credentials from permissions.

    Raises:
        S3StartupError: see :func:`startup_error`.
    """
    try:
        client.call("head_bucket")
    except S3RequestError as exc:
        if exc.status == 403:
            # HEAD responses carry no error code: ask again with a GET to learn
            # whether the credentials or the permissions are at fault.
            try:
                client.call("list_objects_v2", Prefix=list_prefix, MaxKeys=1)
            except S3RequestError as inner:
                raise startup_error(client, "ListObjectsV2", inner, list_prefix) from None
        raise startup_error(client, "HeadBucket", exc, list_prefix) from None


def probe_features(client: S3Client, probe_name: str) -> ServerFeatures:
    """Write ``probe_name`` twice with ``If-None-Match: *`` and delete it with ``DeleteObjects``.

    The second conditional PUT must be refused (412); a server that
    accepts it ignores conditional puts. A server that refuses
    ``DeleteObjects`` is asked with ``DeleteObject``. Each missing feature
    is logged once, naming the fallback.

    Raises:
        S3StartupError: a write or delete failed for another reason (permissions...).
    """
    try:
        client.put(probe_name, b"probe", if_absent=True)
        if client.conditional_put and client.put(probe_name, b"probe", if_absent=True):
            client.no_conditional_put("ignores")
        failed = client.delete_many([probe_name])
        if failed:
            raise S3RequestError(
                "delete_objects", "other", failed[probe_name], 0, "DeleteError", f"delete refused: {failed}"
            )
    except S3RequestError as exc:
        raise startup_error(client, "the write/delete probe", exc, probe_name.rpartition("/")[0] + "/") from None
    return client.features()


def probe_credentials(client: S3Client) -> bool | None:
    """Whether the server refuses a request signed with made-up credentials (one ``HeadBucket``).

    Sets ``client.checks_credentials`` (None when the answer was neither: unreachable...). Never raises.
    """
    fake = dataclasses.replace(
        client.settings,
        aws_access_key_id="AKIATIERINGPROBE0000",
        aws_secret_access_key="tiering-credential-probe",
        aws_session_token=None,
        profile_name=None,
        max_attempts=1,
    )
    other = S3Client(fake, 1)
    try:
        other.call("head_bucket")
        client.checks_credentials = False
    except S3RequestError as exc:
        client.checks_credentials = True if exc.error_class in ("credentials", "access_denied") else None
    finally:
        other.close()
    return client.checks_credentials


def probe_report(client: S3Client, base: str, check_credentials: bool = True) -> list[str]:
    """What the probes found, one line each (``tiering check --probe``); never a credential.

    Args:
        client: the tier's client.
        base: the namespace's folder in the bucket.
        check_credentials: also send one request signed with made-up credentials to learn whether
            the server checks them (:func:`probe_credentials`).
    """
    if check_credentials and client.checks_credentials is None:
        probe_credentials(client)
    endpoint = client.redact(client.settings.endpoint_url or "AWS")
    return [f"s3://{client.bucket}/{base}/ at {endpoint}", *client.features().describe()]


def startup_error(
    client: S3Client, what: str, exc: S3RequestError, scope: str, action: str = "startup probe"
) -> S3StartupError:
    """An :class:`S3StartupError` saying what is wrong (endpoint, bucket, region, credentials, ...).

    Args:
        client: the client that sent it (bucket, endpoint, region for the message).
        what: the request that failed (``"HeadBucket"``), for the message.
        exc: what it raised.
        scope: the keys it concerned (``"<prefix>/<digest>/"``), named on access denied.
        action: what was under way, for the message of an unclassified failure.
    """
    settings = client.settings
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
            f"s3 tier: bucket {client.bucket!r} does not exist at {where} (HTTP {status or code}); check 'bucket'",
            "bucket",
        )
    if status == 301 or code in ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraint"):
        return S3StartupError(
            f"s3 tier: bucket {client.bucket!r} is in {exc.bucket_region or 'another region'}, not the configured "
            f"region {client.boto.meta.region_name!r}; check 'region_name'",
            "region",
        )
    if cls == "access_denied":
        return S3StartupError(
            f"s3 tier: access denied to s3://{client.bucket}/{scope} at {where} during {what} "
            f"({code or status}): the credentials are valid but lack permission "
            "(s3:ListBucket, s3:GetObject, s3:PutObject, s3:DeleteObject needed)",
            "permission",
        )
    return S3StartupError(f"s3 tier: {action} failed at {where} during {what}: {detail}", "other")

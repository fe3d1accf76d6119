"""Error classification and the startup error of the S3 tier.

Every failure of an S3 request is sorted into one *error class* (a short
label used as a ``stats()`` counter suffix, ``errors_<class>``) so an operator
can tell throttling from timeouts from credential trouble at a glance.
Messages built here never contain credentials: every text that leaves the
tier goes through :class:`tiering.core.redact.Redactor`.
"""

from __future__ import annotations

import ssl

from botocore import exceptions as bexc

from tiering.core.redact import Redactor

ERROR_CLASSES = (
    "throttled",
    "timeout",
    "connection",
    "credentials",
    "access_denied",
    "checksum",
    "tls",
    "not_found",
    "server",
    "client",
    "other",
)
"""Every label :func:`classify_error` can return, in ``stats()`` order."""

_THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
        "ServiceUnavailable",
        "503",
    }
)
_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidToken",
        "TokenRefreshRequired",
        "RequestExpired",
        "InvalidClientTokenId",
        "AuthorizationHeaderMalformed",
        "RequestTimeTooSkewed",
    }
)
_CHECKSUM_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "InvalidChecksum"})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "404", "NotFound"})


def error_code(exc: BaseException) -> str:
    """The S3 error code (``"NoSuchKey"``, ``"403"``...) of a ``ClientError`` / :class:`S3RequestError`, else ``""``."""
    if isinstance(exc, S3RequestError):
        return exc.code
    if isinstance(exc, bexc.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def http_status(exc: BaseException) -> int:
    """The HTTP status of a ``ClientError`` or :class:`S3RequestError`, else 0."""
    if isinstance(exc, S3RequestError):
        return exc.status
    if isinstance(exc, bexc.ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return 0


def classify_error(exc: BaseException) -> str:
    """Sort an exception raised by a boto3 call into one of :data:`ERROR_CLASSES`.

    Args:
        exc: what the call raised (after botocore's own retries), or an
            :class:`S3RequestError` (which carries its class).

    Returns:
        The error class label.
    """
    if isinstance(exc, S3RequestError):
        return exc.error_class
    if isinstance(exc, bexc.ClientError):
        code, status = error_code(exc), http_status(exc)
        if code in _THROTTLE_CODES or status in (429, 503):
            return "throttled"
        if code in _CREDENTIAL_CODES:
            return "credentials"
        if code in _CHECKSUM_CODES:
            return "checksum"
        if code in _NOT_FOUND_CODES or status == 404:
            return "not_found"
        if code == "AccessDenied" or status == 403:
            return "access_denied"
        if status >= 500:
            return "server"
        return "client"
    if isinstance(exc, (bexc.ReadTimeoutError, bexc.ConnectTimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, (bexc.SSLError, ssl.SSLError)):
        return "tls"
    if isinstance(
        exc,
        (
            bexc.EndpointConnectionError,
            bexc.ConnectionClosedError,
            bexc.ProxyConnectionError,
            bexc.ConnectionError,
            bexc.HTTPClientError,
            ConnectionError,
        ),
    ):
        return "connection"
    if isinstance(
        exc,
        (
            bexc.NoCredentialsError,
            bexc.PartialCredentialsError,
            bexc.CredentialRetrievalError,
            bexc.ProfileNotFound,
            bexc.NoAuthTokenError,
        ),
    ):
        return "credentials"
    if isinstance(exc, bexc.FlexibleChecksumError):
        return "checksum"
    return "other"


class S3StartupError(RuntimeError, OSError):
    """The startup probe failed: the tier cannot work with this configuration.

    The message says what is wrong (endpoint, bucket, region, credentials,
    permissions, TLS) and never contains credentials. It is also an
    ``OSError`` (the bucket is unreachable or unusable), so ``tiering``
    commands report it as a clear error with exit status 2.

    Attributes:
        cause: one of ``"endpoint"``, ``"bucket"``, ``"region"``,
            ``"credentials"``, ``"permission"``, ``"tls"``, ``"timeout"``,
            ``"conditional_put"``, ``"other"``.
    """

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class S3RequestError(Exception):
    """One failed S3 request, translated once from botocore by :meth:`tiering.s3.client.S3Client.call`.

    The message is redacted (no credential) and names the operation. The
    botocore exception is not chained (its text is already in the message).

    Attributes:
        op: the boto3 operation (``"get_object"``).
        error_class: one of :data:`ERROR_CLASSES`.
        code: the S3 error code (``"NoSuchKey"``), ``""`` for a non-HTTP failure.
        status: the HTTP status, 0 for a non-HTTP failure.
        kind: the botocore exception's class name (``"ReadTimeoutError"``).
        bucket_region: the ``x-amz-bucket-region`` response header, ``""`` when absent.
    """

    def __init__(
        self, op: str, error_class: str, code: str, status: int, kind: str, message: str, bucket_region: str = ""
    ) -> None:
        super().__init__(message)
        self.op = op
        self.error_class = error_class
        self.code = code
        self.status = status
        self.kind = kind
        self.bucket_region = bucket_region

    @classmethod
    def from_botocore(cls, op: str, exc: BaseException, redact: Redactor) -> S3RequestError:
        """Translate what a boto3 call raised (``ClientError`` or ``BotoCoreError``)."""
        region = ""
        if isinstance(exc, bexc.ClientError):
            headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            region = str(headers.get("x-amz-bucket-region", ""))
        return cls(op, classify_error(exc), error_code(exc), http_status(exc), type(exc).__name__, redact(exc), region)

    @property
    def not_found(self) -> bool:
        """Whether the object or bucket does not exist."""
        return self.error_class == "not_found"

    @property
    def precondition_failed(self) -> bool:
        """Whether a conditional request was refused (HTTP 412): e.g. ``If-None-Match`` met an existing object."""
        return self.status == 412 or self.code == "PreconditionFailed"

    @property
    def no_credentials(self) -> bool:
        """Whether boto3 found no credentials at all."""
        return self.kind == "NoCredentialsError"

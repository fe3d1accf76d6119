"""The configuration of an s3 tier: where the bucket is and how to talk to it.

:class:`ConnectionSettings` holds the keys of an ``s3`` tier entry that the
tier and its offline inspector (:mod:`tiering.s3.inspection`) share, so both
validate the same keys alike and build the same client. Credentials are kept
out of every ``repr`` and message.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from tiering.s3.errors import Redactor
from tiering.s3.layout import normalize_prefix

ADDRESSING_STYLES = ("auto", "path", "virtual")
RETRY_MODES = ("standard", "adaptive", "legacy")
CHECKSUM_MODES = ("when_supported", "when_required")
SECRET_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
"""Config keys whose values are credentials: never shown anywhere."""


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


@dataclasses.dataclass(frozen=True)
class ConnectionSettings:
    """The keys of an ``s3`` tier entry that say where the bucket is and how to talk to it.

    Shared by the tier and its offline inspector (:mod:`tiering.s3.inspection`), so both
    validate the same keys alike, build the same client and classify startup failures the
    same way. The credentials are kept out of ``repr``. Fields: the constructor keys of
    :class:`S3SecondaryTierManager` of the same names (whose defaults are the only ones).
    """

    bucket: str | None = None
    prefix: str = ""
    endpoint_url: str | None = None
    region_name: str | None = None
    addressing_style: str = "auto"
    aws_access_key_id: str | None = dataclasses.field(default=None, repr=False)
    aws_secret_access_key: str | None = dataclasses.field(default=None, repr=False)
    aws_session_token: str | None = dataclasses.field(default=None, repr=False)
    profile_name: str | None = None
    ca_bundle: str | None = None
    verify: bool = True
    max_concurrency: int = 16
    retry_mode: str = "standard"
    max_attempts: int = 3
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    request_checksum_calculation: str | None = None
    response_checksum_validation: str | None = None

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
        return normalize_prefix(self.prefix)

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

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> ConnectionSettings:
        """The settings of a tier config entry (missing keys take the tier's defaults; other keys are ignored)."""
        return cls(**{f.name: entry[f.name] for f in dataclasses.fields(cls) if f.name in entry})

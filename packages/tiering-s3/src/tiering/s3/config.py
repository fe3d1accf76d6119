"""The configuration of an s3 tier: where the bucket is and how to talk to it.

:class:`ConnectionSettings` holds the keys of an ``s3`` tier entry that the
tier and its offline inspector (:mod:`tiering.s3.inspection`) share, so both
validate the same keys alike and build the same client. Credentials are kept
out of every ``repr`` and message.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from tiering.core.declared import schema_defaults
from tiering.core.policies.pin_records import MAX_PINNED_BYTES, pins_below_capacity
from tiering.core.policies.tenancy import TENANTS_KEY
from tiering.core.redact import Redactor
from tiering.core.schema import ConfigKey, ConfigSchema, MissingKeyError
from tiering.s3.layout import normalize_prefix

ADDRESSING_STYLES = ("auto", "path", "virtual")
RETRY_MODES = ("standard", "adaptive", "legacy")
CHECKSUM_MODES = ("when_supported", "when_required")
CREDENTIAL_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
"""Config keys holding credentials: their values are removed from every message (the secret ones
are also marked ``secret`` in :data:`SCHEMA`, which ``tiering`` reports redact)."""


def _url_problem(value: str) -> str | None:
    return None if value.startswith(("http://", "https://")) else "must start with http:// or https://"


def _opt_str(name: str, doc: str, secret: bool = False) -> ConfigKey:
    return ConfigKey(name, (str,), nullable=True, non_empty=True, secret=secret, doc=doc)


def _credentials_paired(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    if (entry["aws_access_key_id"] is None) == (entry["aws_secret_access_key"] is None):
        return None
    missing = "aws_secret_access_key" if entry["aws_secret_access_key"] is None else "aws_access_key_id"
    other = "aws_access_key_id" if missing == "aws_secret_access_key" else "aws_secret_access_key"
    return missing, f"required with {other}; give both, or neither for boto3's default credential chain"


def _ca_bundle_usable(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    path = entry["ca_bundle"]
    if path is None:
        return None
    if not entry["verify"]:
        return "ca_bundle", "is set but 'verify' is false; set one or the other"
    if not os.path.isfile(path):
        return "ca_bundle", f"names {path!r}, which is not a file"
    return None


SCHEMA = ConfigSchema(
    "s3",
    [
        ConfigKey("bucket", (str,), required=True, non_empty=True, doc="the bucket (must exist)"),
        ConfigKey("prefix", (str,), default="", doc="key prefix inside the bucket; nothing outside it is touched"),
        ConfigKey("endpoint_url", (str,), nullable=True, non_empty=True, check=_url_problem, doc="null: AWS"),
        _opt_str("region_name", "the bucket's region; null: boto3's default chain"),
        ConfigKey("addressing_style", (str,), default="auto", choices=ADDRESSING_STYLES, doc="path or virtual-host"),
        _opt_str("aws_access_key_id", "explicit access key id; null: boto3's default chain"),
        _opt_str("aws_secret_access_key", "the secret of aws_access_key_id", secret=True),
        _opt_str("aws_session_token", "the session token of temporary credentials", secret=True),
        _opt_str("profile_name", "a profile of the shared AWS config files"),
        _opt_str("ca_bundle", "PEM CA bundle verifying the endpoint's TLS certificate"),
        ConfigKey("verify", (bool,), default=True, doc="false turns TLS verification off (test servers only)"),
        ConfigKey("max_concurrency", (int,), default=16, minimum=1, maximum=1024, doc="I/O threads and connections"),
        ConfigKey("retry_mode", (str,), default="standard", choices=RETRY_MODES, doc="botocore retry mode"),
        ConfigKey("max_attempts", (int,), default=3, minimum=1, maximum=100, doc="per request, first included"),
        ConfigKey(
            "connect_timeout", (float,), default=5.0, minimum=0, exclusive_minimum=True, duration=True, doc="seconds"
        ),
        ConfigKey(
            "read_timeout", (float,), default=30.0, minimum=0, exclusive_minimum=True, duration=True, doc="seconds"
        ),
        ConfigKey("request_checksum_calculation", (str,), nullable=True, choices=CHECKSUM_MODES, doc="botocore"),
        ConfigKey("response_checksum_validation", (str,), nullable=True, choices=CHECKSUM_MODES, doc="botocore"),
        ConfigKey("capacity_bytes", (int,), nullable=True, minimum=1, size=True, doc="cap on object bytes; null: none"),
        ConfigKey("head_fallback", (bool,), default=True, doc="on an index miss, ask the server with HEAD"),
        MAX_PINNED_BYTES,
        TENANTS_KEY,
    ],
    checks=[_credentials_paired, _ca_bundle_usable, pins_below_capacity],
)
"""Every key of an ``s3`` tier entry (``S3SecondaryTierManager.config_schema``)."""


@dataclasses.dataclass(frozen=True)
@schema_defaults(SCHEMA, subset=True)
class ConnectionSettings:
    """The keys of an ``s3`` tier entry that say where the bucket is and how to talk to it.

    Shared by the tier and its offline inspector (:mod:`tiering.s3.inspection`), so both
    validate the same keys alike, build the same client and classify startup failures the
    same way. The credentials are kept out of ``repr``. Fields: the keys of :data:`SCHEMA`
    of the same names, their defaults taken from it
    (:func:`~tiering.core.declared.schema_defaults`; None for the required ``bucket``).
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
        """A :class:`tiering.core.redact.Redactor` of the credentials (key id too) and ``endpoint_url``'s password."""
        return Redactor(
            {"endpoint_url": self.endpoint_url},
            SCHEMA.secret_keys,
            [self.aws_access_key_id, self.aws_secret_access_key, self.aws_session_token],
        )

    @property
    def bucket_name(self) -> str:
        """The bucket (call :meth:`validate` first).

        Raises:
            MissingKeyError: no bucket was given.
        """
        if not isinstance(self.bucket, str) or not self.bucket:
            raise MissingKeyError("s3", "bucket", "required; expected a non-empty string")
        return self.bucket

    @property
    def normalized_prefix(self) -> str:
        """The prefix without empty parts (no leading, trailing or doubled ``/``)."""
        return normalize_prefix(self.prefix)

    def validate(self) -> None:
        """Check every value (through :data:`SCHEMA`) and the keys that go together.

        Raises:
            TierConfigError: a wrong value (a subclass per mistake kind, also a ``ValueError``);
                the message names the key, never a secret's value.
        """
        given = {k: v for k, v in dataclasses.asdict(self).items() if v is not None or SCHEMA.keys[k].nullable}
        SCHEMA.validate(given)

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any]) -> ConnectionSettings:
        """The settings of a tier config entry (missing keys take the tier's defaults; other keys are ignored)."""
        return cls(**{f.name: entry[f.name] for f in dataclasses.fields(cls) if f.name in entry})

"""Redaction of credentials (issue 13 kind 7, case C12): configs, URLs, free text, error messages, reprs."""

from __future__ import annotations

import json

import pytest

from tiering.core import TieringOffloadingSpec, create_secondary_tier, create_spec
from tiering.core.redact import (
    REDACTED,
    Redactor,
    is_secret_key,
    key_segments,
    redact_config,
    redact_text,
    redact_url,
    secret_values,
)

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TOKEN = "FwoGZXIvYXdzEJr//////////wEaDOEXAMPLETOKEN"
PASSWORD = "hunter2-correct-horse"

S3_CONFIG = {
    "cpu_bytes_to_use": 1 << 20,
    "tokens_per_hash": 16,
    "secondary_tiers": [
        {
            "type": "s3",
            "bucket": "kv-cache",
            "endpoint_url": f"https://admin:{PASSWORD}@minio.local:9000/",
            "aws_access_key_id": "AKIAIOSFODNN7EXAMPLE",
            "aws_secret_access_key": SECRET,
            "aws_session_token": TOKEN,
            "client_kwargs": {"config": {"retries": 3}, "headers": {"Authorization": f"Bearer {TOKEN}"}},
        },
        {
            "type": "fs",
            "root": "s3://kv/fs",
            "storage_options": {"key": "AKIA2", "secret": SECRET, "token": TOKEN, "anon": False},
        },
    ],
}


@pytest.mark.parametrize(
    "key",
    [
        "aws_secret_access_key",
        "aws_session_token",
        "password",
        "redis_password",
        "PASSWORD",
        "client_secret",
        "secret",
        "token",
        "auth_token",
        "session_token",
        "sessionToken",
        "x-amz-security-token",
        "api_key",
        "apiKey",
        "account_key",
        "AccountKey",
        "connection_string",
        "credentials",
        "Authorization",
        "aws_access_key_id",
        "X-Amz-Signature",
        "sig",
    ],
)
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "tokens_per_hash",
        "block_size_tokens",
        "max_tokens",
        "tokenizer",
        "token_budget",
        "block_size",
        "key",
        "bucket",
        "endpoint_url",
        "prefix",
        "root",
        "anon",
        "namespace",
        "keys",
        "signed",
        "type",
    ],
)
def test_non_secret_keys(key):
    assert not is_secret_key(key)


def test_schema_declared_secret_keys_and_non_string_keys():
    assert not is_secret_key("shared_key_material")
    assert is_secret_key("shared_key_material", secret_keys={"Shared_Key_Material"})
    assert not is_secret_key(3) and not is_secret_key(None)
    assert key_segments("aws_sessionToken") == ["aws", "session", "token"]
    assert key_segments("X-Amz-Security-Token") == ["x", "amz", "security", "token"]


def test_redact_config_recursive_with_real_values():
    out = redact_config(S3_CONFIG)
    s3, fs = out["secondary_tiers"]
    assert s3["aws_secret_access_key"] == REDACTED
    assert s3["aws_session_token"] == REDACTED
    assert s3["aws_access_key_id"] == REDACTED
    assert s3["endpoint_url"] == f"https://admin:{REDACTED}@minio.local:9000/"
    assert s3["client_kwargs"] == {"config": {"retries": 3}, "headers": {"Authorization": REDACTED}}
    assert fs["storage_options"] == {"key": "AKIA2", "secret": REDACTED, "token": REDACTED, "anon": False}
    assert s3["bucket"] == "kv-cache" and fs["root"] == "s3://kv/fs" and out["tokens_per_hash"] == 16
    dumped = json.dumps(out)
    for secret in (SECRET, TOKEN, PASSWORD, "AKIAIOSFODNN7EXAMPLE"):
        assert secret not in dumped
    # the input is untouched
    assert S3_CONFIG["secondary_tiers"][0]["aws_secret_access_key"] == SECRET


def test_redact_config_keeps_unset_secrets_and_shapes():
    config = {"password": None, "token": "", "secret": 12345, "auth": ("user", "pw"), "items": ({"api_key": "k"},)}
    assert redact_config(config) == {
        "password": None,
        "token": "",
        "secret": REDACTED,
        "auth": REDACTED,
        "items": ({"api_key": REDACTED},),
    }
    assert redact_config({"x": "AccountName=a;AccountKey=abcdEFGH==;EndpointSuffix=core"}) == {
        "x": f"AccountName=a;AccountKey={REDACTED};EndpointSuffix=core"
    }


def test_secret_values_collects_nested_values_and_url_passwords():
    values = secret_values(S3_CONFIG)
    assert {SECRET, TOKEN, PASSWORD, f"Bearer {TOKEN}", "AKIAIOSFODNN7EXAMPLE"} <= values
    assert "kv-cache" not in values and "AKIA2" not in values
    assert secret_values({"nested": {"x": {"password": 1234}}}) == {"1234"}


def test_redact_url():
    assert redact_url(f"redis://default:{PASSWORD}@cache:6379/0") == f"redis://default:{REDACTED}@cache:6379/0"
    assert redact_url("redis://cache:6379/0") == "redis://cache:6379/0"
    assert redact_url("ssh://alice@host/path") == "ssh://alice@host/path"  # a user name is not a credential
    presigned = "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=abcdef0123&X-Amz-Expires=60"
    out = redact_url(presigned)
    assert "abcdef0123" not in out and "AKIA" not in out
    assert "X-Amz-Expires=60" in out and out.startswith("https://b.s3.amazonaws.com/k?")
    assert redact_url("not a url") == "not a url"


def test_redact_text_free_text():
    message = (
        f"cannot connect to https://admin:{PASSWORD}@minio.local:9000: "
        f"InvalidAccessKeyId (key {SECRET}); client_kwargs={{'aws_session_token': '{TOKEN}'}} "
        f"password={PASSWORD} Authorization: Bearer {TOKEN}"
    )
    out = redact_text(message)
    assert TOKEN not in out and PASSWORD not in out  # a bare value (the "key ..." above) needs the config
    assert f"https://admin:{REDACTED}@minio.local:9000" in out
    assert f"'aws_session_token': '{REDACTED}'" in out
    assert f"password={REDACTED}" in out
    assert f"Authorization: Bearer {REDACTED}" in out
    # a bare value is found when the config is given
    assert SECRET not in redact_text(message, S3_CONFIG)
    assert f"(key {REDACTED})" in redact_text(message, S3_CONFIG)


def test_redact_text_leaves_messages_that_name_a_key_alone():
    message = "secondary_tiers[0].password: must be a non-empty string, got 3 (tier 'redis')"
    assert redact_text(message) == message
    assert redact_text("tokens_per_hash=16 block_size_tokens: 256") == "tokens_per_hash=16 block_size_tokens: 256"
    assert redact_text("password=None token=''") == "password=None token=''"


def test_redactor_binds_a_config_and_extra_secrets():
    redact = Redactor(S3_CONFIG, secrets=["runtime-credential-1"])
    out = redact(f"failed with {SECRET} and runtime-credential-1 at 'aws_session_token': {TOKEN!r}")
    assert SECRET not in out and TOKEN not in out and "runtime-credential-1" not in out
    assert repr(redact).startswith("Redactor(") and SECRET not in repr(redact)
    schema = Redactor({"shared_key_material": "abcdefgh"}, secret_keys={"shared_key_material"})
    assert schema("value abcdefgh") == f"value {REDACTED}"
    assert schema.config({"shared_key_material": "abcdefgh"}) == {"shared_key_material": REDACTED}


# -- C12 where core produces output: spec reprs and factory error messages -------------------------
def test_C12_spec_repr_holds_no_credential():
    config = {"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": "s3", "aws_secret_access_key": SECRET}]}
    spec = TieringOffloadingSpec(config)
    text = repr(spec)
    assert SECRET not in text
    assert "'aws_secret_access_key': '***'" in text and spec.namespace.digest in text


def test_C12_factory_errors_hold_no_credential(tmp_path, monkeypatch, small_spec, small_view):
    (tmp_path / "c12_tiers.py").write_text(
        "from tiering.core import SecondaryTierManager\n"
        "class Base(SecondaryTierManager):\n"
        "    lookup = submit_store = submit_load = get_finished = lambda *a: None\n"
        "class Leaky(Base):\n"
        "    def __init__(self, offloading_spec, primary_kv_view, tier_type, url='', password=''):\n"
        "        raise ValueError(f'cannot reach {url} with password {password}')\n"
        "class Opens(Base):\n"
        "    def __init__(self, offloading_spec, primary_kv_view, tier_type, root='', password=''):\n"
        "        open(root + '/x-' + password)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = {"type": "Leaky", "module_path": "c12_tiers", "url": f"redis://u:{PASSWORD}@h:1", "password": SECRET}
    with pytest.raises(ValueError) as info:
        create_secondary_tier(entry, small_view, small_spec, index=2)
    message = str(info.value)
    assert message.startswith("secondary_tiers[2]: cannot reach redis://u:***@h:1 with password ***")
    assert SECRET not in message and PASSWORD not in message
    entry = {"type": "Opens", "module_path": "c12_tiers", "root": str(tmp_path / "none"), "password": SECRET}
    with pytest.raises(FileNotFoundError) as os_info:
        create_secondary_tier(entry, small_view, small_spec, index=1)
    assert str(os_info.value).startswith("[Errno 2] secondary_tiers[1].root: No such file or directory: ")
    assert str(os_info.value).endswith("/none/x-***'")
    assert os_info.value.filename.endswith("/none/x-***") and SECRET not in str(os_info.value)
    # a list where an object belongs, and a bad secondary_tiers value, are shown redacted
    with pytest.raises(ValueError) as bad:
        TieringOffloadingSpec({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": {"password": SECRET}})
    assert SECRET not in str(bad.value)
    with pytest.raises(ValueError) as unknown:
        create_spec({"cpu_bytes_to_use": 1 << 20, "spec_name": "Nope", "secondary_tiers": [{"token": SECRET}]})
    assert SECRET not in str(unknown.value)

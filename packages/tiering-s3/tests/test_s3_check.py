"""Plain ``tiering check`` (no network) refuses what the s3 tier would refuse at start-up."""

import json

import pytest

from tiering.cli.main import main

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def _check(tmp_path, capsys, **entry):
    path = tmp_path / "config.json"
    tier = {"type": "s3", "bucket": "kv", "endpoint_url": "http://127.0.0.1:9", **entry}
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [tier]}))
    status = main(["check", str(path)])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"aws_access_key_id": "AKIAEXAMPLEKEYID0000"},
            "secondary_tiers[0].aws_secret_access_key: required with aws_access_key_id",
        ),
        (
            {"aws_secret_access_key": SECRET},
            "secondary_tiers[0].aws_access_key_id: required with aws_secret_access_key",
        ),
        (
            {"ca_bundle": "/nonexistent/ca.pem"},
            "secondary_tiers[0].ca_bundle: names '/nonexistent/ca.pem', which is not a file",
        ),
        ({"ca_bundle": "."}, "secondary_tiers[0].ca_bundle: names '.', which is not a file"),
        ({"ca_bundle": __file__, "verify": False}, "secondary_tiers[0].ca_bundle: is set but 'verify' is false"),
    ],
)
def test_plain_check_refuses_what_the_tier_refuses_at_start_up(tmp_path, capsys, entry, message):
    status, out, err = _check(tmp_path, capsys, **entry)
    assert status == 2, out
    assert message in err
    assert "config ok" not in out
    assert SECRET not in err + out and "AKIAEXAMPLEKEYID0000" not in err + out


def test_plain_check_accepts_paired_credentials_and_a_ca_bundle_file(tmp_path, capsys):
    status, out, err = _check(
        tmp_path, capsys, aws_access_key_id="AKIAEXAMPLEKEYID0000", aws_secret_access_key=SECRET, ca_bundle=__file__
    )
    assert status == 0, err
    assert "config ok" in out


def test_probe_errors_name_the_entry_as_plain_check_does(tmp_path, capsys, monkeypatch):
    """A config error raised by the tier's probe is labelled ``secondary_tiers[N].key``, not ``tier 's3': key``."""
    from tiering.core.schema import InvalidValueError
    from tiering.s3 import S3SecondaryTierManager

    def probe(cls, entry):
        raise InvalidValueError("s3", "endpoint_url", "refused by the probe")

    monkeypatch.setattr(S3SecondaryTierManager, "probe", classmethod(probe))
    monkeypatch.setattr("tiering.core.inspection.inspector_for", lambda entry, index=0: None)
    path = tmp_path / "config.json"
    tiers = [{"type": "s3", "bucket": "a"}, {"type": "s3", "bucket": "b"}]
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": tiers}))
    assert main(["check", str(path), "--probe"]) == 2
    err = capsys.readouterr().err
    assert "secondary_tiers[0].endpoint_url: refused by the probe (tier 's3')" in err
    assert "tier 's3': endpoint_url" not in err


def test_capacity_with_a_unit_reaches_the_tier_as_bytes(s3):
    from s3_helpers import build

    tier, _ = build(s3.tier_config(capacity_bytes="1MiB"))
    try:
        assert tier.capacity_bytes == 1 << 20
        assert tier.stats()["capacity_bytes"] == 1 << 20
    finally:
        tier.shutdown()


def test_a_bad_capacity_size_is_refused_by_plain_check(tmp_path, capsys):
    status, _, err = _check(tmp_path, capsys, capacity_bytes="a lot")
    assert status == 2
    assert "secondary_tiers[0].capacity_bytes: must be an integer >= 1 (bytes) or a size with a unit" in err

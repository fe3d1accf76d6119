"""``tenant_secret``: a request's tenant accepted only when signed; a bare or forged name refused."""

import json

import pytest

from tiering.cli.main import main
from tiering.core.factory import create_spec
from tiering.core.policies.tenant_auth import TenantAuth, TenantRefusedError, sign_tenant
from tiering.core.policies.tenants import tenant_from_params

SECRET = "s3cret-of-the-gateway-0123456789"


def test_a_signed_tenant_is_accepted_and_the_tiers_see_its_name():
    auth = TenantAuth(SECRET)
    signed = sign_tenant(SECRET, "acme")
    assert signed.startswith("acme:") and len(signed) == len("acme:") + 64
    assert tenant_from_params({"tenant": signed}, auth) == "acme"
    assert tenant_from_params({"tenant": sign_tenant(SECRET, "a:b")}, auth) == "a:b"  # a name may hold a colon
    assert tenant_from_params(None, auth) == "" and tenant_from_params({}, auth) == ""  # no tenant: the default


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("acme", "is not signed"),  # naming another tenant without the secret
        (sign_tenant("another-secret-0123456789", "acme"), "signature of tenant 'acme' does not match"),
        ("acme:" + "0" * 64, "signature of tenant 'acme' does not match"),
        (sign_tenant(SECRET, "acme")[:-1], "does not match"),
        (":" + sign_tenant(SECRET, "")[1:], "is not signed"),
    ],
)
def test_a_bare_or_forged_tenant_is_refused_naming_neither_secret_nor_signature(value, message):
    with pytest.raises(TenantRefusedError, match=message) as caught:
        tenant_from_params({"tenant": value}, TenantAuth(SECRET))
    assert "kv_transfer_params['tenant']" in str(caught.value)
    assert SECRET not in str(caught.value) and sign_tenant(SECRET, "acme").split(":")[1] not in str(caught.value)


def test_without_a_secret_a_tenant_is_taken_as_named():
    assert tenant_from_params({"tenant": "acme"}, TenantAuth(None)) == "acme"
    assert tenant_from_params({"tenant": "acme"}) == "acme"


@pytest.mark.parametrize("secret", ["short", 12345])
def test_a_weak_tenant_secret_is_refused_before_anything_starts(tmp_path, capsys, secret):
    config = {"cpu_bytes_to_use": 1 << 20, "tenant_secret": secret}
    with pytest.raises(ValueError, match="tenant_secret must be a string of at least 16 characters"):
        create_spec(config)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tenant_secret" in err and str(secret) not in err.replace("tenant_secret", "")


def test_a_good_tenant_secret_is_accepted_and_redacted_from_the_spec(tmp_path, capsys):
    spec = create_spec({"cpu_bytes_to_use": 1 << 20, "tenant_secret": SECRET})
    assert spec.tenant_auth.enforced and SECRET not in repr(spec)

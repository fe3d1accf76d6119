"""Tenants a client cannot simply name: ``tenant_secret`` and signed tenant names.

A request names its tenant (vLLM: ``kv_transfer_params["tenant"]``), and
any API client can set that field. Without a secret, naming tenant
``acme`` is enough to get acme's cache hits, so the field must come from a
trusted gateway that strips or sets it. With the offloading config's
``tenant_secret``, a request's tenant is accepted only as
``name:HMAC-SHA256(secret, name)`` (hex; :func:`sign_tenant` makes it, e.g.
in the gateway): the signature is checked in constant time, a name without
it or with a wrong one is refused (the request gets no tiering at all, and
one logged line, never another tenant's hits), and the tiers see only the
name. A request naming no tenant is the default tenant's, as without a secret.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

__all__ = ["MIN_SECRET_CHARS", "TENANT_SECRET_KEY", "TenantAuth", "TenantRefusedError", "sign_tenant"]

TENANT_SECRET_KEY = "tenant_secret"
"""The offloading config key of the secret (redacted wherever the config is shown)."""

MIN_SECRET_CHARS = 16
"""The shortest secret accepted: a short one could be guessed from signed names seen in logs or traffic."""


class TenantRefusedError(ValueError):
    """A request's tenant is not signed with the deployment's ``tenant_secret`` (or the signature is wrong)."""


def sign_tenant(secret: str, name: str) -> str:
    """The signed form ``name:HMAC-SHA256(secret, name)`` (hex) of tenant ``name`` that a gateway puts in requests."""
    return f"{name}:{_mac(secret, name)}"


def _mac(secret: str, name: str) -> str:
    return hmac.new(secret.encode(), name.encode(), hashlib.sha256).hexdigest()


class TenantAuth:
    """Checks the tenants requests name against the deployment's ``tenant_secret``.

    Args:
        secret: the secret; None: no check (a request's tenant is taken as named).

    Raises:
        ValueError: ``secret`` is not a string of at least :data:`MIN_SECRET_CHARS` characters (names the key).
    """

    def __init__(self, secret: str | None) -> None:
        if secret is not None and (not isinstance(secret, str) or len(secret) < MIN_SECRET_CHARS):
            raise ValueError(
                f"{TENANT_SECRET_KEY} must be a string of at least {MIN_SECRET_CHARS} characters "
                f"(got {type(secret).__name__} of {len(secret) if isinstance(secret, str) else 0})"
            )
        self._secret = secret

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TenantAuth:
        """The check an offloading config asks for (its ``tenant_secret``; absent or null: none)."""
        return cls(config.get(TENANT_SECRET_KEY))

    @property
    def enforced(self) -> bool:
        """Whether tenants must be signed."""
        return self._secret is not None

    def resolve(self, value: str) -> str:
        """The tenant a request may use for the ``value`` it named.

        Returns:
            ``value`` without a secret; with one, the name of a correctly signed ``name:signature``
            (``""``, naming no tenant, stays the default tenant).

        Raises:
            TenantRefusedError: a secret is set and ``value`` is a bare name or its signature is wrong
                (the message names neither the signature nor the secret).
        """
        if self._secret is None or not value:
            return value
        name, sep, signature = value.rpartition(":")
        if not sep or not name:
            raise TenantRefusedError("the tenant is not signed (tenant_secret is set: name:signature expected)")
        if not hmac.compare_digest(signature.encode(), _mac(self._secret, name).encode()):
            raise TenantRefusedError(f"the signature of tenant {name[:80]!r} does not match tenant_secret")
        return name

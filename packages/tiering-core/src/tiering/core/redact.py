"""Redaction of credentials from configs, URLs and free text, before anything reaches an output.

Every report, log line, error message, metric label and repr that may hold a
config value goes through this module, so no credential is ever printed or
written (a report written as JSON once held an
``aws_secret_access_key`` verbatim). A secret is replaced by the fixed marker
:data:`REDACTED` (``"***"``); its key and the text around it stay, so the
output still says *which* credential is set.

What counts as a secret key (:func:`is_secret_key`; keys are split into
lower-case segments at ``_``, ``-``, ``.``, spaces and camelCase humps):

- any key containing ``password``, ``passwd`` or ``secret``
  (``aws_secret_access_key``, ``client_secret``, ``redis_password``);
- a key whose last segment is ``token`` (``token``, ``aws_session_token``,
  ``auth_token``, ``sessionToken``), but not ``tokens_per_hash``,
  ``block_size_tokens`` or ``tokenizer``: ``token`` must be a whole segment,
  and the last one;
- a key ending in ``api_key``/``apikey``, ``private_key``, ``account_key``,
  ``access_key``, ``access_key_id``, ``connection_string``, ``credential(s)``,
  ``authorization``, ``auth``, ``cookie``, ``signature`` or ``sig``
  (storage-option and HTTP-header names of fsspec backends, S3 presigned URLs
  and Azure SAS URLs);
- any name a tier declares secret in its config schema, passed as
  ``secret_keys`` (the functions work without one).

Values under a secret key are redacted whatever their type (strings, numbers,
nested objects), except ``None`` and ``""``, which hold no credential and say
that none is set. Free text (:func:`redact_text`) is cleaned of the known
secret values of a config, the password of every ``scheme://user:password@``
URL, and the value of every ``key=value`` / ``key: value`` / ``"key": "value"``
pair whose key is secret.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"
"""The marker that replaces every secret."""

_SUBSTRINGS = ("password", "passwd", "secret")
_SUFFIXES: tuple[tuple[str, ...], ...] = (
    ("token",),
    ("api", "key"),
    ("apikey",),
    ("private", "key"),
    ("account", "key"),
    ("access", "key"),
    ("access", "key", "id"),
    ("connection", "string"),
    ("credential",),
    ("credentials",),
    ("authorization",),
    ("auth",),
    ("cookie",),
    ("signature",),
    ("sig",),
)
_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")
_MIN_FREE_TEXT_SECRET = 4  # shorter known values are only removed where a key names them


def key_segments(key: str) -> list[str]:
    """The lower-case segments of a key name: ``"aws_sessionToken"`` -> ``["aws", "session", "token"]``."""
    return [s.lower() for s in _SEPARATORS.split(_HUMP.sub("_", key)) if s]


def is_secret_key(key: object, secret_keys: Collection[str] = ()) -> bool:
    """Whether the value under ``key`` is a credential (rules in the module docstring).

    Args:
        key: a config key, header name or query parameter name; non-strings are never secret.
        secret_keys: extra names declared secret (e.g. a tier schema's
            ``secret_keys``), matched case-insensitively.
    """
    if not isinstance(key, str):
        return False
    lowered = key.lower()
    if any(s in lowered for s in _SUBSTRINGS) or lowered in {k.lower() for k in secret_keys}:
        return True
    segments = tuple(key_segments(key))
    return any(segments[-len(suffix) :] == suffix for suffix in _SUFFIXES if len(segments) >= len(suffix))


def _hides_something(value: Any) -> bool:
    return value is not None and value != ""


def redact_config(config: Any, secret_keys: Collection[str] = ()) -> Any:
    """A copy of a config with every secret replaced by :data:`REDACTED`, recursively.

    Args:
        config: a JSON-like value: mappings (any depth, e.g. ``storage_options``,
            ``client_kwargs``, ``secondary_tiers`` entries), lists, tuples,
            strings, numbers. Strings elsewhere go through :func:`redact_text`
            (URL passwords, ``key=value`` secrets).
        secret_keys: extra secret key names (a tier schema's).

    Returns:
        The same shape (mappings become dicts, tuples stay tuples); the input is not modified.
    """
    if isinstance(config, Mapping):
        return {
            k: REDACTED if is_secret_key(k, secret_keys) and _hides_something(v) else redact_config(v, secret_keys)
            for k, v in config.items()
        }
    if isinstance(config, list):
        return [redact_config(v, secret_keys) for v in config]
    if isinstance(config, tuple):
        return tuple(redact_config(v, secret_keys) for v in config)
    if isinstance(config, str):
        return redact_text(config, secret_keys=secret_keys)
    return config


def secret_values(config: Any, secret_keys: Collection[str] = ()) -> set[str]:
    """Every string found under a secret key of ``config`` (any depth), and every URL password in it.

    Numbers under a secret key are returned as their ``str``. Used by
    :func:`redact_text` to remove the values themselves from free text.
    """
    found: set[str] = set()

    def walk(value: Any, secret: bool) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, secret or is_secret_key(k, secret_keys))
        elif isinstance(value, (list, tuple, set, frozenset)):
            for v in value:
                walk(v, secret)
        elif isinstance(value, str):
            if secret and value:
                found.add(value)
            for match in _URL_USERINFO.finditer(value):
                if match.group("password"):
                    found.add(match.group("password"))
        elif secret and isinstance(value, (int, float)) and not isinstance(value, bool):
            found.add(str(value))

    walk(config, False)
    return found


_URL_USERINFO = re.compile(r"(?P<prefix>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*:)(?P<password>[^\s@/'\"]*)(?P<at>@)")
_AUTH_SCHEME = re.compile(r"(?:Bearer|Basic|Token)\s+")
_PAIR = re.compile(
    r"""(?P<q>['"]?)(?P<key>[A-Za-z_][\w.-]*)(?P=q)(?P<sep>\s*[:=]\s*)"""
    r"""(?P<value>'[^']*'|"[^"]*"|(?:(?:Bearer|Basic|Token)\s+)?[^\s,;&'")}\]]+)"""
)


def redact_url(url: str, secret_keys: Collection[str] = ()) -> str:
    """``url`` with its password (``user:password@``) and secret query parameters replaced by :data:`REDACTED`.

    The user name, host, path and other parameters stay. A string that is not
    a URL is returned unchanged.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return _URL_USERINFO.sub(lambda m: m.group("prefix") + REDACTED + m.group("at"), url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, password = userinfo.partition(":")
        if colon and password:
            netloc = f"{user}:{REDACTED}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_key(k, secret_keys) for k, _ in pairs):
            query = urlencode([(k, REDACTED if is_secret_key(k, secret_keys) and v else v) for k, v in pairs], safe="*")
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def redact_text(
    text: object, config: Any = None, secret_keys: Collection[str] = (), secrets: Iterable[str | None] = ()
) -> str:
    """``str(text)`` with every credential replaced by :data:`REDACTED` (for error messages and logs).

    Removes, in order: the secret values of ``config`` (see :func:`secret_values`)
    and ``secrets`` (values shorter than 4 characters only where a key names
    them), the password of every ``scheme://user:password@`` URL, and the value
    of every ``key=value``, ``'key': value``, ``key: 'value'`` or
    ``Authorization: Bearer <token>`` pair whose key is secret. An unquoted
    ``key: word`` is left alone: it is how error messages name a key
    (``secondary_tiers[0].password: must be a string``).

    Args:
        text: an error message, log line or repr (anything; ``str()`` is taken).
        config: the config whose secret values must not appear (optional).
        secret_keys: extra secret key names (a tier schema's).
        secrets: further secret strings known by value.
    """
    values = secret_values(config, secret_keys) if config is not None else set()
    values.update(s for s in secrets if s)
    return _redact(str(text), values, secret_keys)


def _redact(out: str, values: Collection[str], secret_keys: Collection[str]) -> str:
    for value in sorted(values, key=len, reverse=True):
        if len(value) >= _MIN_FREE_TEXT_SECRET:
            out = out.replace(value, REDACTED)
    out = _URL_USERINFO.sub(
        lambda m: m.group(0) if m.group("password") in ("", REDACTED) else m.group("prefix") + REDACTED + m.group("at"),
        out,
    )

    def pair(m: re.Match[str]) -> str:
        if not is_secret_key(m.group("key"), secret_keys):
            return m.group(0)
        value = m.group("value")
        quote = value[0] if value[:1] in ("'", '"') else ""
        scheme = _AUTH_SCHEME.match(value)
        kept = scheme.group(0) if scheme else ""
        if ":" in m.group("sep") and not (m.group("q") or quote or kept):
            return m.group(0)  # ``key: problem`` names a key, it gives no value
        if value in (quote * 2, "None", "null") or value.strip(quote) == REDACTED:
            return m.group(0)
        return f"{m.group('q')}{m.group('key')}{m.group('q')}{m.group('sep')}{quote}{kept}{REDACTED}{quote}"

    return _PAIR.sub(pair, out)


class Redactor:
    """Redacts free text against a fixed config: bind once, call for every message.

    Args:
        config: the config whose secrets must not appear (its values, its URLs' passwords).
        secret_keys: extra secret key names (a tier schema's).
        secrets: further secret strings known by value (e.g. credentials resolved at run time).
    """

    def __init__(
        self, config: Any = None, secret_keys: Collection[str] = (), secrets: Iterable[str | None] = ()
    ) -> None:
        self._secret_keys = frozenset(secret_keys)
        values = secret_values(config, self._secret_keys) if config is not None else set()
        values.update(s for s in secrets if s)
        self._values = frozenset(values)

    def __call__(self, text: object) -> str:
        """``str(text)`` redacted (see :func:`redact_text`)."""
        return _redact(str(text), self._values, self._secret_keys)

    def config(self, config: Any) -> Any:
        """:func:`redact_config` with this redactor's secret key names."""
        return redact_config(config, self._secret_keys)

    def __repr__(self) -> str:
        return f"Redactor({len(self._values)} secret values)"


__all__ = [
    "REDACTED",
    "Redactor",
    "is_secret_key",
    "key_segments",
    "redact_config",
    "redact_text",
    "redact_url",
    "secret_values",
]

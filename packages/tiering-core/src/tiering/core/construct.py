"""Building a configured class: check the call against its signature, label every error with its config keys.

A class named by a config (a secondary tier, a cache policy, an out-of-tree
spec) is called with arguments the factory supplies. When the call does not
fit the constructor, or the constructor raises, the user must learn *which
config entry* is at fault and what the constructor should look like, not
read a bare ``TypeError: __init__() takes 2 positional arguments but 3 were
given``. :func:`construct` does that for every factory,
and passes each message through :mod:`tiering.core.redact` so no credential
of the config reaches it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def qualified_name(cls: type) -> str:
    """``module.QualName`` of a class, for messages."""
    return f"{cls.__module__}.{cls.__qualname__}"


def signature_text(cls: type) -> str:
    """The constructor signature of ``cls`` without its return annotation (``"(capacity: int)"``), or ``"(...)"``."""
    try:
        return str(inspect.signature(cls)).split(" -> ")[0]
    except (TypeError, ValueError):
        return "(...)"


def label_error(exc: Exception, label: str, redact: Callable[[object], str]) -> Exception:
    """Prefix ``exc``'s message with ``label`` (e.g. ``"secondary_tiers[1].root"``) and redact it, in place.

    The exception keeps its type, attributes and traceback, so callers that
    catch ``OSError`` or a tier's own exception type still do. An ``OSError``
    with an errno keeps it (``[Errno 13] secondary_tiers[0].root: Permission
    denied: '/kv'``). A message that already names ``label``, or an empty
    ``label``, is only redacted.

    Returns:
        ``exc`` itself, for ``raise label_error(...)``.
    """
    prefix = f"{label}: " if label and label not in str(exc) else ""
    if isinstance(exc, OSError) and exc.errno is not None and exc.strerror is not None:
        exc.strerror = prefix + redact(exc.strerror)
        if isinstance(exc.filename, str):
            exc.filename = redact(exc.filename)
        if isinstance(exc.filename2, str):
            exc.filename2 = redact(exc.filename2)
        return exc
    text = str(exc) if exc.args else type(exc).__name__
    message = prefix + redact(text)
    if exc.args or prefix:
        exc.args = (message,)
    if isinstance(exc, ImportError):
        exc.msg = message  # ImportError's str() is its msg, not its args
    return exc


def config_key_of(config: Mapping[str, Any], exc: BaseException) -> str | None:
    """The config key an error is about, where it can be told: ``root`` for an error on ``/kv/ab/c.blk``.

    A key is named when an ``OSError``'s ``filename`` is the key's string value
    or lies under it (the first such key); else when the message names exactly
    one given key quoted (``check 'bucket'``); else when exactly one key's
    string value (3 characters or more) appears quoted in the message (of
    several, the one whose name the message also gives). A value quoted in
    passing (the endpoint a missing bucket was looked for at) is never blamed
    when the message names the key at fault.
    """
    filename = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    if isinstance(filename, str) and filename:
        for key, value in config.items():
            if isinstance(value, str) and value and (filename == value or filename.startswith(value.rstrip("/") + "/")):
                return str(key)
    text = str(exc)
    named = [str(key) for key in config if f"'{key}'" in text or f'"{key}"' in text]
    if len(named) == 1:
        return named[0]
    quoted = [
        str(key)
        for key, value in config.items()
        if isinstance(value, str) and len(value) >= 3 and (f"'{value}" in text or f'"{value}' in text)
    ]
    if len(quoted) > 1:  # several values quoted: keep the keys the message also names
        quoted = [key for key in quoted if key in text]
    return quoted[0] if len(quoted) == 1 else None


def check_callable(
    cls: type,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    label: str,
    expected: str,
    redact: Callable[[object], str],
    partial: bool = False,
) -> None:
    """Whether ``cls(*args, **kwargs)`` could be called, found by inspection alone (nothing is constructed).

    The arguments are those of :func:`construct` (only their names and number
    matter, not their values); with ``partial`` only whether the constructor
    takes these arguments is checked, required ones may be missing.

    Raises:
        TypeError: the call does not fit the constructor's signature, or the
            class is abstract; the message gives ``label``, the class, its
            signature and ``expected``.
    """
    name = qualified_name(cls)
    try:
        signature = inspect.signature(cls)
        (signature.bind_partial if partial else signature.bind)(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(
            f"{label}: {name}{signature_text(cls)} cannot be called as {name}{expected}: {redact(exc)}"
        ) from None
    except ValueError:
        pass  # no introspectable signature: let the call itself say
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise TypeError(f"{label}: {name} is abstract; it must implement {missing}")


def construct(
    cls: type[T],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    label: str,
    expected: str,
    redact: Callable[[object], str],
    label_raised: bool = True,
) -> T:
    """Call ``cls(*args, **kwargs)``, naming the config entry in every error.

    Args:
        cls: the resolved class.
        args: the positional arguments the factory passes.
        kwargs: the keyword arguments the factory passes.
        label: the config entry and keys, e.g. ``"spec_name 'MySpec' (spec_module_path 'my_specs')"``.
        expected: the constructor signature the factory calls, e.g.
            ``"(extra_config: Mapping[str, Any], engine_config: Any = None)"``.
        redact: removes the config's credentials from a message (a :class:`~tiering.core.redact.Redactor`).
        label_raised: also label errors the constructor raises itself (False
            for first-party classes whose messages already name the key).

    Raises:
        TypeError: the call does not fit the constructor's signature, or the
            class is abstract; the message gives ``label``, the class, its
            signature and ``expected``.
        Exception: whatever the constructor raises, labelled by :func:`label_error`.
    """
    check_callable(cls, args, kwargs, label=label, expected=expected, redact=redact)
    try:
        return cls(*args, **kwargs)
    except Exception as exc:
        if label_raised:
            label_error(exc, label, redact)
        raise


__all__ = ["check_callable", "config_key_of", "construct", "label_error", "qualified_name", "signature_text"]

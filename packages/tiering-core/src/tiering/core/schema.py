"""Config checking for tiers: each tier declares its keys once, in a :class:`ConfigSchema`.

A schema lists every key of a ``secondary_tiers`` entry (name, type,
required or default, range or choices, secret). :meth:`ConfigSchema.validate`
checks an entry without side effects (no file, socket or thread is touched:
``tiering check`` without ``--probe`` relies on it) and returns it normalized
(defaults filled in, ints given for floats widened, sizes written with a
unit such as ``"4GiB"`` as integers of bytes). Each kind of mistake has
its own exception type, all subclasses of :class:`TierConfigError` (a
``ValueError``):

=====================  ==============================================  =====================
mistake                exception                                       also a
=====================  ==============================================  =====================
a required key absent  :class:`MissingKeyError`                        ``ValueError``
a key not in schema    :class:`UnknownKeyError`                        ``TypeError`` (compat)
a value of wrong type  :class:`InvalidTypeError`                       ``TypeError`` (compat)
out of range / choice  :class:`InvalidValueError`                      ``ValueError``
=====================  ==============================================  =====================

A number must be finite: NaN and infinities are refused for every numeric key (NaN would pass
every range check, and one would make a cost model decline every load or a bound hold nothing).

Messages name the entry and key: ``secondary_tiers[1].capacity_bytes: must be
an integer >= 1, got -5 (tier 'fs')`` when the factory passes the entry label
(``entry="secondary_tiers[1]"``), ``tier 'fs': capacity_bytes: ...`` otherwise;
:meth:`TierConfigError.with_entry` re-labels an error raised without one.
The schema's secret keys (:attr:`ConfigSchema.secret_keys`) are what
redaction hides.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from tiering.core.redact import REDACTED
from tiering.core.units import parse_duration, parse_size

RESERVED_KEYS = frozenset({"type", "module_path"})
"""Keys of a ``secondary_tiers`` entry that select the class; never part of a tier's schema."""


class TierConfigError(ValueError):
    """A mistake in one ``secondary_tiers`` entry.

    Attributes:
        tier: the tier type (``"fs"``...).
        key: the offending key ("" when the mistake is not about one key).
        problem: what is wrong, without the entry/key prefix.
        entry: the entry label (``"secondary_tiers[1]"``), None when unknown.
    """

    def __init__(self, tier: str, key: str, problem: str, entry: str | None = None) -> None:
        self.tier = tier
        self.key = key
        self.problem = problem
        self.entry = entry
        super().__init__(self._message())

    def _message(self) -> str:
        if self.entry:
            where = f"{self.entry}.{self.key}" if self.key else self.entry
            return f"{where}: {self.problem} (tier {self.tier!r})"
        where = f"tier {self.tier!r}: {self.key}" if self.key else f"tier {self.tier!r}"
        return f"{where}: {self.problem}"

    def with_entry(self, entry: str) -> TierConfigError:
        """The same error (same type) labelled with ``entry`` (e.g. ``"secondary_tiers[1]"``)."""
        return type(self)(self.tier, self.key, self.problem, entry)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle support (the message is rebuilt from the parts)."""
        return (type(self), (self.tier, self.key, self.problem, self.entry))


class MissingKeyError(TierConfigError):
    """A required key is absent."""


class UnknownKeyError(TierConfigError, TypeError):
    """A key the tier does not declare (also a ``TypeError``, as the factory raised before)."""


class InvalidTypeError(TierConfigError, TypeError):
    """A value of the wrong type (also a ``TypeError``, as tiers raised before)."""


class InvalidValueError(TierConfigError):
    """A value of the right type outside its range or choices."""


_TYPE_WORDS: dict[type, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    dict: "an object",
    list: "a list",
}


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    """One key of a tier's config.

    Attributes:
        name: the key.
        types: accepted Python types (``int``: bools rejected; ``float``:
            ints accepted and widened; ``str``; ``bool``; ``dict``; ``list``).
        required: True when the entry must give it.
        default: the value when absent (ignored when ``required``).
        nullable: whether ``null`` / None is accepted.
        minimum: inclusive lower bound for numbers.
        maximum: inclusive upper bound for numbers.
        exclusive_minimum: True makes ``minimum`` exclusive (``> 0`` seconds).
        choices: the allowed values (compared with ``==``).
        non_empty: strings (and containers) must not be empty.
        secret: a credential: redacted from every output.
        size: a byte count: besides an integer, a size with a unit
            (``"4GiB"``, ``"500MB"``; :func:`tiering.core.units.parse_size`)
            is accepted and normalized to an integer of bytes.
        duration: a number of seconds: besides a number, a duration with a
            unit (``"90s"``, ``"30m"``, ``"1h"``, ``"7d"``;
            :func:`tiering.core.units.parse_duration`) is accepted and
            normalized to seconds (an integer where only ``int`` is declared).
        check: extra check, returns a problem text or None (must be side-effect free).
        doc: one line for docs and ``tiering check``.
    """

    name: str
    types: tuple[type, ...]
    required: bool = False
    default: Any = None
    nullable: bool = False
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple[Any, ...] = ()
    non_empty: bool = False
    secret: bool = False
    size: bool = False
    duration: bool = False
    check: Callable[[Any], str | None] | None = None
    doc: str = ""

    def describe(self) -> str:
        """What a valid value looks like, e.g. ``"an integer >= 1"`` or ``one of 'auto', 'stat'``."""
        if self.choices:
            text = "one of " + ", ".join(_show(c) for c in self.choices)
        else:
            text = " or ".join(_TYPE_WORDS.get(t, t.__name__) for t in self.types)
            if self.non_empty:
                text = f"a non-empty {text.removeprefix('a ').removeprefix('an ')}"
            bounds = []
            if self.minimum is not None:
                bounds.append(f"{'>' if self.exclusive_minimum else '>='} {_show(self.minimum)}")
            if self.maximum is not None:
                bounds.append(f"<= {_show(self.maximum)}")
            if bounds:
                text += " " + " and ".join(bounds)
            if self.size:
                text += " (bytes) or a size with a unit (e.g. '4GiB', '500MB')"
            if self.duration:
                text += " (seconds) or a duration with a unit (e.g. '90s', '30m', '1h', '7d')"
        return text + (" or null" if self.nullable else "")


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value)


EntryCheck = Callable[[Mapping[str, Any]], "tuple[str, str] | None"]
"""A check of keys that go together: given the normalized entry (every key, defaults filled in), returns
``(key at fault, problem)`` or None. Must be side-effect free (it may look at files, never create one)."""


class ConfigSchema:
    """The declared keys of one tier type.

    Args:
        tier: the tier type name used in messages (``"fs"``).
        keys: every accepted key.
        checks: checks of keys that go together (``aws_access_key_id`` needs
            ``aws_secret_access_key``), run by :meth:`validate` after every
            value passed its own key's checks, in order; the first problem is
            raised as :class:`InvalidValueError` naming the key it returns.

    Raises:
        ValueError: two keys share a name, or a key uses a reserved name (``type``, ``module_path``).
    """

    def __init__(self, tier: str, keys: Sequence[ConfigKey], checks: Sequence[EntryCheck] = ()) -> None:
        names = [k.name for k in keys]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tier {tier!r}: config keys declared twice: {', '.join(dupes)}")
        reserved = sorted(RESERVED_KEYS & set(names))
        if reserved:
            raise ValueError(f"tier {tier!r}: config keys use reserved names: {', '.join(reserved)}")
        self.tier = tier
        self.keys: dict[str, ConfigKey] = {k.name: k for k in keys}
        self.checks: tuple[EntryCheck, ...] = tuple(checks)

    @property
    def secret_keys(self) -> frozenset[str]:
        """Names of the keys marked ``secret``."""
        return frozenset(k.name for k in self.keys.values() if k.secret)

    def defaults(self) -> dict[str, Any]:
        """The default of every optional key."""
        return {k.name: k.default for k in self.keys.values() if not k.required}

    def validate(
        self, config: Mapping[str, Any], entry: str | None = None, also_accepted: Collection[str] = ()
    ) -> dict[str, Any]:
        """Check one entry and return it normalized; no side effects.

        Args:
            config: the entry (``type`` and ``module_path`` are ignored).
            entry: label for messages, e.g. ``"secondary_tiers[1]"``.
            also_accepted: keys the entry may hold that another schema checks (the admission keys, removed
                before this one is called): named in an unknown key's list of accepted keys.

        Returns:
            Every declared key: given values (ints widened to float where a
            float is declared) and defaults for the rest.

        Raises:
            UnknownKeyError: a key is not declared (checked first).
            MissingKeyError: a required key is absent.
            InvalidTypeError: a value has the wrong type.
            InvalidValueError: a value is out of range or not a choice
                (keys are checked in declaration order; the first mistake is raised),
                or keys that go together do not (the schema's ``checks``).
        """
        if not isinstance(config, Mapping):
            raise InvalidTypeError(self.tier, "", f"the entry must be an object, got {config!r}", entry)
        unknown = sorted(k for k in config if k not in self.keys and k not in RESERVED_KEYS)
        if unknown:
            accepted = ", ".join(sorted({*self.keys, *also_accepted})) or "none"
            raise UnknownKeyError(self.tier, unknown[0], f"unknown key; accepted keys: {accepted}", entry)
        out: dict[str, Any] = {}
        for spec in self.keys.values():
            if spec.name not in config:
                if spec.required:
                    raise MissingKeyError(self.tier, spec.name, f"required; expected {spec.describe()}", entry)
                out[spec.name] = spec.default
                continue
            out[spec.name] = self.check_value(spec.name, config[spec.name], entry)
        for check in self.checks:
            found = check(out)
            if found is not None:
                key, problem = found
                raise InvalidValueError(self.tier, key, problem, entry)
        return out

    def parse_sizes(self, config: Mapping[str, Any], entry: str | None = None) -> dict[str, Any]:
        """A copy of ``config`` in which every size written with a unit (``"4GiB"``) is an integer of bytes.

        Only keys declared with ``size=True`` are read; everything else is kept as given.

        Raises:
            InvalidValueError: such a key's string is not a size.
        """
        return {
            k: self.check_value(k, v, entry) if isinstance(v, str) and k in self.keys and self.keys[k].size else v
            for k, v in config.items()
        }

    def check_value(self, name: str, value: Any, entry: str | None = None) -> Any:
        """Check one value of key ``name``; returns it normalized (a size with a unit as an integer of bytes).

        Raises:
            UnknownKeyError: ``name`` is not declared.
            InvalidTypeError: the value has the wrong type.
            InvalidValueError: the value is out of range or not a choice.
        """
        spec = self.keys.get(name)
        if spec is None:
            raise UnknownKeyError(self.tier, name, f"unknown key; accepted keys: {', '.join(sorted(self.keys))}", entry)
        shown = REDACTED if spec.secret else _show(value)
        expected = spec.describe()
        if value is None:
            if spec.nullable:
                return None
            raise InvalidTypeError(self.tier, name, f"must be {expected}, got null", entry)
        if spec.size and isinstance(value, str):
            try:
                value = parse_size(value)
            except ValueError:
                raise InvalidValueError(self.tier, name, f"must be {expected}, got {shown}", entry) from None
        if spec.duration and isinstance(value, str):
            try:
                value = parse_duration(value)
            except ValueError:
                raise InvalidValueError(self.tier, name, f"must be {expected}, got {shown}", entry) from None
            if int in spec.types and float not in spec.types:
                if not value.is_integer():  # "1.5s" where whole seconds are declared
                    raise InvalidValueError(self.tier, name, f"must be {expected}, got {shown}", entry)
                value = int(value)
        if not _type_ok(value, spec.types):
            raise InvalidTypeError(self.tier, name, f"must be {expected}, got {shown}", entry)
        if float in spec.types and int not in spec.types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if spec.choices and value not in spec.choices:
            raise InvalidValueError(self.tier, name, f"must be {expected}, got {shown}", entry)
        if spec.non_empty and hasattr(value, "__len__") and len(value) == 0:
            raise InvalidValueError(self.tier, name, f"must be {expected}, got {shown}", entry)
        if isinstance(value, float) and not math.isfinite(value):  # NaN passes every bound check: refused here
            raise InvalidValueError(self.tier, name, f"must be a finite number ({expected}), got {shown}", entry)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            low, high = spec.minimum, spec.maximum
            if (low is not None and (value <= low if spec.exclusive_minimum else value < low)) or (
                high is not None and value > high
            ):
                raise InvalidValueError(self.tier, name, f"must be {expected}, got {shown}", entry)
        if spec.check is not None:
            problem = spec.check(value)
            if problem:
                raise InvalidValueError(self.tier, name, f"{problem}, got {shown}", entry)
        return value

    def redact(self, config: Mapping[str, Any], marker: str = REDACTED) -> dict[str, Any]:
        """A copy of ``config`` with the values of secret keys replaced by ``marker`` (top level only)."""
        secrets = self.secret_keys
        return {k: (marker if k in secrets and v is not None else v) for k, v in config.items()}


def _type_ok(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    if float in types and isinstance(value, int):
        return True
    return isinstance(value, types)

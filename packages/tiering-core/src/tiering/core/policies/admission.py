"""Admission to a secondary tier: which blocks a store writes there (``admission`` of a ``secondary_tiers`` entry).

- ``"always"`` (the default): every block stored is written to the tier (write-through).
- ``"second_sighting"``: a block is written to the tier only once it has
  been seen before. Most blocks of a serving trace are used once (three in
  four of the shipped Mooncake conversation trace's), and writing them wears
  a disk out for no hit.

A *sighting* is one request using a block, counted by the manager
(:class:`~tiering.core.runtime.manager.TieringManager`) once per request and block:
the request stored it (computed it), or loaded it from any tier, the CPU
primary tier included. Lookups are not sightings (the scheduler repeats
them at every step). So a block computed once is declined; when a second
request uses it, it is written to the tier then, from the primary tier if
it is still there (its load is the second sighting), else at its second
store after it was recomputed.

The counts live in a :class:`~tiering.core.policies.sketch.FrequencySketch`
per tier (TinyLFU: bounded memory, ``admission_sketch_bytes``, halved
periodically), touched only on the scheduler's thread: no lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tiering.core.base import OffloadKey
from tiering.core.policies.sketch import MAX_SKETCH_BYTES, MIN_SKETCH_BYTES, FrequencySketch
from tiering.core.schema import ConfigKey, ConfigSchema, InvalidValueError

if TYPE_CHECKING:
    from tiering.core.runtime.metrics import StackMetrics

__all__ = [
    "ADMISSION_KEYS",
    "ALWAYS",
    "SECOND_SIGHTING",
    "AdmissionConfig",
    "AdmissionPolicy",
    "StackAdmission",
    "admission_config",
    "refuse_admission",
    "split_admission",
    "split_entry",
]

ADMISSION_POLICIES = ("always", "second_sighting")
"""The values of ``admission`` (:mod:`tiering.core.policies.admission`), the default first."""

ADMISSION_KEYS = (
    ConfigKey(
        "admission",
        (str,),
        default=ADMISSION_POLICIES[0],
        choices=ADMISSION_POLICIES,
        doc="which stored blocks are written to the tier: every one, or those seen before (frequency >= 2)",
    ),
    ConfigKey(
        "admission_sketch_bytes",
        (int,),
        default=None,
        nullable=True,
        minimum=MIN_SKETCH_BYTES,
        maximum=MAX_SKETCH_BYTES,
        size=True,
        doc="memory of the second_sighting frequency sketch (default 1MiB: about 256K recent blocks)",
    ),
)
"""Keys every ``secondary_tiers`` entry accepts besides its tier's own: the core applies them, not the tier."""

ADMISSION_KEY_NAMES = frozenset(k.name for k in ADMISSION_KEYS)


def _sketch_needs_policy(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    if entry["admission_sketch_bytes"] is not None and entry["admission"] != "second_sighting":
        return "admission_sketch_bytes", f"is used only with admission 'second_sighting', not {entry['admission']!r}"
    return None


def admission_schema(tier: str) -> ConfigSchema:
    """The schema of the admission keys (:data:`ADMISSION_KEYS`) of a tier of type ``tier`` (for messages)."""
    return ConfigSchema(tier, ADMISSION_KEYS, checks=[_sketch_needs_policy])


ALWAYS, SECOND_SIGHTING = ADMISSION_POLICIES
DEFAULT_SKETCH_BYTES = 1024 * 1024
"""Default memory of a tier's frequency sketch (``admission_sketch_bytes``): about 256K blocks seen lately."""
ADMIT_AT = 2
"""Sightings a block needs before ``second_sighting`` writes it."""


@dataclasses.dataclass(frozen=True)
class AdmissionConfig:
    """One tier's admission settings.

    Attributes:
        policy: ``"always"`` or ``"second_sighting"``.
        sketch_bytes: memory of the frequency sketch, bytes (``second_sighting`` only).
    """

    policy: str = ALWAYS
    sketch_bytes: int = DEFAULT_SKETCH_BYTES


def split_admission(tier_config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``tier_config`` split into (the tier's own keys, the admission keys): the tier never sees the latter."""
    own = {k: v for k, v in tier_config.items() if k not in ADMISSION_KEY_NAMES}
    return own, {k: v for k, v in tier_config.items() if k in ADMISSION_KEY_NAMES}


def split_entry(tier_type: str, tier_config: Mapping[str, Any], entry: str) -> dict[str, Any]:
    """The tier's own keys of an entry, its admission keys checked and left out (the factory's policy hook).

    The factory (:func:`tiering.core.factory.resolve_tier`) calls it by name for every entry it resolves.

    Raises:
        TierConfigError: a bad admission key, named ``<entry>.<key>``.
    """
    own, admission = split_admission(tier_config)
    admission_schema(tier_type).validate(admission, entry=entry)
    return own


def admission_config(tier_config: Mapping[str, Any], index: int = 0) -> AdmissionConfig:
    """The admission settings of entry ``secondary_tiers[index]``.

    Raises:
        TierConfigError: a bad ``admission`` or ``admission_sketch_bytes``, named as
            ``secondary_tiers[<index>].<key>`` (no side effects: ``tiering check`` relies on it).
    """
    tier_type = str(tier_config.get("type", "?"))
    keys = admission_schema(tier_type).validate(split_admission(tier_config)[1], entry=f"secondary_tiers[{index}]")
    return AdmissionConfig(keys["admission"], keys["admission_sketch_bytes"] or DEFAULT_SKETCH_BYTES)


def refuse_admission(tier_config: Mapping[str, Any], entry: str, runner: str) -> None:
    """Refuse an admission policy where ``runner`` (e.g. ``"vLLM's own manager"``) decides what is written.

    Only tiering's own manager applies the admission keys; vLLM's manager, SGLang's HiCache and
    LMCache hand the tier every block they chose themselves.

    Raises:
        InvalidValueError: ``admission`` other than ``"always"``, or ``admission_sketch_bytes`` given;
            the message names ``<entry>.<key>`` and ``runner``.
    """
    given = split_admission(tier_config)[1]
    if given and given != {"admission": ALWAYS}:
        key = "admission" if given.get("admission", ALWAYS) != ALWAYS else next(iter(given.keys() - {"admission"}))
        problem = (
            f"applied only by tiering's own manager (standalone, tiering bench); under {runner}, which decides "
            "what reaches the tier, remove it"
        )
        raise InvalidValueError(str(tier_config.get("type", "?")), key, problem, entry)


class AdmissionPolicy:
    """``second_sighting`` for one tier: counts sightings, filters the blocks a store would write.

    Args:
        config: the tier's settings.
    """

    def __init__(self, config: AdmissionConfig) -> None:
        self.sketch = FrequencySketch(config.sketch_bytes)
        # The estimates of the last sighting's keys: a store asks about the keys it has just
        # counted, so the sketch is not hashed twice per block on the scheduler's thread.
        self._last: dict[OffloadKey, int] = {}

    def seen(self, keys: Sequence[OffloadKey]) -> None:
        """Count one sighting of each of ``keys`` (one request used them)."""
        record = self.sketch.record
        self._last = {key: record(key) for key in keys}

    def admit(self, keys: Sequence[OffloadKey]) -> list[OffloadKey]:
        """The keys (in order) seen at least twice lately: those to write."""
        last, estimate = self._last, self.sketch.estimate
        return [key for key in keys if (last.get(key) or estimate(key)) >= ADMIT_AT]


class StackAdmission:
    """The admission policies of a stack's secondary tiers, with their counters (the manager's helper).

    Args:
        configs: settings per tier, in order; tiers beyond them admit always.
        metrics: where the decisions are counted (``store_admission_total``, blocks,
            by ``outcome``: ``admitted`` or ``declined``).
        tier_labels: the metric labels of each secondary tier (their number is the number of tiers).

    Attributes:
        policies: per tier, its policy, None for ``always``.

    Raises:
        ValueError: more configs than tiers, or an unknown policy name.
    """

    def __init__(
        self, configs: Sequence[AdmissionConfig], metrics: StackMetrics, tier_labels: Sequence[dict[str, str]]
    ) -> None:
        tiers = len(tier_labels)
        if len(configs) > tiers:
            raise ValueError(f"{len(configs)} admission settings for {tiers} secondary tiers")
        self.policies: list[AdmissionPolicy | None] = []
        for i, config in enumerate([*configs, *[AdmissionConfig()] * (tiers - len(configs))]):
            if config.policy not in (ALWAYS, SECOND_SIGHTING):
                raise ValueError(f"secondary tier {i}: unknown admission policy {config.policy!r}")
            self.policies.append(AdmissionPolicy(config) if config.policy == SECOND_SIGHTING else None)
        self._active = [(idx, policy) for idx, policy in enumerate(self.policies) if policy is not None]
        self._metrics = metrics
        self._labels = tier_labels

    def seen(self, keys: Sequence[OffloadKey]) -> list[int]:
        """Count a sighting of ``keys`` in every policy; returns the indices of the tiers that have one."""
        for _, policy in self._active:
            policy.seen(keys)
        return [idx for idx, _ in self._active]

    def admit(self, idx: int, keys: Sequence[OffloadKey]) -> Sequence[OffloadKey]:
        """The ``keys`` tier ``idx`` admits, in order (all of them without a policy); decisions are counted."""
        policy = self.policies[idx]
        if policy is None or not keys:
            return keys
        admitted = policy.admit(keys)
        for outcome, blocks in (("admitted", len(admitted)), ("declined", len(keys) - len(admitted))):
            self._metrics.inc("store_admission_total", {**self._labels[idx], "outcome": outcome}, blocks)
        return admitted

"""Bench tooling: the fs tier made slow on purpose, buildable from a config entry alone.

A tool provides no tier through the ``tiering.tiers`` entry points (that group is the backends'), so this
one is reached by ``module_path``: importing this module registers it in-process as ``throttled_fs``, and
the module hands vLLM's factory its vLLM tier class by attribute, e.g. in vLLM's ``secondary_tiers``::

    {"type": "tiering_throttled_fs", "module_path": "tiering.cli.bench.throttled_fs",
     "root": "/tmp/tier", "latency_s": 0.03, "bytes_per_s": "6MiB"}

(tiering's own config: ``{"type": "throttled_fs", "module_path": "tiering.cli.bench.throttled_fs", ...}``).
It is an fs tier (every ``fs`` key, checked as the fs tier checks them) whose
load reports are held back by :class:`~tiering.cli.bench.throttle.ThrottledTier`:
``latency_s`` per load job plus the job's bytes at ``bytes_per_s``. It stands
for a remote tier slower than recompute in benchmarks (``scripts/bench_serve.py``);
it is no product tier. Needs tiering-fs: without it the module still imports
and building one raises ``ImportError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from tiering.cli.bench.throttle import ThrottledTier
from tiering.core.factory import SecondaryTierFactory, register_tier
from tiering.core.schema import ConfigKey, ConfigSchema

if TYPE_CHECKING:
    from tiering.core.spec import OffloadingSpec

NAME = "throttled_fs"
"""The tier's name: its ``type`` in tiering's config; vLLM's is ``tiering_throttled_fs``."""

THROTTLE_KEYS = (
    ConfigKey("latency_s", (float,), required=True, minimum=0, duration=True, doc="seconds added to each load job"),
    ConfigKey(
        "bytes_per_s",
        (int, float),
        nullable=True,
        minimum=0,
        exclusive_minimum=True,
        size=True,
        doc="load bandwidth in bytes per second (null: unlimited)",
    ),
)
"""The keys a ``throttled_fs`` entry adds to the fs tier's."""

THROTTLE_SCHEMA = ConfigSchema(NAME, THROTTLE_KEYS)
"""The checks of :data:`THROTTLE_KEYS` alone (for a direct construction)."""


def throttled_fs_schema() -> ConfigSchema | None:
    """Every key of a ``throttled_fs`` entry: the fs tier's plus :data:`THROTTLE_KEYS`; None without tiering-fs.

    The fs tier comes from the registry (its ``tiering.tiers`` entry point): a tool imports no tier's package.
    """
    if "fs" not in SecondaryTierFactory.known_names():
        return None
    fs = SecondaryTierFactory.get_class("fs").config_schema
    if fs is None:
        return None
    return ConfigSchema(NAME, [*fs.keys.values(), *THROTTLE_KEYS], fs.checks)


class ThrottledFsTier(ThrottledTier):
    """An fs tier whose loads are reported ``latency_s + bytes / bytes_per_s`` after submission (bench tooling).

    Args:
        offloading_spec, primary_kv_view, tier_type: as every tier (the factory's call).
        latency_s: seconds added to each load job (>= 0; a duration such as ``"2s"`` is accepted).
        bytes_per_s: load bandwidth, bytes per second (> 0; a size such as ``"6MiB"`` is accepted),
            None for unlimited.
        **fs_keys: the fs tier's keys (``root`` required), given to the tier installed as ``fs``.

    Raises:
        InvalidTypeError, InvalidValueError: a bad ``latency_s`` or ``bytes_per_s`` (the message names the key).
        MissingKeyError, UnknownKeyError, ...: as the fs tier for its keys.
        ImportError: tiering-fs is not installed.
    """

    medium: ClassVar[str] = "storage"
    config_schema: ClassVar[ConfigSchema | None] = throttled_fs_schema()

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        *,
        latency_s: Any,
        bytes_per_s: Any = None,
        **fs_keys: Any,
    ) -> None:
        # Checked here too: a direct construction bypasses the factory's schema check.
        latency = THROTTLE_SCHEMA.check_value("latency_s", latency_s)
        bandwidth = THROTTLE_SCHEMA.check_value("bytes_per_s", bytes_per_s)
        if self.config_schema is None:
            raise ImportError("tier 'throttled_fs' wraps the fs tier: pip install tiering-fs")
        inner = SecondaryTierFactory.get_class("fs")(offloading_spec, primary_kv_view, tier_type, **fs_keys)
        super().__init__(inner, float(latency), None if bandwidth is None else float(bandwidth))


throttled_fs = ThrottledFsTier  # tiering's factory takes the attribute named by ``type`` from ``module_path``
if NAME not in SecondaryTierFactory.known_names():
    register_tier(NAME, __name__, "ThrottledFsTier")  # the name vLLM's wrapper builds the tier by


def __getattr__(attr: str) -> Any:
    """``tiering_throttled_fs``: the vLLM tier class running this tier (vLLM's factory asks ``module_path`` for it).

    Raises:
        AttributeError: another name.
        ImportError: vLLM is not installed.
    """
    if attr == "tiering_" + NAME:
        from tiering.core.vllm.names import tier_class

        return tier_class(NAME)
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")

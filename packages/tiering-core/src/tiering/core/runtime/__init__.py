"""The standalone runtime: the tiering manager, the stack a spec builds, the guard, metrics and the throttle.

- :mod:`~tiering.core.runtime.manager`: :class:`TieringManager`, the scheduler-side manager outside vLLM;
- :mod:`~tiering.core.runtime.load_records`: its records of loads in flight and finished;
- :mod:`~tiering.core.runtime.stack`: the primary tier, secondary tiers, manager and handlers a spec describes;
- :mod:`~tiering.core.runtime.guard`: :class:`GuardedTier`, no exception of a tier escapes;
- :mod:`~tiering.core.runtime.metrics` / :mod:`~tiering.core.runtime.prometheus`: counters and their exporter;
- :mod:`~tiering.cli.bench.throttle`: a tier made slow on purpose (benchmarks, cost-model tests).
"""

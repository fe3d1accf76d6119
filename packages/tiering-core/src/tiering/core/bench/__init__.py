"""Replays of real and synthetic workloads through a tier stack (``tiering bench``)."""

from tiering.core.bench.payload import payload_for
from tiering.core.bench.replay import Replayer, ReplayReport, VerificationError
from tiering.core.bench.workload import Request, load_mooncake_trace, synthetic_chat

__all__ = [
    "ReplayReport",
    "Replayer",
    "Request",
    "VerificationError",
    "load_mooncake_trace",
    "payload_for",
    "synthetic_chat",
]

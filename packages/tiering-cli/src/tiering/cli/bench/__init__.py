"""Replays of real and synthetic workloads through a tier stack (``tiering bench``)."""

from tiering.cli.bench.payload import payload_for
from tiering.cli.bench.replay import Replayer, ReplayReport, VerificationError
from tiering.cli.bench.workload import Request, load_mooncake_trace, synthetic_chat

__all__ = [
    "ReplayReport",
    "Replayer",
    "Request",
    "VerificationError",
    "load_mooncake_trace",
    "payload_for",
    "synthetic_chat",
]

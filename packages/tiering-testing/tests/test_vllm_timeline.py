"""The timeline tooling of ``bench_engine.py --timeline``: probes on a plain class, and the pure summaries."""

from __future__ import annotations

import pytest

from tiering.testing.vllm_timeline import (
    TIMELINE_DIR_ENV,
    Event,
    Probe,
    install,
    install_from_env,
    milestones,
    read_events,
    side_by_side,
    step_rows,
)


class Base:
    def work(self, n: int) -> int:
        return n * 2


class Child(Base):
    def own(self) -> str:
        return "own"


def test_probes_record_calls_with_notes_and_uninstall_restores(tmp_path):
    sink = tmp_path / "events.jsonl"
    recorder = install(
        [
            Probe(Child, "work", "work", lambda args, result: None if args[1] == 0 else f"{args[1]} -> {result}"),
            Probe(Child, "own", "own"),
        ],
        str(sink),
    )
    child = Child()
    assert child.work(3) == 6 and child.work(0) == 0 and child.own() == "own"
    assert [(e.label, e.note) for e in recorder.events] == [("work", "3 -> 6"), ("own", "")]
    assert all(e.start <= e.end for e in recorder.events)
    assert len(sink.read_text().splitlines()) == 2
    recorder.uninstall()
    assert "work" not in Child.__dict__  # inherited before, inherited again
    assert Child.own.__name__ == "own" and not hasattr(Child.own, "__wrapped__")
    child.work(5)
    assert len(recorder.events) == 2


def test_install_from_env_writes_one_file_per_process(tmp_path, monkeypatch):
    monkeypatch.delenv(TIMELINE_DIR_ENV, raising=False)
    assert install_from_env(()) is None
    monkeypatch.setenv(TIMELINE_DIR_ENV, str(tmp_path))
    recorder = install_from_env(())
    assert recorder is not None
    recorder.mark("first token", 2.0)
    recorder.mark("arrival", 1.0, "req-0")
    assert read_events(str(tmp_path)) == [Event("arrival", 1.0, 1.0, "req-0"), Event("first token", 2.0, 2.0)]


def _warm_request() -> list[Event]:
    # seconds: arrival at 10; step 1 defers the lookup and submits the promotion; step 2 idle; step 3 idle;
    # step 4 sees it reported and hits; step 5 copies; step 6 prefills; first token at 10.100
    return [
        Event("engine step", 9.0, 9.5),  # start-up: before arrival, ignored
        Event("arrival", 10.0, 10.0, "req-0"),
        Event("engine core add_request", 10.0002, 10.0004),
        Event("lookup", 10.001, 10.002, "pending (ask again)"),
        Event("schedule", 10.001, 10.003, "0 tokens"),
        Event("promotion submitted", 10.003, 10.004, "31 blocks"),
        Event("engine step", 10.001, 10.005),
        Event("schedule", 10.006, 10.007, "0 tokens"),
        Event("engine step", 10.006, 10.008),
        Event("engine step", 10.009, 10.010),
        Event("tier I/O done", 10.015, 10.0151, "31 blocks"),
        Event("promotion reported", 10.020, 10.021, "31 blocks, success True"),
        Event("lookup", 10.021, 10.022, "992 tokens"),
        Event("engine step", 10.020, 10.025),
        Event("CPU->engine copy", 10.030, 10.040, "31 blocks"),
        Event("engine step", 10.030, 10.045),
        Event("execute_model", 10.050, 10.090, "8 tokens"),
        Event("engine step", 10.050, 10.095),
        Event("first token", 10.100, 10.100, "req-0"),
        Event("engine step", 10.2, 10.3),  # a decode step: after the first token, ignored
    ]


def test_milestones_are_ms_after_arrival():
    marks = milestones(_warm_request())
    got = {k: None if v is None else (round(v[0], 3), round(v[1], 3)) for k, v in marks.items()}
    assert got == {
        "arrival": (0.0, 0.0),
        "in engine core": (0.2, 0.4),
        "first lookup": (1.0, 2.0),
        "promotion submitted": (3.0, 4.0),
        "tier I/O done": (15.0, 15.1),
        "promotion reported": (20.0, 21.0),
        "lookup hit": (21.0, 22.0),
        "CPU->engine copy": (30.0, 40.0),
        "prefill": (50.0, 90.0),
        "first token": (100.0, 100.0),
    }
    assert milestones([Event("arrival", 1.0, 1.0)])["prefill"] is None
    with pytest.raises(ValueError, match="arrival"):
        milestones([Event("lookup", 1.0, 1.0)])


def test_step_rows_name_what_each_step_ran_and_merge_idle_steps():
    rows = step_rows(_warm_request())
    assert [(round(a, 3), round(b, 3)) for a, b, _ in rows] == [
        (1.0, 5.0),
        (6.0, 10.0),
        (20.0, 25.0),
        (30.0, 45.0),
        (50.0, 95.0),
    ]
    texts = [t for _, _, t in rows]
    assert texts[0] == "lookup pending (ask again) (1.0 ms); promotion submitted 31 blocks (1.0 ms)"
    assert texts[1] == "idle (2 steps)"
    assert texts[2] == "promotion reported 31 blocks, success True (1.0 ms); lookup 992 tokens (1.0 ms)"
    assert texts[3] == "CPU->engine copy 31 blocks (10.0 ms)"
    assert texts[4] == "execute_model 8 tokens (40.0 ms)"
    with pytest.raises(ValueError, match="first token"):
        step_rows(_warm_request()[:-2])


def test_side_by_side_puts_each_milestone_on_one_line():
    lines = side_by_side({"ours": _warm_request(), "theirs": _warm_request()})
    assert lines[0].split() == ["milestone", "(ms)", "ours", "theirs"]
    assert lines[4].split() == ["promotion", "submitted", "3.0-4.0", "3.0-4.0"]
    assert lines[10].split() == ["first", "token", "100.0", "100.0"]
    assert lines[11] == "steps of ours (ms after arrival):"
    assert len(lines) == 1 + 10 + 2 * (1 + 5)

"""Unit tests of the bench command's parts: stop on signal, progress lines, partial replays, stack options."""

import argparse
import io
import os
import signal

import pytest

from tiering.cli.bench import Replayer, load_mooncake_trace
from tiering.cli.bench.interrupt import StopOnSignal
from tiering.cli.bench.progress import Progress
from tiering.cli.bench.workload import resolve_trace
from tiering.cli.main import build_parser, split_tier_options
from tiering.cli.stacks import option_pairs
from tiering.core import TieringOffloadingSpec
from tiering.core.configfile import install_hint, plain_tier_entries
from tiering.testing import requires_tier


def primary_only():
    return TieringOffloadingSpec({"cpu_bytes_to_use": 256 * 1024, "block_bytes": 1024}).get_manager()


def test_first_signal_is_recorded_second_abandons_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignal("t") as stop:
        assert stop.reason() is None and stop.exit_status is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.reason() == "SIGTERM" and not stop.abandon() and stop.exit_status == 143
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.abandon() and stop.reason() == "SIGTERM"  # the first signal decides the status
    assert signal.getsignal(signal.SIGTERM) is before


def test_replay_stopped_between_requests_is_partial_and_verified():
    manager = primary_only()
    requests = list(load_mooncake_trace(resolve_trace("mooncake-conversation"), 50))
    calls = []

    def stop():
        calls.append(1)
        return "SIGINT" if len(calls) > 20 else None

    try:
        report = Replayer(manager, []).run(requests, stop=stop)
    finally:
        manager.shutdown()
    data = report.to_dict()
    assert data["partial"] is True and data["stopped_by"] == "SIGINT"
    assert data["requests"] == 20
    assert data["verified_blocks"] == data["hits_total"]


def test_abandon_ends_the_waits_and_marks_the_report():
    manager = primary_only()
    requests = list(load_mooncake_trace(resolve_trace("mooncake-conversation"), 10))
    replayer = Replayer(manager, [], abandon=lambda: True)
    replayer.manager.has_pending_work = lambda: True  # a drain that would wait for ever
    try:
        report = replayer.run(requests)
    finally:
        manager.shutdown()
    assert report.partial and report.stopped_by == "abandoned" and report.requests == 10


def test_progress_prints_lines_every_interval_when_not_a_terminal():
    out = io.StringIO()
    figures = iter([(10, 3, 12, 5 << 29), (20, 6, 24, 5 << 30)])
    with Progress(40, lambda: next(figures), stream=out, interval_s=0.0, label="b") as progress:
        progress.update()
        progress.update()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("b: 10/40 requests, hit ratio 25.0%, 2.5 GiB moved, ")
    assert lines[1].startswith("b: 20/40 requests, hit ratio 25.0%, 5.0 GiB moved, ")


def test_progress_is_quiet_between_intervals():
    out = io.StringIO()
    with Progress(5, lambda: (1, 0, 0, 0), stream=out, interval_s=3600) as progress:
        for _ in range(5):
            progress.update()
    assert out.getvalue() == ""


def test_tier_options_are_split_from_the_commands_own_arguments():
    parser = build_parser()
    argv = ["ls", "--tier", "s3", "--bucket", "kv", "--json", "--endpoint-url=http://h:9", "--prefix", "a"]
    kept, extra = split_tier_options(parser, argv)
    assert kept == ["ls", "--tier", "s3", "--json"]
    assert option_pairs(extra) == {"bucket": "kv", "endpoint_url": "http://h:9", "prefix": "a"}
    assert split_tier_options(parser, ["bench", "--requests", "5"]) == (["bench", "--requests", "5"], [])
    with pytest.raises(ValueError, match="--bucket needs a value"):
        option_pairs(["--bucket"])


def test_requests_must_be_positive():
    parser = build_parser()
    for value in ("0", "-1", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["bench", "--requests", value])
    assert isinstance(parser.parse_args(["bench"]), argparse.Namespace)


def test_vllm_form_is_read_as_the_plain_tier():
    config = {"secondary_tiers": [{"type": "tiering_xyz", "module_path": "tiering.core.vllm.tiers", "k": 1}]}
    lines = plain_tier_entries(config)
    assert config["secondary_tiers"] == [{"type": "xyz", "k": 1}]
    assert lines == [
        "secondary_tiers[0]: 'tiering_xyz' with module_path 'tiering.core.vllm.tiers' is the vLLM binding's "
        "form of tier 'xyz'; checked as \"type\": 'xyz'"
    ]


def test_install_hint_gives_both_forms():
    assert (
        install_hint("tiering-x")
        == "pip install tiering-x (from a clone of the repository: pip install ./packages/tiering-x)"
    )
    assert "pip install 'tiering-core[plot]'" in install_hint("tiering-core", extra="plot")
    assert "pip install './packages/tiering-core[plot]'" in install_hint("tiering-core", extra="plot")


@requires_tier("fs")
def test_written_bytes_of_a_tier_are_what_it_wrote_not_blocks_it_already_held(tmp_path):
    from tiering.cli.bench.payload import payload_for
    from tiering.core.base import ReqContext, block_view

    config = {
        "cpu_bytes_to_use": 64 * 1024,
        "block_bytes": 1024,
        "secondary_tiers": [{"type": "fs", "root": str(tmp_path)}],
    }
    manager = TieringOffloadingSpec(config).get_manager()
    try:
        replayer = Replayer(manager, ["0:fs"])
        ctx = ReqContext("r0")
        keys = [bytes([i]) * 16 for i in range(3)]
        alloc = manager.prepare_store(keys, ctx)
        for key, block_id in zip(alloc.keys, alloc.block_ids, strict=True):
            block_view(manager.primary.kv_view, block_id)[:] = payload_for(key, 1024)
        manager.complete_store(alloc.keys, ctx)
        replayer.drain()
        # The same blocks cascaded again, as when a later request stores them while the first
        # store is still in flight (the tier's lookup answers None, not True): the tier holds
        # them by the time the second job runs and does not write them again.
        manager._write(0, alloc.keys, ctx)  # the cascade's job, written without asking the tier first
        report = replayer.run([]).to_dict()
    finally:
        manager.shutdown()
    stats = report["tier_stats"]["0:fs"]
    assert stats["blocks_stored"] + stats["stores_already_present"] == 6
    assert report["bytes_stored"]["0:fs"] == stats["blocks_stored"] * 1024 == 3 * 1024

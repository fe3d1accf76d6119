"""What ``tiering bench`` reports and when it checks its arguments: the header, per-tier figures, tokens, units."""

import json

import pytest

from tiering.cli.bench import Replayer, load_mooncake_trace
from tiering.cli.bench.report import describe_stack, format_header, format_report
from tiering.cli.main import main
from tiering.core import TieringOffloadingSpec


def primary_only_config(tmp_path, block_bytes=1024, blocks=64):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": blocks * block_bytes, "block_bytes": block_bytes}))
    return str(path)


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_an_output_file_in_a_missing_directory_is_refused_before_the_replay(tmp_path, capsys, flag):
    target = tmp_path / "nonexistent" / "dir" / "x.png"
    argv = ["bench", "--config", primary_only_config(tmp_path), "--requests", "5", flag, str(target)]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert f"{flag} {target}: the directory {target.parent} does not exist" in err
    assert "measured:" not in out + err  # nothing replayed


def test_an_output_file_that_is_a_directory_is_refused_before_the_replay(tmp_path, capsys):
    argv = ["bench", "--config", primary_only_config(tmp_path), "--requests", "5", "--json", str(tmp_path)]
    assert main(argv) == 2
    assert f"--json {tmp_path}: is a directory; give a file name" in capsys.readouterr().err


def test_a_root_below_a_file_is_refused_before_the_replay(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["bench", "--root", str(tmp_path / "file" / "kv"), "--requests", "5"]) == 2
    out, err = capsys.readouterr()
    assert f"--root {tmp_path / 'file' / 'kv'}: {tmp_path / 'file'} is not a directory" in err
    assert "measured:" not in out + err


def test_block_bytes_option_takes_a_unit(tmp_path, capsys):
    out = tmp_path / "r.json"
    argv = ["bench", "--config", primary_only_config(tmp_path), "--requests", "3", "--block-bytes", "2KiB"]
    assert main([*argv, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["stack"]["block_bytes"] == 2048


def test_tokens_follow_the_traces_input_length_and_throughput_counts_request_bytes(tmp_path):
    trace = tmp_path / "t.jsonl"
    records = [{"hash_ids": [0, 1, 2], "input_length": 1100}, {"hash_ids": [0, 1, 2, 3], "input_length": 1600}]
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))
    manager = TieringOffloadingSpec({"cpu_bytes_to_use": 64 * 1024, "block_bytes": 1024}).get_manager()
    try:
        report = Replayer(manager, []).run(load_mooncake_trace(trace)).to_dict()
    finally:
        manager.shutdown()
    assert (report["block_lookups"], report["hits_total"]) == (7, 3)
    assert (report["tokens_looked_up"], report["token_hits"]) == (1100 + 1600, 3 * 512)
    assert report["token_hit_ratio"] == pytest.approx(1536 / 2700)
    assert report["request_bytes"] == (3 + 4) * 1024  # 3 blocks loaded, 4 stored (3 + 1)
    assert report["throughput_bytes_per_s"] == pytest.approx(report["request_bytes"] / report["wall_s"])
    assert report["tier_stats"]["primary"]["capacity_bytes"] == 64 * 1024


def stack():
    spec = TieringOffloadingSpec({"cpu_bytes_to_use": 1024 * 16384, "block_bytes": 16384, "block_size": 512})
    tiers = [{"name": "0:fs", "capacity_bytes": 256 << 20, "location": "/tmp/kv", "temporary": True}]
    return describe_stack(spec, tiers, 512, default_stack=True)


def test_header_says_what_was_measured_the_stack_and_the_real_block_size():
    header = format_header("mooncake-conversation", 2000, stack()).splitlines()
    assert header[0] == "tiering bench: trace mooncake-conversation, 2,000 requests"
    assert header[1].startswith("measured: the storage path only: no engine, no model, no GPU.")
    assert header[2] == (
        "stack: CPU primary tier 1,024 blocks = 16.0 MiB (lru) -> 0:fs (capped at 256.0 MiB: the default stack's "
        "cap, max(256 MiB, 4 x the primary tier)), blocks written to /tmp/kv (temporary, removed after the run)"
    )
    assert header[3] == (
        "blocks: 512 tokens, 16.0 KiB of payload (32 B/token); scaled down: a Llama-3.1-8B block of 512 tokens "
        "(bf16) is 64.0 MiB (128.0 KiB/token); replay with real sizes: --block-bytes 64MiB --cpu-bytes 1GiB "
        "--requests 10 (a primary tier of 16 blocks; 1,024 would need 64.0 GiB of memory), or --config with your "
        "block_bytes and cpu_bytes_to_use."
    )


def report_data():
    fs = {
        "capacity_bytes": 256 << 20,
        "used_bytes": 13107 * 20480,
        "resident_blocks": 13107,
        "resident_bytes": 13107 * 20480,
        "evictions": 28753,
        "evicted_bytes": 28753 * 20480,
        "store_failed_no_space": 3,
        "store_failed_io_error": 0,
    }
    primary = {"capacity_bytes": 16 << 20, "used_bytes": 16 << 20, "resident_blocks": 1024, "evictions": 0}
    return {
        "stack": stack(),
        "requests": 2000,
        "block_lookups": 1000,
        "tokens_looked_up": 500_000,
        "hits": {"0:fs": 150, "primary": 50},
        "hits_total": 200,
        "token_hits": 102_400,
        "token_hit_ratio": 102_400 / 500_000,
        "misses": 800,
        "miss_ratio": 0.8,
        "verified_blocks": 200,
        "short_loads": 0,
        "blocks_stored": 800,
        "store_rejected": 0,
        "bytes_stored": {"primary": 800 * 16384, "0:fs": 800 * 16384},
        "bytes_loaded": {"primary": 50 * 16384, "0:fs": 150 * 16384},
        "tier_stats": {"0:fs": fs, "primary": primary},
        "latency": [
            {"tier": "0:fs", "kind": "store", "jobs": 1986, "mean": 0.0389, "p50": 0.05, "p90": 0.1, "p99": 0.2}
        ],
        "request_bytes": 1000 * 16384,
        "throughput_bytes_per_s": 1000 * 16384 / 2.0,
        "scheduler_calls": 10,
        "scheduler_call_us": {"p50": 7.4, "p90": 250.0, "p99": 15000.0, "max": 130000.0},
        "wall_s": 2.0,
    }


def test_report_gives_tokens_per_tier_figures_latencies_and_defines_its_terms():
    lines = format_report(report_data()).splitlines()
    assert "lookups            1,000 blocks, 500,000 tokens (the prompts)" in lines
    assert "hits               200 blocks (20.0%), 102,400 tokens (token hit ratio 20.5%)" in lines
    tiers = lines.index("tiers              capacity, used at the end, evictions, failed stores by cause")
    assert lines[tiers + 1 : tiers + 4] == [
        "  primary          capacity 16.0 MiB, used 16.0 MiB (1,024 blocks), evictions 0, failed stores: none",
        "  0:fs             capacity 256.0 MiB, used 256.0 MiB (13,107 blocks), evictions 28,753 (561.6 MiB), "
        "failed stores: no_space 3",
        "  0:fs counts bytes as stored: 20,480 B per 16.0 KiB block (+25%: block header and padding included)",
    ]
    assert "  0:fs store       1,986 jobs: p50 50 ms, p99 200 ms, mean 38.9 ms" in lines
    assert (
        "throughput         7.8 MiB/s: the payload the requests loaded plus stored into the primary tier "
        "(15.6 MiB) over the wall time; a stored block counts once, not again for each tier it is written to"
    ) in lines
    assert any(
        line.startswith("scheduler calls    10 calls into the tiering manager from the request loop") for line in lines
    )
    assert not any(" MB" in line or " GB" in line for line in lines)  # one unit convention: KiB, MiB, GiB

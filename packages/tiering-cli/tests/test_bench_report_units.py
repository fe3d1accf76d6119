"""The report of ``tiering bench``: one block size in tokens, units printed alike."""

import json

from tiering.cli.main import main


def test_the_traces_block_tokens_count_and_the_header_says_so_when_the_config_differs(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 64 * 1024, "block_bytes": 1024, "block_size": 16}))
    out = tmp_path / "r.json"
    assert main(["bench", "--config", str(config), "--requests", "3", "--json", str(out)]) == 0
    text = "\n".join(capsys.readouterr())
    assert (
        "blocks: 512 tokens, 1.0 KiB of payload (2 B/token); scaled down: a Llama-3.1-8B block of 512 tokens"
    ) in text
    assert (
        "; the trace's blocks of 512 tokens are what counts (one per block hash), not the config's block_size 16"
        in text
    )
    report = json.loads(out.read_text())
    assert (report["stack"]["block_tokens"], report["stack"]["config_block_size"]) == (512, 16)


def test_the_header_is_printed_once_when_stdout_and_stderr_share_a_terminal(tmp_path, capsys, monkeypatch):
    from tiering.cli.bench import command

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 64 * 1024, "block_bytes": 1024}))
    argv = ["bench", "--config", str(config), "--requests", "2"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert (out + err).count("measured: the storage path only") == 2  # redirected: the report file has it too
    monkeypatch.setattr(command, "shares_terminal", lambda: True)
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert (out + err).count("measured: the storage path only") == 1
    assert out.startswith("requests ")


def test_shares_terminal_tells_one_terminal_from_pipes(monkeypatch):
    import os
    import pty
    import sys

    from tiering.cli.terminal import shares_terminal

    master, slave = pty.openpty()
    try:
        with open(slave, "w", closefd=False) as tty, open(os.devnull, "w") as null:
            monkeypatch.setattr(sys, "stdout", tty)
            monkeypatch.setattr(sys, "stderr", tty)
            assert shares_terminal()
            monkeypatch.setattr(sys, "stdout", null)
            assert not shares_terminal()
    finally:
        os.close(master)
        os.close(slave)


def test_latencies_are_in_ms_alike_and_sizes_never_read_1024():
    from tiering.cli.bench.report import _ms
    from tiering.core.units import format_bytes

    assert [_ms(s) for s in (16.9e-6, 0.0389, 0.05, 87.8319e-3, 10.0, 0.9e-6)] == [
        "0.017 ms",
        "38.9 ms",
        "50 ms",
        "87.8 ms",
        "10,000 ms",
        "0.0009 ms",
    ]
    assert format_bytes((1 << 30) - 1) == "1.0 GiB"
    assert format_bytes((1 << 20) - 1) == "1.0 MiB"

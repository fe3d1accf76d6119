"""The report of ``tiering bench``: one block size in tokens, units printed alike."""

import json

from tiering.core.cli import main


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

"""The ``tiering`` command's answers to usage mistakes: what was wrong, and what right looks like."""

import json

import pytest

from tiering.cli.main import main
from tiering.testing import requires_tier


def test_bench_help_documents_the_trace_format(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Trace files (--trace FILE.jsonl) use Mooncake's format" in out
    assert 'Required: "hash_ids", a list of integers' in out
    assert 'Optional: "timestamp"' in out


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"timestamp": 0}', "no 'hash_ids'"),
        ('{"hash_ids": 5}', "'hash_ids' must be a list of integers, got 5"),
        ('{"hash_ids": ["a"]}', "'hash_ids' must be a list of integers"),
        ("[1, 2]", "a line must hold a JSON object, got list"),
    ],
)
def test_a_bad_trace_line_is_named_with_what_a_record_looks_like(tmp_path, capsys, line, problem):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"hash_ids": [1, 2]}\n' + line + "\n")
    assert main(["bench", "--trace", str(trace), "--requests", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{trace}:2: not a Mooncake trace record ({problem}" in err
    assert 'a record looks like {"timestamp": 0, "hash_ids": [0, 1, 2]}' in err


def test_bench_root_without_a_local_tier_is_refused_and_creates_nothing(tmp_path, capsys, monkeypatch):
    from tiering.cli.bench import command

    monkeypatch.setattr(command, "default_local_tier", lambda directory: None)  # as with core alone installed
    assert main(["bench", "--root", str(tmp_path / "keep"), "--requests", "5"]) == 2
    err = capsys.readouterr().err
    assert f"--root {tmp_path / 'keep'}: no installed tier keeps blocks in a local directory" in err
    assert "install a tier package whose tier does (the filesystem tier's; the tier packages are listed at http" in err
    assert "/docs/content/index.md" in err
    assert not (tmp_path / "keep").exists()


# -- options that are not the command's ------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["verify", "--root", "{d}", "--samples", "5"],
            "tiering verify: error: unrecognized option --samples (did you mean --sample?)",
        ),
        (
            ["verify", "--jsn"],
            "tiering verify: error: unrecognized option --jsn (did you mean --json?); tier keys (--KEY VALUE) follow",
        ),
        (
            ["ls", "--tier", "example", "--custom-parm", "1"],
            "tiering ls: error: unrecognized option --custom-parm (did you mean --custom-param?)",
        ),
        (
            ["ls", "{c}", "--prefix", "x"],
            "unrecognized option --prefix; with a CONFIG file, tier keys are set in the file",
        ),
    ],
)
@requires_tier("example")
def test_an_unknown_option_is_an_unrecognized_option_not_a_config_key(tmp_path, capsys, argv, message):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20}))
    argv = [a.format(d=tmp_path, c=config) for a in argv]
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "unknown key" not in err and "needs a value" not in err


@requires_tier("example")
def test_tier_keys_still_pass_as_options(capsys):
    assert main(["stat", "--tier", "example", "--custom-param", "3", "--wait", "0"]) == 0
    assert "secondary_tiers[0] example" in capsys.readouterr().out


def test_a_directory_given_as_the_config_points_to_root(tmp_path, capsys):
    assert main(["ls", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"config {tmp_path} is a directory, not a JSON config file" in err
    assert f"tiering ls --root {tmp_path}" in err


def test_a_bad_size_says_what_sizes_look_like(capsys):
    with pytest.raises(SystemExit):
        main(["gc", "--root", "x", "--to-bytes", "10Q"])
    err = capsys.readouterr().err
    assert "argument --to-bytes: size '10Q' is not a number of bytes" in err
    assert "invalid" not in err


def test_a_bad_duration_names_its_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["gc", "--root", "x", "--older-than", "7x"])
    assert info.value.code == 2
    assert (
        "argument --older-than: duration '7x' is not plain seconds (90) or a number with a unit s, m, h, d or w"
        in capsys.readouterr().err
    )


@requires_tier("fs")
def test_stat_block_bytes_takes_a_unit(tmp_path, capsys):
    assert main(["bench", "--root", str(tmp_path), "--requests", "2", "--block-bytes", "64KiB"]) == 0
    capsys.readouterr()
    assert main(["stat", "--root", str(tmp_path), "--block-bytes", "64KiB", "--json"]) == 0
    assert '"resident_blocks"' in capsys.readouterr().out


@requires_tier("fs")
def test_stat_of_an_uncapped_tier_says_unbounded(tmp_path, capsys):
    assert main(["bench", "--root", str(tmp_path), "--requests", "2"]) == 0
    capsys.readouterr()
    assert main(["stat", "--tier", "fs", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "  capacity       unbounded (no capacity_bytes)\n" in out


def test_a_missing_module_path_gets_the_pythonpath_advice_once(tmp_path, capsys):
    config = tmp_path / "c.json"
    tiers = [{"type": "DictTier", "module_path": "no_such_tiers_module"}]
    config.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": tiers}))
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("set PYTHONPATH") == 1, err
    assert err.count("e.g. PYTHONPATH=. when it is in the current directory") == 1, err


def test_a_missing_dependency_of_a_found_module_gets_no_pythonpath_advice(tmp_path, capsys, monkeypatch):
    (tmp_path / "needs_absent.py").write_text("import tiering_absent_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "spec_name": "X", "spec_module_path": "needs_absent"}))
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "No module named 'tiering_absent_dependency_xyz'" in err
    assert "PYTHONPATH" not in err


@pytest.mark.parametrize(("policy", "meant"), [("LRU", "lru"), ("Arc", "arc"), ("lur", "lru")])
def test_eviction_policy_near_misses_get_a_did_you_mean(tmp_path, capsys, policy, meant):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "eviction_policy": policy}))
    assert main(["check", str(config)]) == 2
    assert f"'eviction_policy' is {policy!r} (did you mean {meant!r}?)" in capsys.readouterr().err


def test_version_lists_third_party_tier_packages_found_through_entry_points(tmp_path, capsys, monkeypatch):
    info = tmp_path / "my_tiers_pkg-1.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-tiers-pkg\nVersion: 1.2.0\n")
    (info / "entry_points.txt").write_text("[tiering.tiers]\ndict = my_tiers:DictTier\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit):
        main(["--version"])
    out = capsys.readouterr().out.splitlines()
    assert "my-tiers-pkg 1.2.0 (tiering.tiers: dict)" in out
    assert any(line.startswith("tiering-core ") for line in out)


def test_verbose_is_taken_after_the_subcommand_too():
    from tiering.cli.main import build_parser

    parser = build_parser()
    assert parser.parse_args(["check", "-v", "cfg.json"]).verbose is True
    assert parser.parse_args(["-v", "check", "cfg.json"]).verbose is True
    assert parser.parse_args(["check", "cfg.json"]).verbose is False
    assert parser.parse_args(["ls", "--root", "x", "--verbose"]).verbose is True


INSPECTION = [
    ["check"],
    ["ls"],
    ["stat", "--wait", "30"],
    ["gc", "--to-bytes", "1GiB", "--dry-run"],
    ["verify"],
    ["pin", "--list"],
]


@requires_tier("fs")
@pytest.mark.parametrize("command", INSPECTION, ids=lambda c: c[0])
def test_every_inspection_subcommand_takes_root_and_json_alike(tmp_path, capsys, command):
    root = tmp_path / "kv"
    assert main(["bench", "--root", str(root), "--requests", "2"]) == 0
    capsys.readouterr()
    assert main([*command, "--root", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    tiers = report["tiers"] if isinstance(report, dict) else report
    assert tiers[0]["type"] == "fs" and tiers[0]["index"] == 0


@requires_tier("fs")
def test_check_takes_a_config_with_json_and_a_tier_with_its_keys(tmp_path, capsys):
    config = tmp_path / "c.json"
    entry = {"type": "fs", "root": str(tmp_path / "kv"), "capacity_bytes": "1GiB"}
    config.write_text(json.dumps({"cpu_bytes_to_use": "1MiB", "block_bytes": 16384, "secondary_tiers": [entry]}))
    assert main(["check", "--json", str(config)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["primary"] == {"blocks": 64, "block_bytes": 16384, "bytes": 1 << 20}
    assert report["tiers"][0]["sizes"]["capacity_bytes"] == 1 << 30
    assert main(["check", "--tier", "fs", "--root", str(tmp_path / "kv"), "--capacity-bytes", "2GiB"]) == 0
    assert "capacity_bytes: 2147483648 bytes (2.0 GiB)" in capsys.readouterr().out


def test_pin_usage_says_ttl_is_required_to_pin(capsys):
    with pytest.raises(SystemExit):
        main(["pin", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "(--ttl DURATION (--tokens FILE | --hash-ids IDS | --keys HEX [HEX ...]) | --unpin" in usage
    assert "[--ttl DURATION]" not in usage

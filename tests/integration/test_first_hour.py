"""The first hour of a new user (issue 15), each point through the installed ``tiering`` console script.

Runs in the integration matrix (wheels installed as a user would): what a
test needs (a persistent tier, matplotlib) decides whether it runs.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tiering.core import SecondaryTierFactory
from tiering.core.capabilities import LocalTier

EXE = Path(sys.executable).parent / "tiering"
PROGRESS = "requests, hit ratio"
CAPPED = "(capped at 256.0 MiB: the default stack's cap, max(256 MiB, 4 x the primary tier))"  # 1,024 blocks of 16 KiB


def persistent_tier():
    """The name of the first installed tier with a local default (what `tiering bench` picks), or None."""
    for name in SecondaryTierFactory.known_names():
        cls = SecondaryTierFactory.get_class(name)
        if isinstance(cls, LocalTier) and cls.default_local_config("/nonexistent") is not None:
            return name
    return None


LOCAL = persistent_tier()
needs_local = pytest.mark.skipif(LOCAL is None, reason="no installed tier keeps blocks in a local directory")


@pytest.fixture
def env(tmp_path):
    """TMPDIR points into the test's folder, so a temporary directory left behind is seen."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return dict(os.environ, TMPDIR=str(tmp), PYTHONUNBUFFERED="1")


def tiering(*args, env, timeout=300, cwd=None):
    return subprocess.run(
        [str(EXE), *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd
    )


@needs_local
@pytest.mark.skipif(os.environ.get("TIERING_IT_BACKENDS", "fs") not in ("fs",), reason="the full default run once")
def test_bench_without_arguments_replays_the_shipped_trace_in_a_removed_temporary_directory(env, tmp_path):
    proc = tiering("bench", "--json", tmp_path / "r.json", env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["trace"] == "mooncake-conversation"
    assert report["requests"] == 2000 and not report["partial"]
    assert report["verified_blocks"] == report["hits_total"] > 0
    ((name, where),) = report["locations"].items()
    assert name == f"0:{LOCAL}" and where["temporary"] is True
    assert where["location"].startswith(env["TMPDIR"])
    assert f"0:{LOCAL} {CAPPED}, blocks written to {where['location']} (temporary, removed after" in proc.stdout
    assert PROGRESS in proc.stderr  # stderr is a pipe here: plain progress lines
    assert os.listdir(env["TMPDIR"]) == []  # the temporary directory is gone


def test_bench_without_a_local_tier_says_so_and_replays_through_the_primary(env, tmp_path):
    if LOCAL is not None:
        pytest.skip("a local persistent tier is installed")
    proc = tiering("bench", "--requests", "50", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "no installed tier keeps blocks on a local disk" in proc.stderr
    assert "pip install tiering-<name> (from a clone of the repository: pip install ./packages/tiering-<name>)" in (
        proc.stderr
    )
    assert "the tier packages are listed at https://" in proc.stderr
    assert "every loaded byte matched" in proc.stdout


def test_bench_root_without_a_local_tier_is_refused_and_creates_nothing(env, tmp_path):
    if LOCAL is not None:
        pytest.skip("a local persistent tier is installed")
    proc = tiering("bench", "--root", tmp_path / "keep", "--requests", "50", env=env)
    assert proc.returncode == 2
    assert "no installed tier keeps blocks in a local directory, so nothing would be kept there" in proc.stderr
    assert "the tier packages are listed at https://" in proc.stderr
    assert not (tmp_path / "keep").exists()


@needs_local
@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_during_a_replay_ends_it_cleanly_with_a_partial_report(env, tmp_path, sig, status):
    out = tmp_path / "r.json"
    proc = subprocess.Popen(
        [str(EXE), "bench", "--requests", "2000", "--json", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen = []
    deadline = time.monotonic() + 120
    for line in proc.stderr:  # wait until the replay is under way
        seen.append(line)
        if PROGRESS in line or time.monotonic() > deadline:
            break
    proc.send_signal(sig)
    stdout, rest = proc.communicate(timeout=120)
    stderr = "".join(seen) + rest
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr
    name = signal.Signals(sig).name
    assert f"PARTIAL REPORT: stopped by {name}" in stdout
    report = json.loads(out.read_text())
    assert report["partial"] is True and report["stopped_by"] == name
    assert 0 < report["requests"] < 2000
    assert report["verified_blocks"] == report["hits_total"]
    assert os.listdir(env["TMPDIR"]) == []


def test_requests_must_be_positive(env):
    for value in ("0", "-3", "many"):
        proc = tiering("bench", "--requests", value, env=env)
        assert proc.returncode == 2
        assert "must be a positive integer" in proc.stderr


def test_a_trace_shorter_than_asked_says_so(env, tmp_path):
    trace = tmp_path / "short.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i, "hash_ids": [0, i + 1]}) + "\n" for i in range(5)))
    proc = tiering("bench", "--trace", trace, "--requests", "10", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"the trace {trace} has only 5 requests; replaying all 5" in proc.stderr
    assert "requests           5" in proc.stdout


def test_unknown_trace_name_lists_the_shipped_ones(env):
    proc = tiering("bench", "--trace", "mooncake-conversations", env=env)
    assert proc.returncode == 2
    assert "mooncake-conversation, mooncake-synthetic" in proc.stderr


def test_plot_without_matplotlib_fails_before_the_replay(env, tmp_path):
    try:
        import matplotlib  # noqa: F401

        pytest.skip("matplotlib is installed")
    except ImportError:
        pass
    proc = tiering("bench", "--plot", tmp_path / "p.png", env=env)
    assert proc.returncode == 2
    assert "--plot needs matplotlib: pip install 'tiering-core[plot]'" in proc.stderr
    assert "measured: the storage path only" not in proc.stderr + proc.stdout  # nothing replayed


def test_version_lists_every_installed_tiering_distribution(env):
    from importlib.metadata import version

    proc = tiering("--version", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"tiering-core {version('tiering-core')}" in proc.stdout.splitlines()
    for name in SecondaryTierFactory.known_names():
        provider = SecondaryTierFactory.provider(name)
        if provider:
            assert provider in proc.stdout.splitlines()


@needs_local
def test_root_form_of_ls_stat_verify_gc_sees_what_bench_root_wrote(env, tmp_path):
    root = tmp_path / "bench"
    proc = tiering("bench", "--root", root, "--requests", "100", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"0:{LOCAL} {CAPPED}, blocks written to {root}\n" in proc.stdout
    assert root.is_dir()  # --root is kept
    ls = tiering("ls", "--root", root, "--json", env=env)
    assert ls.returncode == 0, ls.stderr
    ((tier,),) = [json.loads(ls.stdout)]
    ((namespace,),) = [tier["namespaces"]]
    assert namespace["blocks"] > 0
    stat = tiering("stat", "--root", root, "--json", env=env)
    assert stat.returncode == 0, stat.stderr
    stats = json.loads(stat.stdout)
    assert stats["namespace"] == namespace["digest"]  # the bench's own namespace
    assert stats["tiers"][0]["stats"]["resident_blocks"] == namespace["blocks"]
    verify = tiering("verify", "--root", root, env=env)
    assert verify.returncode == 0, verify.stderr
    assert f"{namespace['blocks']} checked, {namespace['blocks']} sound, 0 corrupt" in verify.stdout
    missing = tiering("gc", "--root", root, "--namespace", "0" * 32, env=env)
    assert missing.returncode == 1
    assert f"no tier holds namespace {'0' * 32}" in missing.stderr
    dry = tiering("gc", "--root", root, "--namespace", namespace["digest"], "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert f"would remove namespace {namespace['digest']} ({namespace['blocks']} blocks" in dry.stdout


@needs_local
def test_stat_shows_unbounded_for_a_tier_without_a_cap(env, tmp_path):
    root = tmp_path / "kv"
    bench = tiering("bench", "--trace", "mooncake-synthetic", "--requests", "20", "--root", root, env=env)
    assert bench.returncode == 0, bench.stderr
    proc = tiering("stat", "--tier", LOCAL, "--root", root, env=env)
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("capacity ")]
    assert line.split() == ["capacity", "unbounded", "(no", "capacity_bytes)"]


@needs_local
def test_stat_creates_nothing_on_a_mistyped_root_or_one_without_the_namespace(env, tmp_path):
    missing = tmp_path / "bench-blokcs"
    proc = tiering("stat", "--root", missing, env=env)
    assert proc.returncode == 2
    assert f"root '{missing}' does not exist" in proc.stderr
    assert not missing.exists()
    other = tmp_path / "other"
    (other / ("ab" * 16)).mkdir(parents=True)
    (other / ("ab" * 16) / "namespace.json").write_text("{}")
    proc = tiering("stat", "--root", other, env=env)
    assert proc.returncode == 1
    assert f"namespaces there: {'ab' * 16}" in proc.stderr
    assert sorted(p.name for p in other.iterdir()) == ["ab" * 16]  # no namespace.json of its own written


def test_stack_options_need_a_config_or_a_root(env):
    proc = tiering("ls", env=env)
    assert proc.returncode == 2
    assert "give a CONFIG file, --root DIR" in proc.stderr


@needs_local
def test_check_without_probe_validates_values_and_creates_nothing(env, tmp_path):
    root = tmp_path / "absent" / "kv"
    for entry, message in [
        ({"type": LOCAL}, "secondary_tiers[0].root"),
        ({"type": LOCAL, "root": str(root), "capacity_bytes": -5}, "secondary_tiers[0].capacity_bytes"),
        ({"type": LOCAL, "root": str(root), "capacity_bytes": "lots"}, "secondary_tiers[0].capacity_bytes"),
    ]:
        path = tmp_path / "c.json"
        path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [entry]}))
        proc = tiering("check", path, env=env)
        assert proc.returncode == 2, proc.stdout
        assert message in proc.stderr
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": LOCAL, "root": str(root)}]}))
    proc = tiering("check", path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "every value checked against its schema" in proc.stdout
    assert "nothing opened" in proc.stdout
    assert not (tmp_path / "absent").exists()


@needs_local
def test_check_probe_creates_nothing_and_says_where_each_tier_lives(env, tmp_path):
    root = tmp_path / "kv"
    root.mkdir()
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": LOCAL, "root": str(root)}]}))
    proc = tiering("check", path, "--probe", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"probe '{LOCAL}' ({root}): ok" in proc.stdout
    assert list(root.iterdir()) == []


@needs_local
def test_check_reads_the_vllm_form_of_a_tier_entry_without_vllm(env, tmp_path):
    entry = {"type": f"tiering_{LOCAL}", "module_path": "tiering.core.vllm.tiers", "root": str(tmp_path)}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [entry]}))
    proc = tiering("check", path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"'tiering_{LOCAL}' with module_path 'tiering.core.vllm.tiers' is the vLLM binding's form" in proc.stdout
    assert f"secondary_tiers[0] type '{LOCAL}'" in proc.stdout


def test_install_hint_shows_the_published_and_the_clone_form(env, tmp_path):
    missing = [n for n in ("fs", "s3", "example") if n not in SecondaryTierFactory.known_names()]
    if not missing:
        pytest.skip("every backend is installed")
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 20, "secondary_tiers": [{"type": missing[0]}]}))
    proc = tiering("check", path, env=env)
    assert proc.returncode == 2
    dist = f"tiering-{missing[0]}"
    assert f"pip install {dist} (from a clone of the repository: pip install ./packages/{dist})" in proc.stderr

"""Metrics counted in a replay with known outcomes; Prometheus exposition; plots."""

import json
import urllib.request

import pytest

from tiering.cli.bench import Replayer, synthetic_chat
from tiering.cli.bench.workload import Request
from tiering.cli.main import main
from tiering.core import ReqContext, TieringOffloadingSpec
from tiering.core.runtime.metrics import Histogram, StackMetrics, snapshot
from tiering.testing import make_key, requires_tier

BLOCK = 1024


def stack(capacity, tiers=()):
    spec = TieringOffloadingSpec(
        {"cpu_bytes_to_use": capacity * BLOCK, "block_bytes": BLOCK, "secondary_tiers": list(tiers)}
    )
    return spec.get_manager()


def sample(snap, name, **labels):
    return sum(s["value"] for s in snap[name] if labels.items() <= s["labels"].items())


def test_known_outcomes_primary_only():
    # Request A stores 4 blocks; B shares 2 of them and adds 2; C repeats B.
    a = [make_key(i, b"m") for i in range(4)]
    b = a[:2] + [make_key(i, b"n") for i in range(2)]
    manager = stack(16)
    report = Replayer(manager, []).run([Request("A", tuple(a)), Request("B", tuple(b)), Request("C", tuple(b))])
    snap = snapshot(manager)
    assert report.total_hits == 2 + 4
    assert sample(snap, "tiering_blocks_loaded_total", tier="primary") == 6
    assert sample(snap, "tiering_loaded_bytes_total", tier="primary") == 6 * BLOCK
    assert sample(snap, "tiering_blocks_stored_total", tier="primary") == 6  # 4 from A, 2 from B
    assert sample(snap, "tiering_resident_blocks", tier="primary") == 6
    assert sample(snap, "tiering_capacity_bytes", tier="primary") == 16 * BLOCK
    assert sample(snap, "tiering_evictions_total", tier="primary") == 0
    # lookups: A: 1 miss (stops at the first miss); B: 2 hits + 1 miss; C: 4 hits
    assert sample(snap, "tiering_lookups_total", tier="primary", outcome="hit") == 6
    assert sample(snap, "tiering_lookups_total", tier="primary", outcome="miss") == 2


@requires_tier("example")
def test_replay_counters_match_report_and_an_independent_count():
    requests = list(synthetic_chat(150, 256, conversations=6, seed=1))
    manager = stack(24, [{"type": "example"}])
    report = Replayer(manager, ["0:example"]).run(requests)
    snap = snapshot(manager)
    # Independent count: every distinct key is stored exactly once into the unbounded example tier.
    distinct = len({k for r in requests for k in r.keys})
    assert sample(snap, "tiering_blocks_stored_total", index="0") == distinct
    assert sample(snap, "tiering_resident_blocks", index="0") == distinct
    assert sample(snap, "tiering_blocks_loaded_total", index="0") == report.hits["0:example"]
    assert sample(snap, "tiering_blocks_loaded_total", tier="primary") == report.total_hits
    assert sample(snap, "tiering_stored_bytes_total", index="0") == report.bytes_stored["0:example"]
    assert sample(snap, "tiering_evictions_total", tier="primary") > 0
    assert sample(snap, "tiering_jobs_total", index="0", kind="load", outcome="failed") == 0
    jobs = sample(snap, "tiering_jobs_total", index="0", kind="store")
    (hist,) = [h for h in snap["tiering_store_duration_seconds"] if h["labels"]["index"] == "0"]
    assert hist["count"] == jobs and hist["buckets"]["+Inf"] == jobs
    assert sample(snap, "tiering_in_flight_jobs", index="0") == 0


@requires_tier("example")
def test_prometheus_exposition_parses_back():
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from tiering.core.runtime.prometheus import registry_for

    manager = stack(24, [{"type": "example"}])
    Replayer(manager, ["0:example"]).run(synthetic_chat(40, 256, conversations=3))
    text = prometheus_client.generate_latest(registry_for(manager)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    snap = snapshot(manager)
    stored = [s for s in families["tiering_blocks_stored"].samples if s.name == "tiering_blocks_stored_total"]
    by_index = {s.labels["index"]: s.value for s in stored}
    assert by_index["0"] == sample(snap, "tiering_blocks_stored_total", index="0") > 0
    assert by_index["primary"] == sample(snap, "tiering_blocks_stored_total", tier="primary")
    assert families["tiering_resident_bytes"].type == "gauge"
    buckets = [s for s in families["tiering_load_duration_seconds"].samples if s.name.endswith("_bucket")]
    assert buckets and buckets[-1].labels["le"] == "+Inf"


def test_bench_serves_metrics_while_it_runs(tmp_path, monkeypatch):
    pytest.importorskip("prometheus_client")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scraped = {}
    from tiering.cli.bench import replay

    original = replay.Replayer.drain

    def drain_and_scrape(self):
        original(self)
        scraped["text"] = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()

    monkeypatch.setattr(replay.Replayer, "drain", drain_and_scrape)
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 64 * 4096, "block_bytes": 4096}))
    assert main(["bench", "--config", str(config), "--requests", "30", "--metrics-port", str(port)]) == 0
    assert 'tiering_blocks_stored_total{index="primary",tier="primary"}' in scraped["text"]


def test_plot_is_written_without_a_display(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.delenv("DISPLAY", raising=False)
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"cpu_bytes_to_use": 64 * 4096, "block_bytes": 4096}))
    out = tmp_path / "replay.png"
    report = tmp_path / "r.json"
    assert main(["bench", "--config", str(config), "--requests", "50", "--plot", str(out), "--json", str(report)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(report.read_text())
    assert len(data["series"]["index"]) == 50
    assert set(data["series"]["hit_ratio"]) == {"primary"}


def test_histogram_buckets_and_quantiles():
    h = Histogram(buckets=(0.001, 0.01, 0.1))
    for v in (0.0005, 0.005, 0.005, 0.05, 5.0):
        h.observe(v)
    assert h.cumulative() == [("0.001", 1), ("0.01", 3), ("0.1", 4), ("+Inf", 5)]
    assert h.quantile(0.5) == 0.01 and h.quantile(0.8) == 0.1


def test_unknown_metric_names_raise():
    m = StackMetrics()
    with pytest.raises(KeyError, match="unknown counter"):
        m.inc("nope_total", {})
    with pytest.raises(KeyError, match="unknown histogram"):
        m.observe("nope_seconds", {}, 1.0)
    assert ReqContext("x").extra == {}


def test_tier_stats_vocabulary_becomes_metrics():
    from tiering.core import CPUPrimaryTier, LRUCachePolicy, OffloadingSpec, TieringManager
    from tiering.core.base import SecondaryTierManager

    class Capped(SecondaryTierManager):
        def lookup(self, key, ctx):
            return False

        def submit_store(self, job):
            pass

        def submit_load(self, job):
            pass

        def get_finished(self):
            return []

        def stats(self):
            return {
                "resident_blocks": 3,
                "resident_bytes": 300,
                "used_bytes": 400,
                "pending_delete_bytes": 100,
                "capacity_bytes": 400,
                "evictions": 5,
                "failed_deletes": 1,
                "load_failed_checksum": 2,
            }

    spec = OffloadingSpec({"cpu_bytes_to_use": 4 * BLOCK, "block_bytes": BLOCK})
    primary = CPUPrimaryTier(4, BLOCK, LRUCachePolicy(4))
    snap = snapshot(TieringManager(primary, [Capped(spec, primary.kv_view, "capped")]))
    assert sample(snap, "tiering_used_bytes", tier="capped") == 400
    assert sample(snap, "tiering_pending_delete_bytes", tier="capped") == 100
    assert sample(snap, "tiering_failed_deletes_total", tier="capped") == 1
    assert sample(snap, "tiering_evictions_total", tier="capped") == 5
    assert sample(snap, "tiering_load_failures_total", tier="capped", cause="checksum") == 2
    assert sample(snap, "tiering_in_flight_jobs", tier="capped") == 0

import threading

from tiering.core.store.stats import STATS, Counters, failure_totals, is_known


def test_vocabulary_has_one_name_per_concept():
    for old in ("inflight_jobs", "stores_skipped_present", "delete_failures", "heads_sent"):
        assert not is_known(old)
    for name in ("in_flight_jobs", "stores_already_present", "failed_deletes", "lookup_probes", "load_failed_checksum"):
        assert is_known(name)
    assert all(s.kind in ("counter", "gauge") for s in STATS.values())


def test_failure_totals():
    totals = failure_totals({"load_failed_checksum": 2, "load_failed_missing": 1, "store_failed_no_space": 4})
    assert totals == {"store_failures": 4, "load_failures": 3, "verify_failures": 2}


def test_counters_start_at_zero_and_are_thread_safe():
    c = Counters(["a", "b"])
    assert c.snapshot() == {"a": 0, "b": 0}

    def bump() -> None:
        for _ in range(10_000):
            c.inc("a")
        c.add({"b": 5})

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.snapshot() == {"a": 40_000, "b": 20}


def test_docs_table_matches_the_vocabulary():
    from pathlib import Path

    doc = (Path(__file__).parents[4] / "docs" / "content" / "toolkit.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    documented = {}
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[1] in ("counter", "gauge"):
            documented[cells[0].strip("`")] = (cells[1], cells[2], cells[3])
    assert documented == {name: (s.kind, s.unit, s.meaning) for name, s in STATS.items()}

"""Field fault cases on the s3 tier (issue 13), injected with botocore event handlers against the real server.

Handlers are registered on every client the tier creates (``hooks`` fixture): ``before-call`` handlers
answer a request themselves (a server error, per-key DeleteObjects errors) and ``after-call`` handlers
change what the server said (a short HEAD) or hold a response back (a slow GET).
"""

import logging
import re
import threading
import time

import pytest
from botocore.awsrequest import AWSResponse
from s3_helpers import CTX, OBJ, block_keys, build, load, make_spec, store, wait_until

from tiering.core import JobMetadata
from tiering.core.base import block_view
from tiering.core.store import deletes as store_deletes
from tiering.s3 import client as s3_client
from tiering.testing import block_payload, make_key, wait_for_jobs, wait_for_lookup


@pytest.fixture
def hooks(monkeypatch):
    """``hooks.add(event, handler)``: the handler is registered on every boto3 client created from now on."""
    handlers = []
    real = s3_client.new_boto_client

    def new_boto_client(settings, max_pool_connections):
        boto = real(settings, max_pool_connections)
        for event, handler in handlers:
            boto.meta.events.register(event, handler)
        return boto

    monkeypatch.setattr(s3_client, "new_boto_client", new_boto_client)

    class Hooks:
        @staticmethod
        def add(event, handler):
            handlers.append((event, handler))

    return Hooks()


def server_error(status, code):
    """A ``before-call`` answer: the server refused the request with ``status`` / ``code``."""
    return (
        AWSResponse("http://injected", status, {}, None),
        {"Error": {"Code": code, "Message": "injected"}, "ResponseMetadata": {"HTTPStatusCode": status}},
    )


def body_keys(params):
    body = params.get("body", b"")
    return [k.decode() for k in re.findall(rb"<Key>([^<]*)</Key>", body if isinstance(body, bytes) else body.encode())]


def delete_event(tier):
    """The botocore event of the tier's deletes: ``DeleteObjects``, or ``DeleteObject`` where its probe found
    that the server refuses batch deletes (such a server never receives a ``DeleteObjects`` to inject into)."""
    return "before-call.s3.DeleteObjects" if tier.features.batch_delete else "before-call.s3.DeleteObject"


def total_object_bytes(s3):
    sizes = []
    for page in s3.client.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=f"{s3.prefix}/"):
        sizes.extend(o["Size"] for o in page.get("Contents", ()) if not o["Key"].endswith("namespace.json"))
    return sum(sizes)


# -- kind 2 / C13: a load racing an eviction never re-indexes ------------------------------------------
def test_C13_load_racing_an_eviction_never_reindexes(s3, hooks):
    armed, holding, release = threading.Event(), threading.Event(), threading.Event()

    def slow_get(**_):
        if armed.is_set():
            holding.set()
            release.wait(10)  # the response (the whole object) is here; the tier has not verified it yet

    hooks.add("after-call.s3.GetObject", slow_get)
    tier, view = build(s3.tier_config(capacity_bytes=2 * OBJ))
    try:
        keys = [make_key(i, b"c13") for i in range(4)]
        assert store(tier, view, keys[:2])
        armed.set()
        job = JobMetadata(9001, [keys[0]], [5], True, CTX)
        tier.submit_load(job)
        assert holding.wait(10)
        armed.clear()
        assert store(tier, view, keys[2:4], [2, 3])  # evicts keys[0] and keys[1] while the load reads keys[0]
        wait_until(lambda: tier.stats()["objects_deleted"] == 2)
        release.set()  # the held GET finishes: its bytes were valid when read, but the key was evicted since
        assert wait_for_jobs(tier, [job.job_id]) == {job.job_id: True}
        stats = tier.stats()
        assert wait_for_lookup(tier, keys[0], CTX) is False  # not re-indexed; the HEAD finds nothing
        assert stats["resident_blocks"] == 2 and stats["used_bytes"] == 2 * OBJ == total_object_bytes(s3)
        assert sorted(block_keys(s3, f"{s3.prefix}/")) == sorted(tier.object_key(k) for k in keys[2:])
    finally:
        release.set()
        tier.shutdown()


# -- kind 3 / C16: failed deletes keep bytes counted; servers without batch delete or conditional put ----
def test_C16_per_key_delete_errors_keep_bytes_counted_until_a_rescan(s3, hooks):
    failing = threading.Event()
    failing.set()

    def per_key_errors(params, event_name, **_):
        if not failing.is_set():
            return None
        if event_name.endswith(".DeleteObject"):  # a server without batch delete: each key's request fails
            return server_error(500, "InternalError")
        errors = [{"Key": k, "Code": "InternalError", "Message": "injected"} for k in body_keys(params)]
        return AWSResponse("http://injected", 200, {}, None), {
            "Errors": errors,
            "ResponseMetadata": {"HTTPStatusCode": 200},
        }

    tier, view = build(s3.tier_config(capacity_bytes=4 * OBJ))
    tier.blocks.client.boto.meta.events.register(delete_event(tier), per_key_errors)
    try:
        keys = [make_key(i, b"c16") for i in range(8)]
        assert store(tier, view, keys[:4])
        # evicts keys[:4]; their deletes fail, so their room never comes: refused as no space, the cap holds
        assert not store(tier, view, keys[4:], [4, 5, 6, 7])
        wait_until(lambda: tier.stats()["failed_deletes"] >= 4)
        stats = tier.stats()
        assert stats["store_failed_no_space"] == 4
        # the bytes are still there, so they are still counted: stats equal what is stored
        assert total_object_bytes(s3) == 4 * OBJ == stats["used_bytes"]
        assert stats["resident_bytes"] + stats["pending_delete_bytes"] == stats["used_bytes"]
        assert all(tier.lookup(k, CTX) is False for k in keys[:4])  # evicted: never served
        failing.clear()
        tier.rescan()  # within one rescan the failed deletes are retried
        wait_until(lambda: total_object_bytes(s3) == 0)
        wait_until(lambda: tier.stats()["used_bytes"] == 0)
        assert store(tier, view, keys[4:], [4, 5, 6, 7])  # stores work again
        stats = tier.stats()
        assert stats["resident_blocks"] == 4 and stats["pending_delete_bytes"] == 0
        assert total_object_bytes(s3) == 4 * OBJ == stats["used_bytes"]
        assert load(tier, view, keys[4:], [8, 9, 10, 11])
    finally:
        failing.clear()
        tier.shutdown()


def test_C16_failed_deletes_settle_on_their_own_after_an_outage(s3, hooks, monkeypatch):
    """Deletes failing longer than the fast retry rounds are retried on, with no rescan, until they succeed."""
    monkeypatch.setattr(store_deletes, "RETRY_PAUSES_S", (0.05, 0.05))
    monkeypatch.setattr(store_deletes, "RETRY_EVERY_S", 0.3)
    failing = threading.Event()
    failing.set()
    attempts = []

    def outage(params, **_):
        attempts.append(len(body_keys(params)))
        if failing.is_set():
            return server_error(503, "ServiceUnavailable")
        return None

    tier, view = build(s3.tier_config(capacity_bytes=2 * OBJ))
    tier.blocks.client.boto.meta.events.register(delete_event(tier), outage)
    try:
        keys = [make_key(i, b"c16-outage") for i in range(4)]
        assert store(tier, view, keys[:2])
        assert not store(tier, view, keys[2:], [2, 3])  # evicts keys[:2]; their deletes fail: no room, refused
        wait_until(lambda: len(attempts) >= 5)  # past the two fast rounds: the slow rounds keep going
        assert total_object_bytes(s3) == 2 * OBJ == tier.stats()["used_bytes"]
        failing.clear()  # the server answers again; nobody calls rescan()
        wait_until(lambda: total_object_bytes(s3) == 0)
        wait_until(lambda: tier.stats()["used_bytes"] == 0)
        assert tier.stats()["pending_delete_bytes"] == 0
        assert store(tier, view, keys[2:], [2, 3])
        assert sorted(block_keys(s3, f"{s3.prefix}/")) == sorted(tier.object_key(k) for k in keys[2:])
    finally:
        failing.clear()
        tier.shutdown()


def test_C16_server_refusing_batch_delete_falls_back_with_one_warning(s3, hooks, caplog):
    hooks.add("before-call.s3.DeleteObjects", lambda **_: server_error(501, "NotImplemented"))
    with caplog.at_level(logging.WARNING, logger="tiering.s3"):
        tier, view = build(s3.tier_config(capacity_bytes=4 * OBJ))
        try:
            assert tier.features.batch_delete is False  # found by the start-up probe
            assert any("DeleteObject per key" in line for line in tier.probe_report(check_credentials=False))
            keys = [make_key(i, b"c16-nobatch") for i in range(10)]
            for start in range(0, 10, 2):
                assert store(tier, view, keys[start : start + 2])
            wait_until(lambda: tier.stats()["objects_deleted"] == 6)
            stats = tier.stats()
            assert stats["failed_deletes"] == 0 and stats["batch_delete_supported"] == 0
            assert stats["used_bytes"] == 4 * OBJ == total_object_bytes(s3)
        finally:
            tier.shutdown()
    assert sum("refuses DeleteObjects" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("how", ["refuses", "ignores"])
def test_C16_server_without_conditional_put_falls_back_with_one_warning(s3, hooks, caplog, how):
    def refuse(params, **_):
        if "If-None-Match" in params["headers"]:
            return server_error(501, "NotImplemented")
        return None

    def ignore(params, **_):
        params["headers"].pop("If-None-Match", None)

    hooks.add("before-call.s3.PutObject", refuse if how == "refuses" else ignore)
    spec = make_spec()
    with caplog.at_level(logging.WARNING, logger="tiering.s3"):
        a, view_a = build(s3.tier_config(), spec)
        b, view_b = build(s3.tier_config(), spec)
        try:
            assert a.features.conditional_put is False and a.stats()["conditional_put_supported"] == 0
            assert any("falling back to plain PUT" in line for line in a.probe_report(check_credentials=False))
            keys = [make_key(i, b"nocond") for i in range(6)]
            assert store(a, view_a, keys) and store(b, view_b, keys)  # both write: harmless, same bytes
            assert load(b, view_b, keys, list(range(6, 12)))
        finally:
            a.shutdown()
            b.shutdown()
    warnings = [r.getMessage() for r in caplog.records if "If-None-Match" in r.getMessage()]
    assert len(warnings) == 2 and all(how in w for w in warnings)  # one per tier instance


# -- kind 10 / C17: a short object is not there yet, never deleted for its size ---------------------------
def test_C17_short_objects_during_stores_are_misses_never_deleted(s3, hooks):
    block = 256 * 1024
    spec = make_spec(block_bytes=block, num_blocks=64)
    shrinking = threading.Event()
    shrinking.set()
    deletes = []

    def short_head(parsed, **_):
        if shrinking.is_set() and "ContentLength" in parsed:
            parsed["ContentLength"] = parsed["ContentLength"] // 3  # visible while being written

    def count_deletes(params, **_):
        deletes.extend(body_keys(params))

    hooks.add("after-call.s3.HeadObject", short_head)
    hooks.add("before-call.s3.DeleteObjects", count_deletes)
    hooks.add("before-call.s3.DeleteObject", lambda params, **_: deletes.append(params["url_path"]))
    writer, wview = build(s3.tier_config(max_concurrency=8), spec)
    reader, rview = build(s3.tier_config(max_concurrency=8), spec)
    try:
        keys = [make_key(i, b"c17") for i in range(64)]
        for slot, key in enumerate(keys):
            block_view(wview, slot)[:] = block_payload(key, block)
        job = JobMetadata(7001, keys, list(range(64)), False, CTX)
        writer.submit_store(job)
        while writer.has_pending_work():  # the reader probes while the writer stores
            for key in keys:
                assert reader.lookup(key, CTX) is not True
            time.sleep(0.005)  # a spinning test thread would starve the in-process server of the GIL
        assert wait_for_jobs(writer, [job.job_id]) == {job.job_id: True}
        for key in keys:  # lookups before a block's PUT began were cached as absent: ask again, still short
            reader.lookup_cache.invalidate((key,))
        assert all(wait_for_lookup(reader, k, CTX) is False for k in keys)  # short: not there (yet)
        assert reader.stats()["short_objects_seen"] >= 1
        shrinking.clear()
        for key in keys:
            reader.lookup_cache.invalidate((key,))  # past the negative-lookup TTL
        for start in range(0, 64, 16):
            assert load(reader, rview, keys[start : start + 16], list(range(16)), timeout_s=60)
            assert load(writer, wview, keys[start : start + 16], list(range(16, 32)), timeout_s=60)
        assert [name for name in deletes if ".probe-" not in name] == []  # no block was deleted
        assert len(block_keys(s3, f"{s3.prefix}/")) == 64
        assert reader.stats()["bad_blocks_removed"] == 0 and writer.stats()["bad_blocks_removed"] == 0
    finally:
        writer.shutdown()
        reader.shutdown()

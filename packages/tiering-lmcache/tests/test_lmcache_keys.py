"""The LMCache binding's pure parts (no LMCache needed): keys, namespace, rows, adapter_params."""

from __future__ import annotations

import dataclasses
import importlib
import sys

import pytest

from tiering.core.format import MAX_KEY_BYTES
from tiering.core.spec import OffloadingSpec
from tiering.lmcache.keys import (
    ENGINE,
    KV_LAYOUT,
    ROW_HEADER_BYTES,
    encode_key,
    key_salt_tag,
    namespace_config,
    pack_row,
    row_bytes,
    row_payload,
    salt_of,
    salt_tag,
)
from tiering.lmcache.params import parse_params
from tiering.lmcache.usage import SaltUsage


@dataclasses.dataclass(frozen=True)
class Key:
    chunk_hash: bytes = b"\x01" * 32
    model_name: str = "m"
    kv_rank: int = 0
    object_group_id: int = 0
    cache_salt: str = ""


def test_every_object_key_field_changes_the_key() -> None:
    base = Key()
    variants = [
        Key(chunk_hash=b"\x02" * 32),
        Key(model_name="m2"),
        Key(kv_rank=1),
        Key(object_group_id=1),
        Key(cache_salt="user-a"),
    ]
    keys = {encode_key(base), *(encode_key(v) for v in variants)}
    assert len(keys) == 6 and all(33 <= len(k) <= MAX_KEY_BYTES for k in keys)
    assert encode_key(Key()) == encode_key(base)  # deterministic across calls


def test_the_key_names_its_cache_salt() -> None:
    short, long_salt = "tenant-\u00e9", "t" * 40
    assert salt_of(key_salt_tag(encode_key(Key(cache_salt=short))) or b"") == short
    assert salt_of(key_salt_tag(encode_key(Key())) or b"") == ""
    tag = key_salt_tag(encode_key(Key(cache_salt=long_salt)))
    assert tag == salt_tag(long_salt) and len(tag) == 32 and salt_of(tag) is None  # hashed: never in the clear
    assert len(encode_key(Key(cache_salt=long_salt))) == MAX_KEY_BYTES
    assert key_salt_tag(b"\x00" * 32) is None and key_salt_tag(b"\x00" * 32 + b"\x07x") is None


def test_salt_usage_counts_rows_and_restores_them_by_key() -> None:
    usage = SaltUsage(row_bytes=100)
    a1, a2, b1 = Key(b"\x01" * 32, cache_salt="a"), Key(b"\x02" * 32, cache_salt="a"), Key(cache_salt="b" * 40)
    assert usage.stored(encode_key(a1), a1) and not usage.stored(encode_key(a1), a1)
    assert usage.by_salt() == {"a": 100}
    # A restart: the keys listed from the tier, a long salt named once a request carries it.
    usage = SaltUsage(row_bytes=100)
    assert usage.restored([encode_key(a1), encode_key(a2), encode_key(b1), b"\x00" * 32]) == 3
    assert usage.by_salt() == {"a": 200} and usage.unnamed_bytes() == 100
    usage.learn("b" * 40)
    assert usage.by_salt() == {"a": 200, "b" * 40: 100} and usage.unnamed_bytes() == 0
    assert usage.removed([encode_key(a1), encode_key(b1)]) == []  # restored keys: no ObjectKey known
    assert usage.by_salt() == {"a": 100}
    assert usage.removed([encode_key(a2)]) == [] and usage.by_salt() == {}


def test_fields_cannot_run_into_each_other() -> None:
    # Length-prefixed fields: moving a character from the model to the salt is another key.
    assert encode_key(Key(model_name="ab", cache_salt="c")) != encode_key(Key(model_name="a", cache_salt="bc"))


def test_object_key_known_answer() -> None:
    # These bytes name stored LMCache objects (the digest, then the salt's tag): a change would turn every stored
    # object into a miss.
    key = Key(cache_salt="acme", kv_rank=1, object_group_id=2)
    assert encode_key(key).hex() == "de6ad635701d96cc5c80bd443749bb6aacb3314d5178dc76c2358cfd01430cdf" + "0161636d65"


def test_namespace_names_the_engine_apart_from_vllm() -> None:
    ours = OffloadingSpec({"cpu_bytes_to_use": 1 << 20, **namespace_config(4096)}).namespace
    vllm_like = OffloadingSpec({"cpu_bytes_to_use": 1 << 20, "block_bytes": row_bytes(4096)}).namespace
    assert ours.model == ENGINE and ours.kv_layout == KV_LAYOUT and ours.block_bytes == row_bytes(4096) == 8192
    assert ours.digest != vllm_like.digest


def test_row_round_trip_with_padding_and_a_bad_length_is_refused() -> None:
    row = memoryview(bytearray(b"\xee" * 64))
    pack_row(row, memoryview(b"hello"))
    assert bytes(row_payload(row)) == b"hello" and bytes(row[ROW_HEADER_BYTES + 5 :]) == bytes(64 - 13)
    with pytest.raises(ValueError, match="object_bytes 56"):
        pack_row(row, memoryview(bytes(57)))
    row[:8] = (57).to_bytes(8, "little")
    with pytest.raises(ValueError, match="length field 57"):
        row_payload(row)


def test_params_are_checked_naming_the_key() -> None:
    ok = parse_params({"tier": {"type": "fs", "root": "/x"}, "object_bytes": "1MiB"})
    assert ok.object_bytes == 1 << 20 and ok.staging_objects == 64 and ok.lock_ttl_s == 300.0
    with pytest.raises(ValueError, match="'object_byte' \\(did you mean 'object_bytes'"):
        parse_params({"tier": {"type": "fs"}, "object_byte": 1})
    with pytest.raises(ValueError, match=r"adapter_params\.tier"):
        parse_params({"object_bytes": 1})
    with pytest.raises(ValueError, match=r"adapter_params\.object_bytes"):
        parse_params({"tier": {"type": "fs"}, "object_bytes": "lots"})
    with pytest.raises(ValueError, match=r"adapter_params\.lock_ttl_s"):
        parse_params({"tier": {"type": "fs"}, "object_bytes": 8, "lock_ttl_s": 0})


def test_package_imports_without_lmcache(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "lmcache" or n.startswith("lmcache.")]:
        monkeypatch.delitem(sys.modules, name)  # where LMCache is installed (the lmcache env) and imported
    monkeypatch.setitem(sys.modules, "lmcache", None)  # any import of lmcache now fails
    for name in (
        "tiering.lmcache",
        "tiering.lmcache.keys",
        "tiering.lmcache.params",
        "tiering.lmcache.worker",
    ):
        monkeypatch.delitem(sys.modules, name, raising=False)
        importlib.import_module(name)
    monkeypatch.delitem(sys.modules, "tiering.lmcache.adapter", raising=False)
    with pytest.raises(ImportError):
        importlib.import_module("tiering.lmcache.adapter")


def test_the_worker_hands_the_tier_the_tasks_tenant() -> None:
    import threading
    from typing import ClassVar

    from tiering.core.base import SecondaryTierManager
    from tiering.core.primary.buffer import allocate_host_buffer
    from tiering.lmcache.worker import Task, TierWorker
    from tiering.testing.harness import make_spec

    class Recording(SecondaryTierManager):
        tenants: ClassVar[list[str]] = []

        def lookup(self, key, req_context):  # type: ignore[no-untyped-def]
            self.tenants.append(req_context.tenant)
            return False

        def submit_store(self, job):  # type: ignore[no-untyped-def]
            raise AssertionError("no store expected")

        submit_load = submit_store

        def get_finished(self):  # type: ignore[no-untyped-def]
            return []

    spec = make_spec(block_bytes=4096, num_blocks=2)
    view = allocate_host_buffer(2, 4096)
    tier = Recording(spec, view, "recording")
    done = threading.Event()
    worker = TierWorker(
        tier,
        view,
        lookup_timeout_s=1.0,
        on_complete=lambda t: done.set(),
        on_removed=lambda keys: None,
        on_tick=lambda: None,
    )
    keys = [Key(cache_salt="acme"), Key(chunk_hash=b"\x02" * 32, cache_salt="acme")]
    worker.submit(Task("lookup", 1, keys, [encode_key(k) for k in keys], [k.cache_salt for k in keys]))
    assert done.wait(10)
    worker.stop()
    assert tier.tenants and set(tier.tenants) == {"acme"}

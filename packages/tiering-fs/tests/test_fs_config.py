"""Config checks, construction, layout and stats of the fs tier."""

import errno
import json
import os

import pytest

from tiering.core import (
    SecondaryTierFactory,
)
from tiering.core.declared import declaration_drift
from tiering.core.factory import create_secondary_tier
from tiering.core.format import HEADER_SIZE, checksum
from tiering.core.primary import allocate_host_buffer
from tiering.core.schema import (
    InvalidTypeError,
    InvalidValueError,
    MissingKeyError,
    TierConfigError,
)
from tiering.fs import FsspecSecondaryTierManager
from tiering.fs.config import FS_SCHEMA, FsConfig
from tiering.fs.errors import RootNotUsableError
from tiering.fs.io.local import LocalBackend
from tiering.fs.layout import TRAILER_BYTES
from tiering.fs.testing import BB, CTX, block_files, load, make_spec, store, temp_files
from tiering.testing import block_payload, make_key

# -- config and construction ----------------------------------------------------------


def test_entry_point_resolves_and_unknown_key_is_named(tmp_path):
    assert SecondaryTierFactory.get_class("fs") is FsspecSecondaryTierManager
    assert SecondaryTierFactory.provider("fs") == "tiering-fs 0.1.0"
    spec = make_spec()
    view = allocate_host_buffer(4, BB)
    with pytest.raises(TypeError, match="root_dir"):
        create_secondary_tier({"type": "fs", "root_dir": str(tmp_path)}, view, spec)
    tier = create_secondary_tier({"type": "fs", "root": str(tmp_path), "n_read_threads": 1}, view, spec)
    try:
        assert tier.tier_type == "fs" and isinstance(tier, FsspecSecondaryTierManager)
        assert tier.n_read_threads == 1 and tier.n_write_threads == 4 and tier.fsync is False
    finally:
        tier.shutdown()


@pytest.mark.parametrize(
    ("config", "exc", "match"),
    [
        ({"n_read_threads": 0}, InvalidValueError, "n_read_threads: must be an integer >= 1, got 0"),
        ({"n_write_threads": "4"}, InvalidTypeError, "n_write_threads"),
        ({"fsync": 1}, InvalidTypeError, "fsync"),
        ({"capacity_bytes": 100}, InvalidValueError, "capacity_bytes 100 is smaller than one stored block"),
        ({"capacity_bytes": 1.5e9}, InvalidTypeError, "capacity_bytes"),
        ({"lookup_fallback": "sometimes"}, InvalidValueError, "lookup_fallback"),
        ({"o_direct": "yes"}, InvalidValueError, "o_direct"),
        ({"o_direct": 1}, InvalidTypeError, "o_direct"),
        ({"stale_temp_s": -1}, InvalidValueError, "stale_temp_s"),
        ({"startup_scan_wait_s": [2]}, InvalidTypeError, "startup_scan_wait_s"),
        ({"startup_scan_wait_s": "soon"}, InvalidValueError, "startup_scan_wait_s"),
        ({"startup_scan_wait_s": -1}, InvalidValueError, "startup_scan_wait_s"),
        ({"storage_options": "x"}, InvalidTypeError, "storage_options"),
        ({"root": ""}, InvalidValueError, "root: must be a non-empty string"),
        ({"root": None}, MissingKeyError, "root: required"),
        ({"root": "nosuchproto://x"}, InvalidValueError, "root: cannot open root .nosuchproto"),
    ],
)
def test_bad_config_values_are_named(tmp_path, config, exc, match):
    kwargs = {"root": str(tmp_path), **config}
    with pytest.raises(exc, match=match) as info:
        FsspecSecondaryTierManager(make_spec(), allocate_host_buffer(2, BB), "fs", **kwargs)
    if isinstance(info.value, TierConfigError):
        # The factory labels it with the entry: secondary_tiers[N].<key>.
        assert info.value.with_entry("secondary_tiers[0]").args[0].startswith(f"secondary_tiers[0].{info.value.key}:")


def test_config_declared_once_names_and_defaults():
    # The schema is the one declaration: the constructor's keywords and FsConfig's fields have its names and defaults.
    schema = FsspecSecondaryTierManager.config_schema
    assert schema is FS_SCHEMA
    assert declaration_drift(schema, FsspecSecondaryTierManager) == []
    assert declaration_drift(schema, FsConfig) == []
    assert FsConfig.check("fs", BB, {"root": "/kv"}) == FsConfig(**{**schema.defaults(), "root": "/kv"})
    assert schema.secret_keys == {"storage_options"}
    with pytest.raises(MissingKeyError, match=r"secondary_tiers\[0\]\.root: required"):
        schema.validate({"type": "fs"}, entry="secondary_tiers[0]")


def test_root_that_cannot_be_created_names_path_and_reason(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(RootNotUsableError) as info:
        FsspecSecondaryTierManager(make_spec(), allocate_host_buffer(2, BB), "fs", root=str(blocker / "kv"))
    message = str(info.value)
    assert str(blocker / "kv") in message and "cannot create directory" in message


def test_read_only_root_fails_at_construction(tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(RootNotUsableError, match="not writable: Read-only file system") as info:
        FsspecSecondaryTierManager(make_spec(), allocate_host_buffer(2, BB), "fs", root=str(tmp_path))
    assert str(tmp_path) in str(info.value)
    assert info.value.errno == errno.EROFS


def test_namespace_json_lists_every_field_and_layout_is_sharded(tmp_path, open_tier):
    tier, view = open_tier(tmp_path)
    key = make_key(1, b"layout")
    assert store(tier, view, [key])
    ns = tier.namespace
    ns_file = tmp_path / ns.digest / "namespace.json"
    assert json.loads(ns_file.read_text()) == dict(ns.to_dict(), digest=ns.digest)
    for field in (
        "model",
        "revision",
        "kv_dtype",
        "kv_layout",
        "block_size",
        "block_bytes",
        "rank",
        "world_size",
        "format_version",
    ):
        assert f'"{field}"' in ns_file.read_text()
    (path,) = block_files(tmp_path)
    rel = path.relative_to(tmp_path).as_posix()
    assert rel == f"{ns.digest}/{checksum(key) & 0xFF:02x}/{key.hex()}.kvb", rel
    data = path.read_bytes()
    assert len(data) == BB + TRAILER_BYTES and data[BB : BB + 4] == b"TKVB"
    assert data[:BB] == block_payload(key, BB)
    assert data[BB + HEADER_SIZE :] == bytes(TRAILER_BYTES - HEADER_SIZE)
    assert temp_files(tmp_path) == []


def test_file_url_root_uses_the_local_fast_path(tmp_path, open_tier):
    tier, view = open_tier(f"file://{tmp_path}")
    assert isinstance(tier.backend, LocalBackend) and tier.lookup_fallback == "stat"
    assert store(tier, view, [make_key(0)])
    assert len(block_files(tmp_path)) == 1


def test_stats_has_every_counter(tmp_path, open_tier):
    tier, view = open_tier(tmp_path, capacity_bytes=10 * (BB + TRAILER_BYTES))
    assert store(tier, view, [make_key(i) for i in range(3)])
    assert load(tier, view, [make_key(0)], [5])
    assert tier.lookup(make_key(0), CTX) is True and tier.lookup(make_key(99), CTX) is False
    s = tier.stats()
    expected = {
        "lookups_hit": 1,
        "lookups_miss": 1,
        "blocks_stored": 3,
        "bytes_stored": 3 * BB,
        "blocks_loaded": 1,
        "bytes_loaded": BB,
        "resident_blocks": 3,
        "resident_bytes": 3 * (BB + TRAILER_BYTES),
        "capacity_bytes": 10 * (BB + TRAILER_BYTES),
        "in_flight_jobs": 0,
        "load_failed_checksum": 0,
        "load_failed_truncated": 0,
        "load_failed_foreign": 0,
        "load_failed_io_error": 0,
        "store_failed_no_space": 0,
        "store_failed_io_error": 0,
    }
    assert {k: s[k] for k in expected} == expected
    assert s["evictions"] == 0 and s["lookups_pending"] == 0


def test_constructor_errors_through_the_factory_name_the_entry_and_key(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    view = allocate_host_buffer(2, BB)
    with pytest.raises(RootNotUsableError, match=r"^secondary_tiers\[1\]\.root: .*cannot create directory") as info:
        create_secondary_tier({"type": "fs", "root": str(blocker / "kv")}, view, make_spec(), index=1)
    assert info.value.errno == errno.ENOTDIR
    with pytest.raises(MissingKeyError, match=r"^secondary_tiers\[1\]\.root: required"):
        create_secondary_tier({"type": "fs"}, view, make_spec(), index=1)
    with pytest.raises(InvalidValueError, match=r"^secondary_tiers\[0\]\.capacity_bytes: "):
        create_secondary_tier({"type": "fs", "root": str(tmp_path), "capacity_bytes": 100}, view, make_spec())

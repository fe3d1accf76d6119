"""tiering ls / stat / gc / verify on an s3 tier: core's inspector conformance suite, plus what is s3-specific.

S3-specific: nothing beside or outside the prefix is listed or touched, listings paginate, removal is batched and
refuses anything that is not a block object, LastModified is the age, and failures name the bucket or endpoint
without credentials. Runs against moto on loopback, or TIERING_S3_ENDPOINT.
"""

import json
import re
import socket
import time
import types

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from tiering.cli import commands as core_commands
from tiering.cli.main import main
from tiering.cli.testing import InspectorConformanceTests
from tiering.core import JobMetadata, ReqContext, TieringOffloadingSpec, create_secondary_tier
from tiering.core.base import block_view
from tiering.core.format import HEADER_SIZE, checksum
from tiering.core.inspection import BlockInfo
from tiering.core.primary import allocate_host_buffer
from tiering.core.units import format_bytes
from tiering.s3 import S3SecondaryTierManager
from tiering.s3 import client as s3_client
from tiering.s3.inspection import S3Inspector
from tiering.testing import block_payload, make_key, wait_for_jobs

BLOCK = 4096
OBJ = BLOCK + HEADER_SIZE
CTX = ReqContext("test")
_ids = iter(range(1, 10**9))


class TestS3Inspector(InspectorConformanceTests):
    @pytest.fixture
    def tier_config(self, s3):
        return s3.tier_config()

    @pytest.fixture(autouse=True)
    def _env(self, s3):
        self.s3 = s3

    def corrupt_block(self, tier_config, digest, block, how):
        s3 = self.s3
        data = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=block.name)["Body"].read())
        if how == "flip":
            data[HEADER_SIZE + 5] ^= 0xFF
        else:
            data = data[:50]
        s3.client.put_object(Bucket=s3.bucket, Key=block.name, Body=bytes(data))

    def plant_foreign(self, tier_config):
        name = f"{self.s3.prefix}/notes.txt"
        self.s3.client.put_object(Bucket=self.s3.bucket, Key=name, Body=b"not ours")
        return name


def stack_config(s3, revision="r1", **tier_overrides):
    return {
        "cpu_bytes_to_use": 16 * BLOCK,
        "block_bytes": BLOCK,
        "model": "test/model",
        "model_revision": revision,
        "secondary_tiers": [s3.tier_config(**tier_overrides)],
    }


def populate(s3, revision="r1", n=8, salt=b""):
    """Store ``n`` blocks through the tier itself; returns (stack config, namespace digest, keys)."""
    config = stack_config(s3, revision)
    spec = TieringOffloadingSpec(config)
    view = allocate_host_buffer(spec.num_primary_blocks, spec.block_bytes)
    tier = create_secondary_tier(config["secondary_tiers"][0], view, spec)
    keys = [make_key(i, salt + revision.encode()) for i in range(n)]
    try:
        for start in range(0, n, 16):
            chunk = keys[start : start + 16]
            for slot, key in enumerate(chunk):
                block_view(view, slot)[:] = block_payload(key, BLOCK)
            job = JobMetadata(next(_ids), chunk, list(range(len(chunk))), False, CTX)
            tier.submit_store(job)
            assert wait_for_jobs(tier, [job.job_id], 30.0)[job.job_id]
    finally:
        tier.shutdown()
    return config, spec.namespace.digest, keys


def write_config(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def block_name(s3, digest, key):
    return f"{s3.prefix}/{digest}/{checksum(key) & 0xFF:02x}/{key.hex()}"


def block_objects(s3, digest=""):
    """Block objects under the prefix (or one namespace): name -> listing entry."""
    out = {}
    for page in s3.client.get_paginator("list_objects_v2").paginate(
        Bucket=s3.bucket, Prefix=f"{s3.prefix}/{digest}" if digest else f"{s3.prefix}/"
    ):
        for obj in page.get("Contents", ()):
            _, _, shard, keyhex = [*obj["Key"].split("/", 3), "", "", ""][:4]
            try:
                key = bytes.fromhex(keyhex)
            except ValueError:
                continue
            if key and shard == f"{checksum(key) & 0xFF:02x}":
                out[obj["Key"]] = obj
    return out


@pytest.fixture
def beside(s3):
    """Objects next to the prefix (and one copy of the layout outside it); yields name -> ETag."""
    created = {}

    def put(name, body=b"not ours"):
        created[name] = s3.client.put_object(Bucket=s3.bucket, Key=name, Body=body)["ETag"]
        return name

    put.created = created
    yield put
    if created:
        s3.delete_keys(list(created))


def like_prefix(s3, beside):
    """An object named like the prefix itself, where the server allows one beside ``<prefix>/...``.

    A server that keeps objects as files (nanio, localbucket) cannot hold both ``kv`` and ``kv/x``: it refuses
    (localbucket drops the connection), and there is nothing to test.
    """
    try:
        return [beside(s3.prefix)]
    except (ClientError, BotoCoreError):
        return []


def plant_beside(s3, beside, digest, key):
    """Objects a careless prefix match would take for ours: beside the prefix and inside it."""
    body = s3.client.get_object(Bucket=s3.bucket, Key=block_name(s3, digest, key))["Body"].read()
    shard = f"{checksum(key) & 0xFF:02x}"
    outside = [
        *like_prefix(s3, beside),
        beside(f"{s3.prefix}-other/{digest}/namespace.json"),
        beside(f"{s3.prefix}x/{digest}/{shard}/{key.hex()}", body),  # a valid block, one letter beside
        beside(f"elsewhere/{s3.prefix}/{digest}/{shard}/{key.hex()}", body),
    ]
    wrong_shard = f"{int(shard, 16) ^ 1:02x}"
    inside_foreign = [
        beside(f"{s3.prefix}/notes.txt"),
        beside(f"{s3.prefix}/{digest}/operator-note.txt"),
        beside(f"{s3.prefix}/{digest}/{wrong_shard}/{key.hex()}", body),  # not where the tier puts this key
        beside(f"{s3.prefix}/{'0' * 31}/namespace.json"),  # not a digest
    ]
    return outside, inside_foreign


def etags(s3, names):
    return {name: s3.client.head_object(Bucket=s3.bucket, Key=name)["ETag"] for name in names}


# -- ls -----------------------------------------------------------------------------------
def test_ls_lists_namespaces_fields_counts_and_foreign(tmp_path, s3, beside, capsys):
    config, d1, keys1 = populate(s3, "r1", n=8)
    _, d2, _ = populate(s3, "r2", n=3)
    outside, inside_foreign = plant_beside(s3, beside, d1, keys1[0])
    # a probe object a tier that died while starting left behind: ours, not foreign
    probe = beside(f"{s3.prefix}/{d1}/.probe-{'ab' * 16}", b"probe")
    assert main(["ls", write_config(tmp_path, config), "--json"]) == 0
    out = capsys.readouterr().out
    (tier,) = json.loads(out)
    assert tier["type"] == "s3"
    assert tier["location"] == f"s3://{s3.bucket}/{s3.prefix} at {s3.endpoint_url}"
    by_revision = {ns["fields"]["revision"]: ns for ns in tier["namespaces"]}
    assert set(by_revision) == {"r1", "r2"}
    assert by_revision["r1"]["digest"] == d1 and by_revision["r2"]["digest"] == d2
    assert by_revision["r1"]["fields"]["model"] == "test/model"
    assert by_revision["r1"]["fields"]["digest"] == d1
    for ns, n in ((by_revision["r1"], 8), (by_revision["r2"], 3)):
        objects = block_objects(s3, ns["digest"])
        assert ns["blocks"] == len(objects) == n
        assert ns["bytes"] == sum(o["Size"] for o in objects.values()) == n * OBJ
        assert ns["oldest"] <= ns["newest"]
    assert tier["foreign"] == sorted(inside_foreign)
    assert probe not in tier["foreign"] and not set(outside) & set(tier["foreign"])
    assert s3.server.secret_key not in out and s3.server.access_key not in out

    assert main(["ls", write_config(tmp_path, config)]) == 0
    text = capsys.readouterr().out
    assert f"{d1}  8 blocks  {format_bytes(8 * OBJ)} = {8 * OBJ} bytes" in text and "revision=r1" in text
    assert f"{len(inside_foreign)} foreign entries" in text


def test_ls_paginates_and_treats_an_empty_prefix_as_empty(tmp_path, s3, monkeypatch, capsys):
    config = stack_config(s3)
    assert main(["ls", write_config(tmp_path, config), "--json"]) == 0
    (tier,) = json.loads(capsys.readouterr().out)
    assert tier["namespaces"] == [] and tier["foreign"] == []
    _, digest, _ = populate(s3, n=7)
    populate(s3, "r2", n=1)
    populate(s3, "r3", n=1)
    inspector = S3Inspector.from_config(s3.tier_config())
    inspector.page_size = 2
    pages = []
    inspector._client.boto.meta.events.register(
        "before-parameter-build.s3.ListObjectsV2", lambda params, **_: pages.append(params["Prefix"])
    )
    assert len(inspector.namespaces()) == 3  # three namespaces listed two common prefixes a page
    assert len(list(inspector.blocks(digest))) == 7
    if not s3.server.external:  # servers page differently (nanio: common prefixes in one page, folders count)
        assert pages.count(f"{s3.prefix}/") == 2
        assert pages.count(f"{s3.prefix}/{digest}/") == 4  # 7 blocks + namespace.json, two a page
    else:
        assert pages.count(f"{s3.prefix}/{digest}/") >= 4  # two keys a page at most


# -- gc -----------------------------------------------------------------------------------
def test_gc_namespace_removes_only_that_namespace_and_nothing_foreign_or_outside(tmp_path, s3, beside, capsys):
    config, keep, _ = populate(s3, "r1", n=6)
    _, old, old_keys = populate(s3, "r0", n=5)
    outside, inside_foreign = plant_beside(s3, beside, old, old_keys[0])
    before = etags(s3, outside + inside_foreign)
    kept_before = etags(s3, [*block_objects(s3, keep), f"{s3.prefix}/{keep}/namespace.json"])
    path = write_config(tmp_path, config)

    assert main(["gc", path, "--namespace", old, "--dry-run"]) == 0
    assert (
        f"would remove namespace {old} (5 blocks, {format_bytes(5 * OBJ)} = {5 * OBJ} bytes)" in capsys.readouterr().out
    )
    assert len(block_objects(s3, old)) == 5

    assert main(["gc", path, "--namespace", old]) == 0
    out = capsys.readouterr().out
    assert f"removed namespace {old} (5 blocks, {format_bytes(5 * OBJ)} = {5 * OBJ} bytes)" in out
    assert f"left {len(inside_foreign)} foreign entries alone" in out
    assert block_objects(s3, old) == {}
    assert f"{s3.prefix}/{old}/namespace.json" not in s3.list_keys(f"{s3.prefix}/{old}/")
    assert etags(s3, outside + inside_foreign) == before  # every foreign and outside object untouched
    assert etags(s3, list(kept_before)) == kept_before

    assert main(["gc", path, "--namespace", old]) == 0  # the foreign objects left in it keep it listed
    assert f"removed namespace {old} (0 blocks, 0 B = 0 bytes)" in capsys.readouterr().out
    assert main(["gc", path, "--namespace", "f" * 32]) == 1  # no such namespace: non-zero exit
    assert f"no namespace {'f' * 32}" in capsys.readouterr().out
    assert main(["gc", path, "--namespace", "../etc"]) == 1  # not present: nothing listed outside
    assert etags(s3, outside + inside_foreign) == before


def test_gc_older_than_uses_last_modified(tmp_path, s3, beside, monkeypatch, capsys):
    """Moto's LastModified cannot be set back: store two batches a second apart and move gc's clock.

    The cut-off is compared with the real LastModified values of the listing; only ``time.time``
    as seen by the gc command is moved forward, so ``--older-than 1h`` cuts between the batches.
    """
    config, digest, old_keys = populate(s3, n=5, salt=b"old")
    old_names = set(block_objects(s3, digest))
    time.sleep(1.1)  # LastModified has one-second resolution on some servers
    populate(s3, n=3, salt=b"new")
    stamps = {k: o["LastModified"].timestamp() for k, o in block_objects(s3, digest).items()}
    new_names = set(stamps) - old_names
    split = min(stamps[k] for k in new_names)
    assert max(stamps[k] for k in old_names) < split
    outside, inside_foreign = plant_beside(s3, beside, digest, old_keys[0])
    before = etags(s3, outside + inside_foreign)
    path = write_config(tmp_path, config)

    assert main(["gc", path, "--older-than", "1h"]) == 0  # the real clock: everything is fresh
    assert "removed 0 blocks" in capsys.readouterr().out
    monkeypatch.setattr(core_commands, "time", types.SimpleNamespace(time=lambda: split + 3600))
    assert main(["gc", path, "--older-than", "1h", "--dry-run"]) == 0
    assert f"would remove 5 blocks ({format_bytes(5 * OBJ)} = {5 * OBJ} bytes)" in capsys.readouterr().out
    assert set(block_objects(s3, digest)) == old_names | new_names
    assert main(["gc", path, "--older-than", "1h"]) == 0
    assert f"removed 5 blocks ({format_bytes(5 * OBJ)} = {5 * OBJ} bytes)" in capsys.readouterr().out
    assert set(block_objects(s3, digest)) == new_names
    assert etags(s3, outside + inside_foreign) == before


def test_removal_is_batched_and_refuses_what_is_not_a_block(s3, beside, monkeypatch):
    _, digest, keys = populate(s3, n=7)
    outside, inside_foreign = plant_beside(s3, beside, digest, keys[0])
    before = etags(s3, outside + inside_foreign)
    inspector = S3Inspector.from_config(s3.tier_config())
    blocks = list(inspector.blocks(digest))
    assert sorted(b.key for b in blocks) == sorted(keys)
    assert all(b.size == OBJ and b.name == block_name(s3, digest, b.key) for b in blocks)
    for name in outside + inside_foreign + [f"{s3.prefix}/{digest}/namespace.json"]:
        with pytest.raises(ValueError, match="refusing to touch"):
            inspector.remove_blocks(digest, [blocks[0], BlockInfo(name, keys[0], OBJ, 0.0)])
        with pytest.raises(ValueError, match="refusing to touch"):
            inspector.read_block(digest, BlockInfo(name, keys[0], OBJ, 0.0))
    _, other, _ = populate(s3, "r2", n=1)
    with pytest.raises(ValueError, match="refusing to touch"):  # a block of another namespace
        inspector.remove_blocks(other, blocks[:1])
    for bad in ("", "..", f"{digest}/..", digest.upper(), f"../{digest}"):
        with pytest.raises(ValueError, match="not a namespace digest"):
            inspector.remove_namespace(bad)
    assert len(block_objects(s3, digest)) == 7  # nothing went before the refusals

    monkeypatch.setattr(s3_client, "DELETE_BATCH", 3)
    sizes = []

    def recording(params, **_):
        sizes.append(len(params["Delete"]["Objects"]))
        assert all(o["Key"].startswith(f"{s3.prefix}/{digest}/") for o in params["Delete"]["Objects"])

    def recording_one(params, **_):
        sizes.append(1)
        assert params["Key"].startswith(f"{s3.prefix}/{digest}/")

    inspector._client.batch_delete = s3.batch_delete()  # as the tier's probe found the server
    inspector._client.boto.meta.events.register("before-parameter-build.s3.DeleteObjects", recording)
    inspector._client.boto.meta.events.register("before-parameter-build.s3.DeleteObject", recording_one)
    assert inspector.remove_blocks(digest, blocks[:2] + blocks[:2]) == 4  # already gone: not an error
    assert inspector.remove_namespace(digest) == 5
    # 4 keys; 5 blocks; namespace.json: in batches of 3, or one request per key without batch delete
    assert sizes == ([3, 1, 3, 2, 1] if s3.batch_delete() else [1] * 10)
    assert sorted(s3.list_keys(f"{s3.prefix}/{digest}/")) == sorted(
        n for n in inside_foreign if n.startswith(f"{s3.prefix}/{digest}/")
    )
    assert etags(s3, outside + inside_foreign) == before


# -- verify -------------------------------------------------------------------------------
# -- errors -------------------------------------------------------------------------------
def test_commands_fail_clearly_on_a_missing_bucket(tmp_path, s3, capsys):
    path = write_config(tmp_path, stack_config(s3, bucket="no-such-bucket"))
    for argv in (["ls"], ["gc", "--to-bytes", "0"], ["verify"], ["stat"]):
        assert main([argv[0], path, *argv[1:]]) == 2
        err = capsys.readouterr().err
        # the factory may label it with the entry (secondary_tiers[0] / secondary_tiers[0].bucket)
        label = r"(secondary_tiers\[0\](\.bucket)?: )?"
        assert re.search(rf"tiering {argv[0]}: error: {label}s3 tier: bucket 'no-such-bucket' does not exist", err), err
        assert "endpoint_url:" not in err  # the key at fault is the bucket, never the endpoint
        assert s3.server.secret_key not in err and s3.server.access_key not in err


def test_a_missing_bucket_with_a_short_name_blames_the_bucket_not_the_endpoint(tmp_path, s3, capsys):
    # the shortest valid name (3 characters: a server may answer 400, not 404, to a shorter one)
    path = write_config(tmp_path, stack_config(s3, bucket="kvb"))
    assert main(["stat", path]) == 2
    err = capsys.readouterr().err
    assert "tiering stat: error: secondary_tiers[0].bucket: s3 tier: bucket 'kvb' does not exist" in err, err


def test_commands_fail_clearly_on_an_unreachable_endpoint_or_bad_config(tmp_path, s3, capsys):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = write_config(tmp_path, stack_config(s3, endpoint_url=f"http://127.0.0.1:{port}", max_attempts=1))
    assert main(["ls", path]) == 2
    err = capsys.readouterr().err
    assert f"cannot reach endpoint 'http://127.0.0.1:{port}'" in err and s3.server.secret_key not in err

    assert main(["ls", write_config(tmp_path, stack_config(s3, retry_mode="sometimes"))]) == 2
    assert "retry_mode: must be one of 'standard', 'adaptive', 'legacy', got 'sometimes'" in capsys.readouterr().err
    assert main(["ls", write_config(tmp_path, stack_config(s3, colour="blue"))]) == 2
    err = capsys.readouterr().err
    assert "colour" in err and "unknown key" in err
    assert main(["ls", write_config(tmp_path, stack_config(s3, bucket=None))]) == 2
    assert "bucket: required" in capsys.readouterr().err


def test_check_probe_creates_nothing_and_names_the_features(tmp_path, s3, capsys):
    """Issue 15: ``tiering check --probe`` reports bucket and features and leaves the bucket as it was."""
    before = s3.list_keys()
    path = write_config(tmp_path, stack_config(s3))
    assert main(["check", path, "--probe"]) == 0
    out = capsys.readouterr().out
    assert "probe 's3'" in out and f"s3://{s3.bucket}/{s3.prefix}/ at {s3.endpoint_url}" in out, out
    assert "conditional put (If-None-Match): " in out and "batch delete (DeleteObjects): " in out, out
    assert re.search(r"credentials: (checked|NOT checked)", out), out
    assert s3.server.secret_key not in out and s3.server.access_key not in out
    assert s3.list_keys() == before  # no namespace.json, no probe object left
    assert main(["check", write_config(tmp_path, stack_config(s3, bucket="no-such-bucket")), "--probe"]) != 0
    assert "bucket 'no-such-bucket' does not exist" in capsys.readouterr().err
    assert s3.list_keys() == before


def test_inspector_is_offered_by_the_tier_class(s3):
    inspector = S3SecondaryTierManager.inspector(s3.tier_config(prefix=f"/{s3.prefix}//"))
    assert isinstance(inspector, S3Inspector)
    assert inspector.location() == f"s3://{s3.bucket}/{s3.prefix} at {s3.endpoint_url}"
    assert s3.server.secret_key not in repr(vars(inspector))

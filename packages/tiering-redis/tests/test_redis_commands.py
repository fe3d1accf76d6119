"""``tiering check --probe / ls / stat / verify / gc`` on a redis tier, through the real command and server."""

import json
import time

import pytest
import redis

from tiering.cli.main import main
from tiering.cli.testing import InspectorConformanceTests
from tiering.core import create_secondary_tier
from tiering.core.base import JobMetadata, ReqContext, block_view
from tiering.core.inspection import inspector_for
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.testing import block_payload, make_key, wait_for_jobs

BLOCK = 4096


@pytest.fixture
def stocked(redis_server, prefix, tmp_path):
    """A config file whose redis tier holds 6 blocks, one corrupted in place, plus a foreign key under the prefix."""
    entry = {"type": "redis", "url": redis_server.url, "prefix": prefix}
    spec = OffloadingSpec({"cpu_bytes_to_use": 8 * BLOCK, "block_bytes": BLOCK, "model": "redis/test"})
    view = allocate_host_buffer(8, BLOCK)
    tier = create_secondary_tier(entry, view, spec)
    keys = [make_key(i, b"cmd") for i in range(6)]
    for i, key in enumerate(keys):
        block_view(view, i)[:] = block_payload(key, BLOCK)
    tier.submit_store(JobMetadata(1, keys, list(range(6)), False, ReqContext("r")))
    assert wait_for_jobs(tier, [1]) == {1: True}
    tier.shutdown()
    client = redis_server.client()
    client.setrange(tier.blocks.block_key(keys[0]), 128 + 5, b"\x00\xff")
    client.set(f"{prefix}:not-ours", b"x")
    client.close()
    config = {"cpu_bytes_to_use": 32 * BLOCK, "block_bytes": BLOCK, "model": "redis/test", "secondary_tiers": [entry]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path, entry, tier.blocks.digest


def test_check_probe(stocked, capsys):
    path, entry, _ = stocked
    assert main(["check", str(path), "--probe"]) == 0
    out = capsys.readouterr().out
    assert f"probe 'redis' ({entry['url']}, keys {entry['prefix']}:*): ok" in out


def test_ls_verify_and_gc(stocked, capsys, redis_server):
    path, entry, digest = stocked
    inspector = inspector_for(entry)
    assert inspector.namespaces() == [digest]
    assert len(list(inspector.blocks(digest))) == 6
    assert list(inspector.foreign()) == [f"{entry['prefix']}:not-ours"]
    assert main(["ls", str(path)]) == 0
    out = capsys.readouterr().out
    assert digest[:8] in out and "redis/test" in out
    assert main(["verify", str(path)]) != 0  # one block fails its checksum
    assert "checksum" in capsys.readouterr().out
    assert main(["gc", str(path), "--namespace", digest]) == 0
    assert inspector.namespaces() == []
    client = redis_server.client()
    assert client.exists(f"{entry['prefix']}:not-ours")  # foreign keys are never deleted
    client.close()


def test_inspection_is_not_an_access(stocked, capsys, redis_server):
    """ls / stat / gc --dry-run report the blocks' real ages and leave them as they are (allkeys-lru keeps working)."""
    path, entry, digest = stocked
    client = redis_server.client()
    names = sorted(n.decode() for n in client.scan_iter(match=f"{entry['prefix']}:{digest}:*") if b"namespace" not in n)
    assert len(names) == 6
    deadline = time.monotonic() + 10
    while min(client.object("idletime", n) for n in names) < 2:  # Redis counts idle time in whole seconds
        assert time.monotonic() < deadline
        time.sleep(0.25)
    for command in (["ls", str(path)], ["stat", str(path)], ["gc", str(path), "--older-than", "1s", "--dry-run"]):
        assert main(command) == 0
    out = capsys.readouterr().out
    assert "would remove 6 blocks" in out
    assert min(client.object("idletime", n) for n in names) >= 2  # not reset by the inspection above
    blocks = list(inspector_for(entry).blocks(digest))
    assert len(blocks) == 6 and all(b.mtime <= time.time() - 2 for b in blocks)
    assert all(b.size == 128 + BLOCK for b in blocks)
    assert main(["gc", str(path), "--older-than", "1s"]) == 0
    assert not any(client.exists(n) for n in names)
    client.close()


class TestRedisInspector(InspectorConformanceTests):
    @pytest.fixture
    def tier_config(self, redis_server, prefix):
        return {"type": "redis", "url": redis_server.url, "prefix": prefix}

    def corrupt_block(self, tier_config, digest, block, how):
        client = redis.Redis.from_url(tier_config["url"])
        if how == "flip":
            byte = client.getrange(block.name, 128 + 7, 128 + 7)
            client.setrange(block.name, 128 + 7, bytes([byte[0] ^ 0xFF]))
        else:
            client.set(block.name, client.getrange(block.name, 0, 9))
        client.close()

    def plant_foreign(self, tier_config):
        name = f"{tier_config['prefix']}:someone-else"
        client = redis.Redis.from_url(tier_config["url"])
        client.set(name, b"not a block")
        client.close()
        return name


@pytest.mark.parametrize(
    ("extra", "key"),
    [({"url": "redis://:s3cr3t-url@127.0.0.1:1/0", "password": "s3cr3t-key"}, "password"),
     ({"url": "redis://127.0.0.1:1/3", "db": 4}, "db")],
)  # fmt: skip
def test_plain_check_refuses_keys_given_twice(tmp_path, capsys, extra, key):
    """Keys given both inside url and as keys fail `tiering check` without --probe (no server is asked)."""
    config = {"cpu_bytes_to_use": 8 * BLOCK, "block_bytes": BLOCK, "secondary_tiers": [{"type": "redis", **extra}]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["check", str(path)]) != 0
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert f"secondary_tiers[0].{key}" in text and "also given inside url" in text
    assert "s3cr3t" not in text

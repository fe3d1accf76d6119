"""A redis tier used in a child forked after it was built: refused at once; the parent's connections unharmed."""

import os

from tiering.core import create_secondary_tier
from tiering.core.base import ReqContext
from tiering.core.primary import allocate_host_buffer
from tiering.core.spec import OffloadingSpec
from tiering.testing.harness import load_blocks, make_key, store_blocks, tier_calls_in_forked_child

BLOCK = 16 * 1024


def test_c20_forked_child_of_a_redis_tier_fails_fast_and_the_parent_goes_on(redis_server, prefix):
    spec = OffloadingSpec({"cpu_bytes_to_use": 8 * BLOCK, "block_bytes": BLOCK, "model": "redis/fork"})
    view = allocate_host_buffer(8, BLOCK)
    tier = create_secondary_tier({"type": "redis", "url": redis_server.url, "prefix": prefix}, view, spec)
    keys = [make_key(i, b"fork") for i in range(2)]
    try:
        assert store_blocks(tier, view, keys)
        seen = tier_calls_in_forked_child(tier, view, keys, [4, 5], timeout_s=5)
        assert seen.pop("shutdown") == "ok"  # sent nothing on the parent's connections
        for name, outcome in seen.items():
            assert outcome.startswith("ForkedStackError: "), (name, outcome)
            assert f"built in process {os.getpid()}" in outcome and "after forking" in outcome
        assert tier.stats()["forks"] == 1
        more = [make_key(i, b"fork") for i in range(2, 4)]
        assert store_blocks(tier, view, more, [2, 3])  # the parent's connections and threads still work
        assert load_blocks(tier, view, keys + more, [4, 5, 6, 7])
        assert tier.lookup(more[0], ReqContext("parent")) is True
    finally:
        tier.shutdown()

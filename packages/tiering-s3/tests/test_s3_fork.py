"""An s3 tier used in a child forked after it was built: refused at once; the parent's connections unharmed."""

import os

from s3_helpers import build

from tiering.testing.harness import load_blocks, make_key, store_blocks, tier_calls_in_forked_child


def test_c20_forked_child_of_an_s3_tier_fails_fast_and_the_parent_goes_on(s3):
    tier, view = build(s3.tier_config())
    keys = [make_key(i, b"fork") for i in range(2)]
    try:
        assert store_blocks(tier, view, keys)
        seen = tier_calls_in_forked_child(tier, view, keys, [4, 5], timeout_s=5)
        assert seen.pop("shutdown") == "ok"  # sent none of the parent's queued deletes, closed nothing of it
        for name, outcome in seen.items():
            assert outcome.startswith("ForkedStackError: "), (name, outcome)
            assert f"built in process {os.getpid()}" in outcome and "after forking" in outcome
        assert tier.stats()["forks"] == 1
        more = [make_key(i, b"fork") for i in range(2, 4)]
        assert store_blocks(tier, view, more, [2, 3])  # the parent's connections and threads still work
        assert load_blocks(tier, view, keys + more, [4, 5, 6, 7])
    finally:
        tier.shutdown()

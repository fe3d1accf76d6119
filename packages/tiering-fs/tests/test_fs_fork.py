"""A stack used in a child forked after it was built: refused at once, never a hang; the parent goes on."""

import os

from tiering.core.base import ReqContext, block_view
from tiering.core.runtime.tiering_spec import TieringOffloadingSpec
from tiering.testing.harness import (
    block_payload,
    call_outcomes,
    in_forked_child,
    load_blocks,
    make_key,
    store_blocks,
    tier_calls_in_forked_child,
    wait_for_lookup,
)

BLOCK = 4096
ADVICE = "Build the tiering stack in this process after forking"


def _config(tmp_path):
    return {
        "cpu_bytes_to_use": 16 * BLOCK,
        "block_bytes": BLOCK,
        "secondary_tiers": [{"type": "fs", "root": str(tmp_path / "kv")}],
    }


def _store(manager, keys, ctx):
    """Store ``keys`` through the manager (primary, cascaded to the fs tier) and wait for the cascade."""
    alloc = manager.prepare_store(keys, ctx)
    for key, slot in zip(alloc.keys, alloc.block_ids):
        block_view(manager.primary.kv_view, slot)[:] = block_payload(key, BLOCK)
    manager.complete_store(alloc.keys, ctx)
    while manager.has_pending_work():
        pass


def _manager_calls(manager, keys):
    """What the child sees of the manager: each call's outcome, by name (see ``call_outcomes``)."""
    ctx = ReqContext("child")
    calls = {
        "lookup": lambda: manager.lookup(keys, ctx),
        "prepare_store": lambda: manager.prepare_store([make_key(50)], ctx),
        "prepare_load": lambda: manager.prepare_load(keys, ctx),
        "touch": lambda: manager.touch(keys, ctx),
        "get_finished": manager.get_finished,
        "has_pending_work": manager.has_pending_work,
        "shutdown": manager.shutdown,  # does nothing here: the threads and files are the parent's
    }
    return call_outcomes(calls)


def _assert_refused(seen):
    for name, outcome in seen.items():
        if name == "shutdown":
            assert outcome == "ok"
        else:
            assert outcome.startswith("ForkedStackError: "), (name, outcome)
            assert ADVICE in outcome and f"built in process {os.getpid()}" in outcome, (name, outcome)


def test_c20_forked_child_of_an_fs_stack_fails_fast_and_the_parent_goes_on(tmp_path):
    manager = TieringOffloadingSpec(_config(tmp_path)).get_manager()
    tier = manager.secondary_tiers[0]
    keys = [make_key(i) for i in range(2)]
    try:
        _store(manager, keys, ReqContext("parent"))

        outcome = in_forked_child(lambda: _manager_calls(manager, keys), timeout_s=30)
        _assert_refused(outcome["returned"])
        assert outcome["seconds"] < 5  # nothing waited for a thread that does not exist
        _assert_refused(tier_calls_in_forked_child(tier, manager.primary.kv_view, keys, [9, 10], timeout_s=5))

        # The parent is unaffected: its threads run, its stores and loads work, its stats count the fork.
        assert tier.stats()["forks"] == 2
        more = [make_key(i) for i in range(2, 4)]
        _store(manager, more, ReqContext("parent-2"))
        assert load_blocks(tier, manager.primary.kv_view, keys + more, [12, 13, 14, 15])
    finally:
        manager.shutdown()


def test_c20_a_stack_built_after_the_fork_works_in_the_child(tmp_path):
    manager = TieringOffloadingSpec(_config(tmp_path)).get_manager()
    tier = manager.secondary_tiers[0]
    keys = [make_key(i) for i in range(2)]
    try:
        _store(manager, keys, ReqContext("parent"))

        def child():
            own = TieringOffloadingSpec(_config(tmp_path)).get_manager()  # the documented way
            try:
                fs = own.secondary_tiers[0]
                loaded = load_blocks(fs, own.primary.kv_view, keys, [0, 1], timeout_s=10)
                stored = store_blocks(fs, own.primary.kv_view, [make_key(100)], [2], timeout_s=10)
                return loaded, stored, fs.stats()["forks"]
            finally:
                own.shutdown()

        assert in_forked_child(child, timeout_s=30)["returned"] == (True, True, 0)
        # The parent sees the child's block on the shared root.
        assert wait_for_lookup(tier, make_key(100), ReqContext("parent"), timeout_s=10)
        assert load_blocks(tier, manager.primary.kv_view, [make_key(100)], [5])
    finally:
        manager.shutdown()

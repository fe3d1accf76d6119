"""The inspector conformance suite: ``tiering ls / stat / gc / verify`` through a persistent tier's inspector.

A persistent tier (one whose class returns a
:class:`~tiering.core.inspection.TierInspector` from ``inspector()``)
subclasses :class:`InspectorConformanceTests`, provides the ``tier_config``
fixture and the few hooks that need to touch its storage directly
(:meth:`~InspectorConformanceTests.corrupt_block`,
:meth:`~InspectorConformanceTests.plant_foreign`, optionally
:meth:`~InspectorConformanceTests.age_blocks`)::

    class TestFsInspector(InspectorConformanceTests):
        @pytest.fixture
        def tier_config(self, tmp_path):
            return {"type": "fs", "root": str(tmp_path / "kv")}

        def corrupt_block(self, tier_config, digest, block, how): ...
        def plant_foreign(self, tier_config): ...

Blocks are stored through the tier itself (as an engine would), then the
commands and the inspector are checked against what was stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest

from tiering.core.base import OffloadKey
from tiering.core.factory import create_secondary_tier
from tiering.core.inspection import BlockInfo, TierInspector, inspector_for
from tiering.core.primary import allocate_host_buffer
from tiering.core.runtime.tiering_spec import TieringOffloadingSpec
from tiering.testing.harness import make_key, store_blocks

Corruption = Literal["flip", "truncate"]


class InspectorConformanceTests:
    """Offline inspection and pruning of a persistent tier, as pytest tests.

    Class attributes a subclass may override: ``block_bytes``.
    """

    block_bytes = 4096

    # -- what a subclass provides -------------------------------------------------------
    @pytest.fixture
    def tier_config(self) -> dict[str, Any]:
        """The tier's ``secondary_tiers`` entry (``type`` included); subclasses must override."""
        raise NotImplementedError("subclasses provide the tier_config fixture")

    def corrupt_block(self, tier_config: dict[str, Any], digest: str, block: BlockInfo, how: Corruption) -> None:
        """Damage a stored block in place: ``"flip"`` one payload byte, or ``"truncate"`` it to a few bytes."""
        raise NotImplementedError("subclasses corrupt a block in their storage")

    def plant_foreign(self, tier_config: dict[str, Any]) -> str:
        """Put an entry that is not the tier's under its root or prefix; return the name ``foreign()`` gives it."""
        raise NotImplementedError("subclasses plant a foreign entry in their storage")

    def age_blocks(self, tier_config: dict[str, Any], digest: str, blocks: list[BlockInfo], age_s: float) -> None:
        """Make ``blocks`` look ``age_s`` seconds old to the inspector; default: the test is skipped."""
        pytest.skip("this tier cannot age its blocks in a test")

    # -- helpers ----------------------------------------------------------------------------
    def stack_config(self, tier_config: dict[str, Any], revision: str = "r1") -> dict[str, Any]:
        """A whole tiering config with this tier as its only secondary tier."""
        return {
            "cpu_bytes_to_use": 8 * self.block_bytes,
            "block_bytes": self.block_bytes,
            "model": "inspector/model",
            "model_revision": revision,
            "secondary_tiers": [tier_config],
        }

    def populate(self, tier_config: dict[str, Any], revision: str = "r1", n: int = 6) -> tuple[str, list[OffloadKey]]:
        """Store ``n`` blocks through the tier in the namespace of ``revision``; returns (digest, keys)."""
        spec = TieringOffloadingSpec(self.stack_config(tier_config, revision))
        view = allocate_host_buffer(8, self.block_bytes)
        tier = create_secondary_tier(tier_config, view, spec)
        keys = [make_key(i, revision.encode()) for i in range(n)]
        try:
            for start in range(0, n, 8):
                assert store_blocks(tier, view, keys[start : start + 8])
        finally:
            tier.shutdown()
        return spec.namespace.digest, keys

    def write_config(self, tmp_path: Path, config: dict[str, Any]) -> str:
        """``config`` as a JSON file; returns its path."""
        path = tmp_path / "tiering-config.json"
        path.write_text(json.dumps(config))
        return str(path)

    def inspector(self, tier_config: dict[str, Any]) -> TierInspector:
        """The tier's inspector (asserted present)."""
        inspector = inspector_for(tier_config)
        assert isinstance(inspector, TierInspector), f"{tier_config['type']!r} offers no inspector"
        return inspector

    def run(self, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
        """Run the ``tiering`` CLI; returns (exit status, stdout)."""
        from tiering.cli.main import main

        status = main(argv)
        return status, capsys.readouterr().out

    # -- the contract ------------------------------------------------------------------------
    def test_inspector_is_offered_by_the_tier_class(self, tier_config: dict[str, Any]) -> None:
        self.populate(tier_config, "r1", n=1)  # the root or bucket exists once the tier has run
        inspector = self.inspector(tier_config)
        assert isinstance(inspector.location(), str) and inspector.location()

    def test_blocks_and_namespaces_describe_what_was_stored(self, tier_config: dict[str, Any]) -> None:
        digest, keys = self.populate(tier_config, "r1", n=6)
        inspector = self.inspector(tier_config)
        assert digest in inspector.namespaces()
        blocks = list(inspector.blocks(digest))
        assert sorted(b.key for b in blocks) == sorted(keys)
        sizes = {b.size for b in blocks}
        assert len(sizes) == 1 and sizes.pop() >= self.block_bytes
        fields = inspector.namespace_fields(digest)
        assert fields is not None and fields.get("revision") == "r1"
        assert all(inspector.verify(digest, b) is None for b in blocks)

    def test_ls_lists_namespaces_counts_and_foreign(
        self, tier_config: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        d1, _ = self.populate(tier_config, "r1", n=6)
        d2, _ = self.populate(tier_config, "r2", n=3)
        foreign = self.plant_foreign(tier_config)
        status, out = self.run(["ls", self.write_config(tmp_path, self.stack_config(tier_config)), "--json"], capsys)
        assert status == 0
        (tier,) = json.loads(out)
        by_digest = {ns["digest"]: ns for ns in tier["namespaces"]}
        assert by_digest[d1]["blocks"] == 6 and by_digest[d2]["blocks"] == 3
        assert by_digest[d1]["fields"]["revision"] == "r1"
        assert by_digest[d1]["bytes"] == 2 * by_digest[d2]["bytes"] > 0
        assert foreign in tier["foreign"]

    def test_gc_namespace_removes_only_that_namespace(
        self, tier_config: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        keep, keep_keys = self.populate(tier_config, "r1", n=4)
        old, _ = self.populate(tier_config, "r0", n=3)
        foreign = self.plant_foreign(tier_config)
        path = self.write_config(tmp_path, self.stack_config(tier_config))
        assert self.run(["gc", path, "--namespace", old, "--dry-run"], capsys)[0] == 0
        inspector = self.inspector(tier_config)
        assert len(list(inspector.blocks(old))) == 3  # a dry run removes nothing
        assert self.run(["gc", path, "--namespace", old], capsys)[0] == 0
        inspector = self.inspector(tier_config)
        assert list(inspector.blocks(old)) == [] and inspector.read_namespace_file(old) is None
        assert sorted(b.key for b in inspector.blocks(keep)) == sorted(keep_keys)
        assert foreign in list(inspector.foreign())

    def test_gc_to_bytes_removes_oldest_first_and_leaves_foreign(
        self, tier_config: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        digest, _ = self.populate(tier_config, "r1", n=6)
        foreign = self.plant_foreign(tier_config)
        inspector = self.inspector(tier_config)
        size = next(iter(inspector.blocks(digest))).size
        path = self.write_config(tmp_path, self.stack_config(tier_config))
        assert self.run(["gc", path, "--to-bytes", str(2 * size)], capsys)[0] == 0
        assert len(list(inspector.blocks(digest))) == 2
        assert self.run(["gc", path, "--to-bytes", "0"], capsys)[0] == 0
        assert list(inspector.blocks(digest)) == []
        assert foreign in list(inspector.foreign())

    def test_gc_older_than_removes_only_old_blocks(
        self, tier_config: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        digest, _ = self.populate(tier_config, "r1", n=6)
        inspector = self.inspector(tier_config)
        blocks = sorted(inspector.blocks(digest), key=lambda b: b.key)
        self.age_blocks(tier_config, digest, blocks[:3], 3 * 86400)
        path = self.write_config(tmp_path, self.stack_config(tier_config))
        assert self.run(["gc", path, "--older-than", "2d"], capsys)[0] == 0
        assert sorted(b.key for b in inspector.blocks(digest)) == [b.key for b in blocks[3:]]

    def test_verify_finds_corruption_and_removes_it(
        self, tier_config: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        digest, _ = self.populate(tier_config, "r1", n=6)
        inspector = self.inspector(tier_config)
        blocks = sorted(inspector.blocks(digest), key=lambda b: b.key)
        flipped, truncated = blocks[0], blocks[1]
        self.corrupt_block(tier_config, digest, flipped, "flip")
        self.corrupt_block(tier_config, digest, truncated, "truncate")
        reasons = {b.key: inspector.verify(digest, b) for b in inspector.blocks(digest)}
        assert (reasons[flipped.key] or "").startswith("checksum"), reasons[flipped.key]
        assert reasons[truncated.key] is not None
        assert sum(r is not None for r in reasons.values()) == 2
        path = self.write_config(tmp_path, self.stack_config(tier_config))
        status, out = self.run(["verify", path], capsys)
        assert status == 1 and "CORRUPT" in out
        assert len(list(inspector.blocks(digest))) == 6  # reported, not removed
        assert self.run(["verify", path, "--remove"], capsys)[0] == 1
        left = {b.key for b in inspector.blocks(digest)}
        assert left == {b.key for b in blocks[2:]}
        assert self.run(["verify", path], capsys)[0] == 0

    def test_remove_blocks_removes_and_tolerates_blocks_already_gone(self, tier_config: dict[str, Any]) -> None:
        digest, keys = self.populate(tier_config, "r1", n=3)
        inspector = self.inspector(tier_config)
        victim = next(iter(inspector.blocks(digest)))
        assert inspector.remove_blocks(digest, [victim]) == 1
        # Removing it again is not an error (a store may report the missing object as deleted: 0 or 1).
        assert inspector.remove_blocks(digest, [victim]) in (0, 1)
        assert {b.key for b in inspector.blocks(digest)} == set(keys) - {victim.key}

    def test_stat_reports_resident_blocks(
        self, tier_config: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        digest, keys = self.populate(tier_config, "r1", n=5)
        status, out = self.run(["stat", self.write_config(tmp_path, self.stack_config(tier_config)), "--json"], capsys)
        assert status == 0
        report = json.loads(out)
        assert report["namespace"] == digest
        (tier,) = report["tiers"]
        assert tier["stats"]["resident_blocks"] == len(keys)

"""A minimal persistent tier for core's own tests: one file per block under a directory, with an inspector.

Blocks are ``<root>/<namespace digest>/<key hex>.blk`` = core header + payload;
``namespace.json`` beside them. Jobs run synchronously. It exists only so that
:class:`tiering.cli.testing.InspectorConformanceTests` runs in core without a backend.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from tiering.core.base import JobResult, SecondaryTierManager, block_view
from tiering.core.format import HEADER_SIZE, encode_header, verify_block
from tiering.core.inspection import BlockInfo, TierInspector

_DIGEST = re.compile(r"^[0-9a-f]{32}$")
_BLOCK = re.compile(r"^([0-9a-f]{2,128})\.blk$")


class DirInspector(TierInspector):
    def __init__(self, root: str) -> None:
        if not os.path.isdir(root):
            raise FileNotFoundError(f"root {root!r} does not exist")
        self.root = root

    def location(self) -> str:
        return self.root

    def namespaces(self) -> list[str]:
        return sorted(d for d in os.listdir(self.root) if _DIGEST.match(d) and os.path.isdir(self._dir(d)))

    def _dir(self, digest: str) -> str:
        return os.path.join(self.root, digest)

    def read_namespace_file(self, digest: str) -> bytes | None:
        try:
            with open(os.path.join(self._dir(digest), "namespace.json"), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def blocks(self, digest: str) -> Iterator[BlockInfo]:
        try:
            names = sorted(os.listdir(self._dir(digest)))
        except FileNotFoundError:
            return
        for name in names:
            match = _BLOCK.match(name)
            if match:
                st = os.stat(os.path.join(self._dir(digest), name))
                yield BlockInfo(
                    os.path.join(self._dir(digest), name), bytes.fromhex(match.group(1)), st.st_size, st.st_mtime
                )

    def foreign(self) -> Iterator[str]:
        for entry in sorted(os.listdir(self.root)):
            path = os.path.join(self.root, entry)
            if not (_DIGEST.match(entry) and os.path.isdir(path)):
                yield path
                continue
            for name in sorted(os.listdir(path)):
                if name != "namespace.json" and not _BLOCK.match(name):
                    yield os.path.join(path, name)

    def read_block(self, digest: str, block: BlockInfo) -> bytes:
        with open(block.name, "rb") as f:
            return f.read()

    def remove_blocks(self, digest: str, blocks: list[BlockInfo]) -> int:
        n = 0
        for block in blocks:
            try:
                os.unlink(block.name)
                n += 1
            except FileNotFoundError:
                pass
        return n

    def remove_namespace(self, digest: str) -> int:
        n = self.remove_blocks(digest, list(self.blocks(digest)))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._dir(digest), "namespace.json"))
        return n


class DirTier(SecondaryTierManager):
    medium = "storage"

    def __init__(self, offloading_spec, primary_kv_view, tier_type, root: str = "") -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        self.digest = offloading_spec.namespace.digest_bytes
        self.dir = os.path.join(root, offloading_spec.namespace.digest)
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "namespace.json"), "w") as f:
            json.dump(offloading_spec.namespace.to_dict(), f)
        self.finished: list[JobResult] = []

    @classmethod
    def inspector(cls, tier_config: Mapping[str, Any]) -> TierInspector:
        return DirInspector(str(tier_config["root"]))

    def _path(self, key: bytes) -> str:
        return os.path.join(self.dir, f"{key.hex()}.blk")

    def lookup(self, key, req_context):
        return os.path.exists(self._path(key))

    def submit_store(self, job):
        for key, b in zip(job.keys, job.block_ids):
            payload = block_view(self.primary_kv_view, b)
            tmp = self._path(key) + ".tmp"
            with open(tmp, "wb") as f:
                f.write(encode_header(self.digest, key, payload))
                f.write(payload)
            os.replace(tmp, self._path(key))
        self.finished.append(JobResult(job.job_id, True))

    def submit_load(self, job):
        ok = True
        for key, b in zip(job.keys, job.block_ids):
            try:
                with open(self._path(key), "rb") as f:
                    data = memoryview(f.read())
                verify_block(data[:HEADER_SIZE], data[HEADER_SIZE:], self.digest, key)
            except (OSError, ValueError):
                ok = False
                break
            block_view(self.primary_kv_view, b)[:] = data[HEADER_SIZE:]
        self.finished.append(JobResult(job.job_id, ok))

    def get_finished(self):
        out, self.finished = self.finished, []
        return out

    def stats(self):
        return {"resident_blocks": sum(1 for n in os.listdir(self.dir) if n.endswith(".blk"))}

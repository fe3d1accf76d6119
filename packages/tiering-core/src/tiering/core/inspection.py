"""Offline inspection of what a persistent tier holds: ``tiering ls / gc / verify``.

A persistent tier class offers ``inspector(tier_config) -> TierInspector``
(a classmethod) to walk its root or bucket without an engine: the
namespaces present, their blocks, files that are not ours. Removal goes
through the inspector too, so only block and namespace files of ours are
ever deleted; foreign entries are reported and left alone.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any

from tiering.core.format import HEADER_SIZE, BlockFormatError, TruncatedBlockError, parse_header, verify_block
from tiering.core.units import parse_duration as parse_duration  # re-exported: callers import both from here
from tiering.core.units import parse_size as parse_size


@dataclasses.dataclass(frozen=True)
class BlockInfo:
    """One stored block.

    Attributes:
        name: the tier's name for it (a path or an object key), for messages and removal.
        key: the block's OffloadKey (decoded from the name).
        size: stored bytes (header + payload).
        mtime: last modification, seconds since the epoch.
    """

    name: str
    key: bytes
    size: int
    mtime: float


@dataclasses.dataclass
class NamespaceSummary:
    """A namespace present in a tier: its fields (from ``namespace.json``) and usage."""

    digest: str
    fields: dict[str, Any] | None
    blocks: int = 0
    bytes: int = 0
    oldest: float | None = None
    newest: float | None = None

    def add(self, block: BlockInfo) -> None:
        """Count ``block``."""
        self.blocks += 1
        self.bytes += block.size
        self.oldest = block.mtime if self.oldest is None else min(self.oldest, block.mtime)
        self.newest = block.mtime if self.newest is None else max(self.newest, block.mtime)


class TierInspector(abc.ABC):
    """Walks and prunes one persistent tier's root or bucket."""

    @abc.abstractmethod
    def location(self) -> str:
        """Where the tier lives (a path or URL, a bucket and prefix), without credentials."""

    @abc.abstractmethod
    def namespaces(self) -> list[str]:
        """Digests of the namespaces present."""

    @abc.abstractmethod
    def read_namespace_file(self, digest: str) -> bytes | None:
        """The raw ``namespace.json`` of the namespace, None when absent."""

    def namespace_fields(self, digest: str) -> dict[str, Any] | None:
        """The fields recorded in the namespace's ``namespace.json`` (None if missing or not a JSON object)."""
        raw = self.read_namespace_file(digest)
        if raw is None:
            return None
        try:
            fields = json.loads(raw)
        except ValueError:
            return None
        return fields if isinstance(fields, dict) else None

    @abc.abstractmethod
    def blocks(self, digest: str) -> Iterator[BlockInfo]:
        """Every block of the namespace."""

    @abc.abstractmethod
    def foreign(self) -> Iterator[str]:
        """Entries under the root that are neither blocks nor namespace files of ours (never deleted)."""

    @abc.abstractmethod
    def read_block(self, digest: str, block: BlockInfo) -> bytes:
        """The stored bytes of ``block`` (header + payload)."""

    @abc.abstractmethod
    def remove_blocks(self, digest: str, blocks: list[BlockInfo]) -> int:
        """Remove ``blocks``; returns how many were removed (a block already gone is not an error)."""

    @abc.abstractmethod
    def remove_namespace(self, digest: str) -> int:
        """Remove every block and the namespace file of ``digest``; returns the blocks removed."""

    def free_bytes(self) -> int | None:
        """Bytes free where the tier writes (the disk under a local root), None when unknown or unbounded.

        ``tiering check --probe`` warns when a tier's ``capacity_bytes`` is larger. Creates nothing.
        """
        return None

    def summary(self, digest: str) -> NamespaceSummary:
        """Block count, bytes, oldest and newest block of a namespace."""
        out = NamespaceSummary(digest, self.namespace_fields(digest))
        for block in self.blocks(digest):
            out.add(block)
        return out

    def split_block(self, data: memoryview) -> tuple[memoryview, memoryview]:
        """Split a block's stored bytes into ``(header, payload)``; the default layout is header first.

        Raises:
            BlockFormatError: ``data`` is too short for the layout.
        """
        return data[:HEADER_SIZE], data[HEADER_SIZE:]

    def verify(self, digest: str, block: BlockInfo) -> str | None:
        """Check one block's header and checksum; returns None when sound, else the reason.

        Raises:
            OSError: the block cannot be read (it may have been removed meanwhile).
        """
        data = memoryview(self.read_block(digest, block))
        try:
            header, payload = self.split_block(data)
            expected = int(parse_header(header)["payload_len"])
            if payload.nbytes != expected:
                raise TruncatedBlockError(f"block holds {payload.nbytes} payload bytes, its header says {expected}")
            verify_block(header, payload, bytes.fromhex(digest), block.key)
        except BlockFormatError as exc:
            return f"{exc.reason}: {exc}"
        return None


class ObjectStoreInspector(TierInspector):
    """A :class:`TierInspector` of a store that names each block by one object key (a bucket, a key-value server).

    ``read_block`` and ``remove_blocks`` are built on three primitives, so a
    block of another namespace (or a name that is not a block) is refused
    before anything is read or deleted: :meth:`check_block`,
    :meth:`get_object` and :meth:`delete_objects`.
    """

    @abc.abstractmethod
    def check_block(self, digest: str, block: BlockInfo) -> None:
        """Refuse ``block`` unless its name is a block of namespace ``digest``.

        Raises:
            ValueError: naming the object and the namespace.
        """

    @abc.abstractmethod
    def get_object(self, name: str) -> bytes | None:
        """The bytes stored under ``name``; None when absent (errors raised as the inspector's own)."""

    @abc.abstractmethod
    def delete_objects(self, digest: str, blocks: list[BlockInfo]) -> int:
        """Delete the (checked) ``blocks`` of ``digest``; returns how many were removed."""

    def read_block(self, digest: str, block: BlockInfo) -> bytes:
        """The stored bytes of ``block`` (header + payload).

        Raises:
            ValueError: ``block`` is not a block of ``digest``.
            FileNotFoundError: it is gone.
        """
        self.check_block(digest, block)
        data = self.get_object(block.name)
        if data is None:
            raise FileNotFoundError(block.name)
        return bytes(data)

    def remove_blocks(self, digest: str, blocks: list[BlockInfo]) -> int:
        """Remove ``blocks``, every one checked before anything is deleted; returns how many were removed.

        Raises:
            ValueError: one of ``blocks`` is not a block of ``digest`` (nothing is deleted then).
        """
        for block in blocks:
            self.check_block(digest, block)
        return self.delete_objects(digest, blocks) if blocks else 0


def inspector_for(tier_config: Mapping[str, Any], index: int = 0) -> TierInspector | None:
    """The inspector of a ``secondary_tiers`` entry, or None for a tier that keeps nothing.

    Raises:
        ValueError, ImportError, AttributeError, TypeError: see
            :func:`tiering.core.factory.resolve_tier`; the inspector's own
            errors for an unreachable root or bucket, labelled
            ``secondary_tiers[<index>]`` (and ``.<key>`` where it can be told).
    """
    from tiering.core.factory import resolve_tier, tier_error

    cls, _, kwargs = resolve_tier(tier_config, index)
    factory = getattr(cls, "inspector", None)
    if factory is None:
        return None
    try:
        inspector: TierInspector = factory(kwargs)
    except Exception as exc:
        labelled = tier_error(exc, tier_config, index)
        if labelled is exc:
            raise
        raise labelled from exc
    return inspector

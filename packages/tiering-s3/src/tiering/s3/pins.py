"""Pin records of the s3 tier: one empty marker object per pin, its expiry in its name.

Layout (next to the blocks, see :mod:`tiering.s3.layout`)::

    <prefix>/<namespace digest>/pins/<key hex>.<expiry, ms since the epoch>.pin

A marker is one ``PutObject`` of no bytes: it appears whole or not at all,
and one ``ListObjectsV2`` of ``<base>/pins/`` reads every pin with its
expiry (no ``GetObject`` per pin). Every process sharing the prefix reads
the same markers (:class:`tiering.core.policies.pin_records.PinBook`); a restart
finds them again; a marker nobody renews is ignored once its expiry is past
and deleted by the next refresh of any process. The tier's listing of
blocks ignores markers (``pins`` is not a two-hex-digit shard).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tiering.core.base import OffloadKey
from tiering.core.policies.pin_records import marker_name, parse_marker
from tiering.s3.client import S3Client

PINS_INFIX = "pins"
"""The folder of pin markers under ``<prefix>/<digest>/``."""


class S3Pins:
    """The :class:`~tiering.core.policies.pin_records.PinMedium` of one s3 namespace.

    Args:
        client: the tier's S3 client.
        base: ``<prefix>/<digest>`` (:attr:`tiering.s3.layout.Layout.base`).

    Every method raises :class:`~tiering.s3.errors.S3RequestError` when a request fails.
    """

    def __init__(self, client: S3Client, base: str) -> None:
        self.client = client
        self.folder = f"{base}/{PINS_INFIX}/"

    def list_pins(self) -> Iterator[tuple[OffloadKey, float]]:
        """Every marker's ``(key, expiry)``."""
        for page in self.client.list_pages(self.folder):
            for obj in page.get("Contents", ()):
                parsed = parse_marker(obj["Key"][len(self.folder) :])
                if parsed is not None:
                    yield parsed

    def write_pins(self, keys: Sequence[OffloadKey], expiry: float) -> None:
        """One empty ``PutObject`` per key."""
        for key in keys:
            self.client.put(self.folder + marker_name(key, expiry), b"", if_absent=False)

    def remove_pins(self, records: Sequence[tuple[OffloadKey, float]]) -> None:
        """Delete these markers (batched); already gone is no error.

        Raises:
            OSError: some could not be deleted (the count and the first error code).
        """
        failed = self.client.delete_many([self.folder + marker_name(k, e) for k, e in records])
        if failed:
            raise OSError(f"{len(failed)} pin markers under {self.folder} not deleted ({next(iter(failed.values()))})")

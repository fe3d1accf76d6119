"""Pin records of the fs tier: one empty marker file per pin, its expiry in its name.

Layout::

    <root>/<namespace digest>/pins/<key hex>.<expiry, ms since the epoch>.pin

A marker is published with the backend's atomic small-file write (temporary
name, then rename), so it appears whole or not at all; it holds no bytes, so
there is nothing to tear. Every process sharing the root lists the same
directory (:class:`tiering.core.policies.pin_records.PinBook` reads it), a restart
finds the markers again, and a marker nobody renews is ignored once its
expiry is past and removed by the next refresh of any process. The start-up
scan leaves markers alone (they are not block names) and removes stale
temporaries of markers as it does those of blocks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tiering.core.base import OffloadKey
from tiering.core.policies.pin_records import marker_name, parse_marker
from tiering.fs.io import Backend
from tiering.fs.layout import temp_namer

PINS_DIR = "pins"
"""The directory of pin markers inside a namespace directory."""


class FsPins:
    """The :class:`~tiering.core.policies.pin_records.PinMedium` of one fs namespace directory.

    Args:
        backend: the tier's storage back end.
        namespace_dir: the namespace directory (``<root>/<digest>``).

    Every method raises the back end's ``OSError`` when the filesystem fails.
    """

    def __init__(self, backend: Backend, namespace_dir: str) -> None:
        self.backend = backend
        self.directory = f"{namespace_dir}/{PINS_DIR}"

    def list_pins(self) -> Iterator[tuple[OffloadKey, float]]:
        """Every marker's ``(key, expiry)``; none when the directory does not exist yet."""
        for entry in self.backend.scan(self.directory):
            parsed = None if entry.is_link or entry.is_special else parse_marker(entry.name)
            if parsed is not None:
                yield parsed

    def write_pins(self, keys: Sequence[OffloadKey], expiry: float) -> None:
        """Publish one marker per key (atomically each)."""
        self.backend.makedirs(self.directory)
        for key in keys:
            final = f"{self.directory}/{marker_name(key, expiry)}"
            self.backend.write_small_atomic(temp_namer(final), final, b"")

    def remove_pins(self, records: Sequence[tuple[OffloadKey, float]]) -> None:
        """Remove these markers (already gone: no error).

        Raises:
            OSError: a marker could not be removed.
        """
        failed = [k for k, e in records if not self.backend.remove(f"{self.directory}/{marker_name(k, e)}")]
        if failed:
            raise OSError(f"{len(failed)} pin markers in {self.directory} could not be removed")

"""``tiering check --probe`` of an ``fs`` entry: where its root is, which block I/O path it takes, creating nothing."""

from __future__ import annotations

from typing import Any

from tiering.fs.root import probe_root


def probe_entry(tier_config: Any) -> str:
    """What ``tiering check --probe`` says of an ``fs`` entry, creating nothing.

    :func:`probe_root` of the entry's root; for a local root also which block
    I/O path is used and, when ``capacity_bytes`` is unbounded or more than
    the disk has free, that the cap in force will be what the disk holds.

    Raises:
        InvalidTypeError, InvalidValueError: a bad entry (the key named).
        RootNotUsableError: the root cannot be used.
    """
    from tiering.fs.config import FS_SCHEMA
    from tiering.fs.inspection import FsInspector
    from tiering.fs.native import status

    cfg = FS_SCHEMA.validate(tier_config)
    found = probe_root(cfg["root"], cfg["storage_options"], str(tier_config.get("type", "fs")))
    local = "::" not in cfg["root"] and ("://" not in cfg["root"] or cfg["root"].startswith("file://"))
    if not local:
        return found
    found = f"{found}; {status()}"
    free, cap = FsInspector.from_config(cfg).free_bytes(), cfg["capacity_bytes"]
    if free is not None and (cap is None or cap > free):
        found += (
            f"; capacity_bytes {'unbounded' if cap is None else cap} is more than the {free} bytes free: "
            "once the disk is full the tier lowers its cap to what the disk holds and evicts "
            "(stats capacity_bytes)"
        )
    return found

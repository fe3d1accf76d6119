"""tiering-fs: a filesystem secondary tier (local fast path, any fsspec filesystem)."""

from tiering.fs.__about__ import __version__
from tiering.fs.errors import DirectIONotUsableError, RootNotUsableError
from tiering.fs.tier import FsspecSecondaryTierManager

__all__ = ["DirectIONotUsableError", "FsspecSecondaryTierManager", "RootNotUsableError", "__version__"]

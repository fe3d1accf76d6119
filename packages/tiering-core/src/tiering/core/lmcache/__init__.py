"""Deprecated: moved to :mod:`tiering.lmcache` (distribution tiering-lmcache).

This path is removed in the next release.
"""

from tiering.core._moved import forward

__getattr__ = forward(__name__, "tiering.lmcache", "tiering-lmcache")

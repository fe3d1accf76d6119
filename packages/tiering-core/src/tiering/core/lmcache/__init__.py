"""Deprecated: moved to :mod:`tiering.lmcache` (distribution tiering-lmcache).

This path is removed in the next release.
"""

from tiering.core._moved import alias

alias(__name__, "tiering.lmcache", "tiering-lmcache")

"""Deprecated: moved to :mod:`tiering.lmcache.adapter` (distribution tiering-lmcache).

This path is removed in the next release.
"""

from tiering.core._moved import alias

alias(__name__, "tiering.lmcache.adapter", "tiering-lmcache")

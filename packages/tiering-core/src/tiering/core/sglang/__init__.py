"""Deprecated: moved to :mod:`tiering.sglang` (distribution tiering-sglang).

This path is removed in the next release.
"""

from tiering.core._moved import alias

alias(__name__, "tiering.sglang", "tiering-sglang")

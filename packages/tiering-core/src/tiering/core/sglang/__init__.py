"""Deprecated: moved to :mod:`tiering.sglang` (distribution tiering-sglang).

This path is removed in the next release.
"""

from tiering.core._moved import forward

__getattr__ = forward(__name__, "tiering.sglang", "tiering-sglang")

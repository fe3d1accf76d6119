"""Deprecated: moved to :mod:`tiering.testing` (distribution tiering-testing).

This path is removed in the next release.
"""

from tiering.core._moved import forward

__getattr__ = forward(__name__, "tiering.testing", "tiering-testing")

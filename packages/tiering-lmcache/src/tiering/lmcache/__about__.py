"""Version of the tiering-lmcache distribution (the hatch version source)."""

__version__ = "0.1.0"

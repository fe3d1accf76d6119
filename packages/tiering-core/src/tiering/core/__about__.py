"""Version of the tiering-core distribution (the hatch version source)."""

__version__ = "0.2.0"

"""Version of the tiering-core distribution (the hatch version source)."""

__version__ = "0.1.0"

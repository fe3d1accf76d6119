"""Version of the tiering-fs distribution (the hatch version source)."""

__version__ = "0.1.0"

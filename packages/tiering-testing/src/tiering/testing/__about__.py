"""Version of the tiering-testing distribution (the hatch version source)."""

__version__ = "0.1.0"

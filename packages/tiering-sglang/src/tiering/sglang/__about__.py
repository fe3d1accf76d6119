"""Version of the tiering-sglang distribution (the hatch version source)."""

__version__ = "0.1.0"

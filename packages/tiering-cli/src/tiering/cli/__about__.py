"""Version of the tiering-cli distribution (the hatch version source)."""

__version__ = "0.1.0"

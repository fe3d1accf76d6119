"""Version of the tiering-example distribution (the hatch version source)."""

__version__ = "0.1.0"

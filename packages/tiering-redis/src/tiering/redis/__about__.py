"""Version of the tiering-redis distribution (the hatch version source)."""

__version__ = "0.1.0"

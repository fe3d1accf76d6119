"""Version of the tiering-s3 distribution (the hatch version source)."""

__version__ = "0.1.0"

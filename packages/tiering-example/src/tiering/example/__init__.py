"""tiering-example: the reference secondary tier (an in-memory dict)."""

from tiering.example.__about__ import __version__
from tiering.example.tier import ExampleSecondaryTierManager

__all__ = ["ExampleSecondaryTierManager", "__version__"]

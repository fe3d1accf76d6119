"""tiering-redis: a secondary tier that keeps KV-cache blocks as keys of a Redis server, shared by a fleet.

Config: ``{"type": "redis", "url": "redis://host:6379/0", ...}``; see
:class:`RedisSecondaryTierManager`, :data:`tiering.redis.config.SCHEMA` and the
package README for every key.
"""

from tiering.redis.__about__ import __version__
from tiering.redis.errors import ERROR_CLASSES, RedisStartupError, classify_error
from tiering.redis.tier import RedisSecondaryTierManager

__all__ = ["ERROR_CLASSES", "RedisSecondaryTierManager", "RedisStartupError", "__version__", "classify_error"]

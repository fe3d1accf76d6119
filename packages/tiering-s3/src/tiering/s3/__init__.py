"""tiering-s3: a secondary tier that keeps KV-cache blocks as objects in an S3 bucket.

Config: ``{"type": "s3", "bucket": "my-bucket", "prefix": "kv/tenantA", ...}``;
see :class:`S3SecondaryTierManager` and the package README for every key.
"""

from tiering.s3.__about__ import __version__
from tiering.s3.errors import ERROR_CLASSES, S3StartupError, classify_error
from tiering.s3.tier import S3SecondaryTierManager

__all__ = ["ERROR_CLASSES", "S3SecondaryTierManager", "S3StartupError", "__version__", "classify_error"]

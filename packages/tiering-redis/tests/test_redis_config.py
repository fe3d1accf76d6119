"""The redis tier's keys are declared once, in its schema: the constructor names none of them itself."""

import inspect

from tiering.core.declared import declaration_drift
from tiering.redis import RedisSecondaryTierManager
from tiering.redis.config import SCHEMA, RedisSettings


def test_config_declared_once_names_and_defaults():
    assert RedisSecondaryTierManager.config_schema is SCHEMA
    # the constructor takes every key as **config: none of its keywords may carry a default of its own
    assert declaration_drift(SCHEMA, RedisSecondaryTierManager) == []
    kinds = [p.kind for p in inspect.signature(RedisSecondaryTierManager).parameters.values()]
    assert kinds[-1] is inspect.Parameter.VAR_KEYWORD
    # the settings hold the schema's defaults, nothing else
    settings = RedisSettings.from_config({})
    assert dict(settings.values) == SCHEMA.defaults()
    assert (settings["pipeline_blocks"], settings["mode"], settings["url"]) == (8, "standalone", None)

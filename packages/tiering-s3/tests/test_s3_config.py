"""The s3 tier's keys are declared once: the schema's names and defaults are the constructor's and the settings'."""

from tiering.core.declared import declaration_drift
from tiering.s3 import S3SecondaryTierManager
from tiering.s3.config import SCHEMA, ConnectionSettings


def test_config_declared_once_names_and_defaults():
    assert S3SecondaryTierManager.config_schema is SCHEMA
    assert declaration_drift(SCHEMA, S3SecondaryTierManager) == []
    assert declaration_drift(SCHEMA, ConnectionSettings, subset=True) == []
    settings = ConnectionSettings()
    assert (settings.bucket, settings.max_concurrency, settings.read_timeout) == (None, 16, 30.0)
    assert settings.max_concurrency == SCHEMA.keys["max_concurrency"].default
    # the credentials are kept out of repr whatever the schema says
    assert "aws_access_key_id" not in repr(ConnectionSettings(aws_access_key_id="AKIAEXAMPLEKEYID0000"))

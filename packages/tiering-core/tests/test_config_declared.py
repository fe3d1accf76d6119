"""A tier's keys declared once: dataclass defaults from the schema, and drift of a constructor or dataclass found."""

import dataclasses

import pytest

from tiering.core.declared import declaration_drift, declared_default, schema_defaults
from tiering.core.schema import ConfigKey, ConfigSchema

SCHEMA = ConfigSchema(
    "demo",
    [
        ConfigKey("root", (str,), required=True),
        ConfigKey("threads", (int,), default=8),
        ConfigKey("fsync", (bool,), default=False),
        ConfigKey("wait_s", (float,), default=2.0),
        ConfigKey("tags", (list,), default=["a"]),
    ],
)


class AlmostAgrees:
    def __init__(
        self, offloading_spec, primary_kv_view, tier_type, root=None, threads=8, fsync=False, wait_s=2, tags=("x",)
    ):
        pass


def test_a_constructor_that_agrees_except_one_default():
    # 2 for 2.0 is the same default; a tuple for the list is not
    assert declaration_drift(SCHEMA, AlmostAgrees) == ["tags: default ('x',) here, ['a'] in the schema"]


def test_drift_of_a_constructor_names_every_difference():
    def drifted(offloading_spec, primary_kv_view, tier_type, root="/kv", threads=4, fsync=0, *, rooot=None):
        pass

    assert declaration_drift(SCHEMA, drifted) == [
        "parameter 'rooot' is not a key",
        "key 'wait_s' has no parameter",
        "key 'tags' has no parameter",
        "root: default '/kv' here, None in the schema",
        "threads: default 4 here, 8 in the schema",
        "fsync: default 0 here, False in the schema",
    ]
    assert declaration_drift(SCHEMA, drifted, subset=True)[0] == "parameter 'rooot' is not a key"


def test_a_constructor_taking_every_key_as_keywords_is_checked_for_what_it_names():
    def open_ended(offloading_spec, primary_kv_view, tier_type, threads=8, **config):
        pass

    def wrong(offloading_spec, primary_kv_view, tier_type, threads=16, **config):
        pass

    assert declaration_drift(SCHEMA, open_ended) == []
    assert declaration_drift(SCHEMA, wrong) == ["threads: default 16 here, 8 in the schema"]


def test_a_required_key_may_be_a_keyword_without_default_but_an_optional_one_may_not():
    def required_kw(offloading_spec, primary_kv_view, tier_type, *, root, threads, fsync=False, wait_s=2.0, tags=None):
        pass

    assert declaration_drift(SCHEMA, required_kw) == [
        "threads: default none here, 8 in the schema",
        "tags: default None here, ['a'] in the schema",
    ]


def test_schema_defaults_fill_a_dataclass_and_the_drift_check_agrees():
    @dataclasses.dataclass(frozen=True)
    @schema_defaults(SCHEMA)
    class Config:
        root: str
        threads: int
        fsync: bool = dataclasses.field(repr=False)
        wait_s: float
        tags: list[str]

    first, second = Config(), Config(root="/kv")
    assert (first.root, first.threads, first.fsync, first.wait_s, first.tags) == (None, 8, False, 2.0, ["a"])
    assert first.tags is not second.tags and first.tags is not SCHEMA.keys["tags"].default  # copied, never shared
    assert "fsync" not in repr(second)
    assert declaration_drift(SCHEMA, Config) == []
    assert declared_default(SCHEMA.keys["root"]) is None


def test_schema_defaults_refuse_a_field_that_is_no_key_a_key_without_field_and_an_own_default():
    with pytest.raises(
        TypeError, match=r"\.Bad: fields not in tier 'demo''s schema: rooot; keys without a field: root$"
    ):

        @schema_defaults(SCHEMA)
        class Bad:
            rooot: str
            threads: int
            fsync: bool
            wait_s: float
            tags: list[str]

    with pytest.raises(TypeError, match=r"\.Own\.threads: declares a default of its own; .*schema's \(8\)$"):

        @schema_defaults(SCHEMA, subset=True)
        class Own:
            threads: int = 4

    with pytest.raises(TypeError, match=r"\.Field\.threads: declares a default of its own"):

        @schema_defaults(SCHEMA, subset=True)
        class Field:
            threads: int = dataclasses.field(default=8)

    @dataclasses.dataclass
    @schema_defaults(SCHEMA, subset=True)
    class Part:
        threads: int

    assert Part().threads == 8
    assert declaration_drift(SCHEMA, Part, subset=True) == []

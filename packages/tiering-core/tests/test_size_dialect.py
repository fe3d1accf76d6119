"""One size dialect wherever tiering reads a byte count: the same forms accepted, the same answer to a bad one."""

import pytest

from tiering.core import TieringOffloadingSpec
from tiering.core.policies.admission import admission_schema
from tiering.core.policies.tenancy import TenantPolicy
from tiering.core.units import SIZE_EXAMPLES


def spec_cpu(value):
    return TieringOffloadingSpec({"cpu_bytes_to_use": value, "block_bytes": 1024}).cpu_bytes_to_use


def spec_block(value):
    return TieringOffloadingSpec({"cpu_bytes_to_use": 1 << 30, "block_bytes": value}).block_bytes


def tenant_quota(value):
    policy = TenantPolicy.from_config({"default": {"quota_bytes": value}})
    assert policy is not None
    return policy.default.quota_bytes


def sketch(value):
    return admission_schema("fs").validate({"admission": "second_sighting", "admission_sketch_bytes": value})[
        "admission_sketch_bytes"
    ]


def lmcache_object(value):
    params = pytest.importorskip("tiering.lmcache.params")
    return params.parse_params({"tier": {"type": "fs", "root": "/x"}, "object_bytes": value}).object_bytes


READERS = {
    "cpu_bytes_to_use": spec_cpu,
    "block_bytes": spec_block,
    "quota_bytes": tenant_quota,
    "admission_sketch_bytes": sketch,
    "object_bytes": lmcache_object,
}


@pytest.mark.parametrize("key", READERS)
@pytest.mark.parametrize(("written", "count"), [("2MiB", 2 << 20), ("2 MiB", 2 << 20), ("2MB", 2_000_000),
                                               ("2097152", 2 << 20), (2 << 20, 2 << 20)])  # fmt: skip
def test_every_size_key_tiering_reads_takes_the_same_forms(key, written, count):
    assert READERS[key](written) == count


@pytest.mark.parametrize("key", ["cpu_bytes_to_use", "block_bytes", "quota_bytes", "object_bytes"])
@pytest.mark.parametrize("bad", ["2 gigs", 2.5, True])
def test_a_bad_size_gets_one_answer_naming_the_key(key, bad):
    with pytest.raises(ValueError) as err:
        READERS[key](bad)
    text = str(err.value)
    assert f"{key}' must be an integer of bytes >= " in text or f"{key} must be an integer of bytes >= " in text
    assert f"or a size with a unit ({SIZE_EXAMPLES}), got {bad!r}" in text

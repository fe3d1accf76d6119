"""SGLang's HiCache decides what it writes: a tier entry's admission policy is refused, naming the key."""

import pytest

from tiering.core.schema import InvalidValueError
from tiering.sglang.config import tiering_config


def test_sglang_refuses_an_admission_policy(tmp_path):
    entry = {"type": "fs", "root": str(tmp_path), "admission": "second_sighting"}
    with pytest.raises(InvalidValueError, match=r"secondary_tiers\[0\]\.admission: .*under SGLang's HiCache"):
        tiering_config({"secondary_tiers": [entry]})

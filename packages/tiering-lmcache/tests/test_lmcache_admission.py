"""LMCache decides what reaches its L2: an adapter's tier entry with an admission policy is refused, naming the key."""

import pytest

from tiering.core.schema import InvalidValueError
from tiering.lmcache.params import parse_params


def test_lmcache_refuses_an_admission_policy(tmp_path):
    entry = {"type": "fs", "root": str(tmp_path), "admission": "second_sighting"}
    with pytest.raises(InvalidValueError, match=r"adapter_params\.tier\.admission: .*under LMCache"):
        parse_params({"tier": entry, "object_bytes": 4096})
    sketch_only = {"type": "fs", "root": str(tmp_path), "admission": "always", "admission_sketch_bytes": 4096}
    with pytest.raises(InvalidValueError, match=r"adapter_params\.tier\.admission_sketch_bytes: "):
        parse_params({"tier": sketch_only, "object_bytes": 4096})
    parse_params({"tier": {**entry, "admission": "always"}, "object_bytes": 4096})  # the default is fine

"""Case C03: block keys are the same in every interpreter (never Python's hash())."""

import os
import subprocess
import sys

import pytest

from tiering.core.keys import block_keys

TOKENS = list(range(1000))
CODE = "from tiering.core.keys import block_keys; print(','.join(k.hex() for k in block_keys(list(range(1000)), 16)))"


def test_C03_known_answer():
    keys = block_keys(TOKENS, 16)
    assert len(keys) == 1000 // 16
    assert all(len(k) == 32 for k in keys)
    assert keys[0].hex() == "aee11472eb9d9358e8c84f558bb587155b761575e53f24de31fd81c789c24596"
    assert keys[-1].hex() == "51198b0c6d267ea8b0574e9a0071d4cb9859af41ff0207d710f9872f5085dd22"


def test_C03_identical_across_hash_seeds():
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True)
        outputs.add(out.stdout.strip())
    assert len(outputs) == 1
    assert outputs.pop() == ",".join(k.hex() for k in block_keys(TOKENS, 16))


def test_prefix_property_and_partial_block():
    a = block_keys(TOKENS, 16)
    b = block_keys(TOKENS[:500] + [7] * 500, 16)
    assert a[:31] == b[:31]  # 500 // 16 = 31 shared full blocks
    assert a[31] != b[31]
    assert block_keys(TOKENS[:15], 16) == []


def test_bad_block_size():
    with pytest.raises(ValueError, match="block_size"):
        block_keys(TOKENS, 0)


def test_first_key_matches_an_independent_sha256_chain():
    import hashlib
    import struct

    root = hashlib.sha256(b"tiering.prefix-hash.v1").digest()
    expected = hashlib.sha256(root + struct.pack("<16I", *range(16))).digest()
    assert block_keys(TOKENS, 16)[0] == expected

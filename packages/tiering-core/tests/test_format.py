import pytest
import xxhash

from tiering.core.format import (
    GIL_FREE_HASH_BYTES,
    HEADER_SIZE,
    MAX_KEY_BYTES,
    CorruptBlockError,
    ForeignBlockError,
    TruncatedBlockError,
    checksum,
    encode_block,
    encode_header,
    verify_block,
)

NS = bytes(range(16))
KEY = b"k" * 36
PAYLOAD = bytes(range(256)) * 64


def test_round_trip_verifies():
    header = encode_header(NS, KEY, PAYLOAD)
    assert len(header) == HEADER_SIZE
    verify_block(header, PAYLOAD, NS, KEY, stored_size=HEADER_SIZE + len(PAYLOAD))
    assert encode_block(NS, KEY, PAYLOAD) == header + PAYLOAD


def test_checksum_is_xxh3_known_answer():
    # XXH3-64 of the empty input (reference value from the xxHash spec).
    assert checksum(b"") == 0x2D06800538D394C2


@pytest.mark.parametrize("size", [0, 36, GIL_FREE_HASH_BYTES - 1, GIL_FREE_HASH_BYTES, 256 * 1024 + 7])
def test_checksum_is_the_same_xxh3_on_both_sides_of_the_gil_free_size(size):
    data = bytes((i * 7 + 3) % 251 for i in range(size))
    # Blocks take the streaming form, which releases the GIL; the digest must not depend on the form.
    assert checksum(data) == xxhash.xxh3_64_intdigest(data) == xxhash.xxh3_64(data).intdigest()
    assert checksum(memoryview(bytearray(data))) == checksum(data)


def test_payload_bit_flip_is_corrupt():
    header = encode_header(NS, KEY, PAYLOAD)
    flipped = bytearray(PAYLOAD)
    flipped[1000] ^= 0x01
    with pytest.raises(CorruptBlockError) as info:
        verify_block(header, flipped, NS, KEY)
    assert info.value.reason == "checksum"


@pytest.mark.parametrize("offset", [0, 5, 10, 30, 45, 110])
def test_header_bit_flip_is_corrupt(offset):
    header = bytearray(encode_header(NS, KEY, PAYLOAD))
    header[offset] ^= 0x80
    with pytest.raises(CorruptBlockError):
        verify_block(header, PAYLOAD, NS, KEY)


def test_truncated_block():
    header = encode_header(NS, KEY, PAYLOAD)
    with pytest.raises(TruncatedBlockError):
        verify_block(header, PAYLOAD, NS, KEY, stored_size=100)
    with pytest.raises(TruncatedBlockError):
        verify_block(header[:50], PAYLOAD, NS, KEY)


def test_foreign_namespace_key_and_length():
    header = encode_header(NS, KEY, PAYLOAD)
    with pytest.raises(ForeignBlockError, match="namespace"):
        verify_block(header, PAYLOAD, bytes(16), KEY)
    with pytest.raises(ForeignBlockError, match="key"):
        verify_block(header, PAYLOAD, NS, b"other")
    with pytest.raises(ForeignBlockError, match="payload of"):
        verify_block(header, PAYLOAD[:-1], NS, KEY)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="at most 64"):
        encode_header(NS, b"x" * (MAX_KEY_BYTES + 1), PAYLOAD)
    with pytest.raises(ValueError, match="namespace digest"):
        encode_header(b"short", KEY, PAYLOAD)

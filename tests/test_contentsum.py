"""The two forms of a content checksum and the in-order hashing that checks them (no mount,
no store)."""

from __future__ import annotations

import os
import zlib

import pytest
import xxhash

from ckptgw.fsops.contentsum import Hasher, crc32_combine, part_size_of, parts_checksum
from ckptgw.store.crc import CRC32_IMPL, composite, crc32, crc32_b64

PART = 1 << 16


def test_the_fast_crc32_is_installed_and_gives_zlibs_values() -> None:
    """Objects written before keep their checksums: the faster CRC32 must give the very values
    zlib gives, for every length and starting value, from bytes and from views of them."""
    assert CRC32_IMPL == "zlib-ng"  # a dependency: without it the drain pays 3.5x the CPU
    data = os.urandom(3 * PART + 77)
    view = memoryview(bytearray(data))
    for n in (0, 1, 15, 16, 63, 64, 65, 4095, PART, len(data)):
        for start in (0, 1, 0xFFFFFFFF, zlib.crc32(b"x")):
            assert crc32(data[:n], start) == zlib.crc32(data[:n], start)
            assert crc32(view[3 : 3 + n], start) == zlib.crc32(data[3 : 3 + n], start)


@pytest.mark.parametrize("len2", [0, 1, 7, PART, 3 * PART + 5])
def test_crc32_combine_is_the_crc32_of_the_concatenation(len2: int) -> None:
    a, b = os.urandom(1000), os.urandom(len2)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@pytest.mark.parametrize("size", [0, 1, PART - 1, PART, PART + 1, 5 * PART + 123])
@pytest.mark.parametrize("piece", [1000, PART, 3 * PART])
def test_parts_are_hashed_whatever_the_pieces_they_come_in(size: int, piece: int) -> None:
    data = os.urandom(size)
    h = Hasher(PART)
    for i in range(0, size, piece):
        h.update(memoryview(data)[i : i + piece])
    parts = [data[i : i + PART] for i in range(0, size, PART)] or [b""]
    value = crc32_b64(composite([zlib.crc32(p) for p in parts]))
    assert h.digest() == parts_checksum(PART, value)
    assert part_size_of(h.digest()) == PART
    # S3 says the count; a copy has the whole content's CRC32 (no count).
    assert h.matches(parts_checksum(PART, f"{value}-{len(parts)}")) is True
    assert h.matches(parts_checksum(PART, crc32_b64(zlib.crc32(data)))) is True
    assert h.matches(parts_checksum(PART, f"{value}-{len(parts) + 1}")) is False


def test_a_changed_byte_or_another_form_never_matches() -> None:
    data = bytearray(os.urandom(3 * PART))
    h = Hasher(PART)
    h.update(data)
    good = h.digest()
    data[2 * PART + 10] ^= 1
    damaged = Hasher(PART)
    damaged.update(data)
    assert damaged.matches(good) is False
    assert h.matches(xxhash.xxh3_128_hexdigest(bytes(data))) is None  # another form: cannot tell
    plain = Hasher()
    plain.update(data)
    assert plain.digest() == xxhash.xxh3_128_hexdigest(bytes(data)) and part_size_of(None) is None
    assert plain.matches(plain.digest()) is True and plain.matches(good) is None

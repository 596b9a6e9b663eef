"""A file's content checksum, in one of two forms, and the in-order hashing that checks it.

* **xxh3-128** (32 hex digits): the xxh3-128 of the content. A single PUT carries it in the
  object's metadata: the file is read once, for the hash and for the body.
* **Parts** (``crc32:<part size>:<value>``): the checksum of a multipart upload whose parts are
  ``part size`` bytes (the last one fewer). Each part's CRC32 is computed from the very bytes
  sent, in the read that sends them (one read of the cache file per upload: the checksum needs
  no pass of its own, and the metadata, fixed at CreateMultipartUpload, needs only the part
  size). The part goes with its CRC32, which the store checks, and the object's checksum is
  the store's: the CRC32 of the parts' CRC32s (S3's COMPOSITE checksum; S3 reports it as
  ``<base64>-<parts>``, moto without the count). A server-side copy has the CRC32 of the whole
  content instead (CopyObject names an algorithm: S3 and moto compute a full-object value).
  :meth:`Hasher.matches` accepts either: it derives the whole content's CRC32 from the parts'
  (:func:`crc32_combine`), so the content is read once for both.

A checksum of one form is never compared with a value of the other: :meth:`Hasher.matches`
says None (cannot tell), and the caller hashes again in the expected form.
"""

from __future__ import annotations

import functools
import zlib

import xxhash

from ckptgw.store.crc import composite, crc32, crc32_b64

PARTS = "crc32:"


def parts_checksum(part_size: int, value: str) -> str:
    """The checksum string of a multipart object: its parts' size and the store's CRC32."""
    return f"{PARTS}{part_size}:{value}"


def part_size_of(checksum: str | None) -> int | None:
    """The part size a checksum of the parts form names; None for any other."""
    if checksum is None or not checksum.startswith(PARTS):
        return None
    return int(checksum[len(PARTS) :].split(":", 1)[0])


def _apply(matrix: tuple[int, ...], vector: int) -> int:
    out, i = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def _then(first: tuple[int, ...], second: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_apply(second, column) for column in first)


@functools.lru_cache(maxsize=64)
def _zeros(n: int) -> tuple[int, ...]:
    """The linear part of running the CRC32 register over ``n`` zero bytes, as 32 columns.

    ``zlib.crc32(data, start)`` is affine in ``start`` and its linear part depends only on
    ``len(data)``: so ``crc32(a + b) == L(crc32(a)) ^ crc32(b)`` with L this map for
    ``len(b)`` bytes. One byte's map is read off zlib itself; n bytes' by squaring."""
    zero = zlib.crc32(b"\0")
    one_byte = tuple(zlib.crc32(b"\0", 1 << i) ^ zero for i in range(32))
    result = tuple(1 << i for i in range(32))
    while n:
        if n & 1:
            result = _then(result, one_byte)
        one_byte = _then(one_byte, one_byte)
        n >>= 1
    return result


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32 of ``a + b`` from ``crc32(a)``, ``crc32(b)`` and ``len(b)``."""
    return _apply(_zeros(len2), crc1) ^ crc2


class Hasher:
    """Hashes content handed over in order: xxh3-128, or (``part_size``) each part's CRC32."""

    def __init__(self, part_size: int | None = None) -> None:
        self.part_size = part_size
        self._xxh = None if part_size else xxhash.xxh3_128()
        self.crcs: list[int] = []  # finished parts
        self._lengths: list[int] = []
        self._crc = 0
        self._filled = 0  # bytes of the current part

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._xxh is not None:
            self._xxh.update(data)
            return
        assert self.part_size is not None
        view, pos = memoryview(data), 0
        while pos < len(view):
            take = min(len(view) - pos, self.part_size - self._filled)
            self._crc = crc32(view[pos : pos + take], self._crc)
            self._filled += take
            pos += take
            if self._filled == self.part_size:
                self._end_part()

    def _end_part(self) -> None:
        self.crcs.append(self._crc)
        self._lengths.append(self._filled)
        self._crc = self._filled = 0

    def _parts(self) -> tuple[list[int], list[int]]:
        crcs, lengths = list(self.crcs), list(self._lengths)
        if self._filled or not crcs:  # the last, shorter part (or an empty file's one part)
            crcs.append(self._crc)
            lengths.append(self._filled)
        return crcs, lengths

    def digest(self) -> str:
        """The checksum of what was hashed, in the form hashed."""
        if self._xxh is not None:
            return self._xxh.hexdigest()
        assert self.part_size is not None
        crcs, _ = self._parts()
        return parts_checksum(self.part_size, crc32_b64(composite(crcs)))

    def matches(self, expected: str) -> bool | None:
        """Whether the content hashed has the checksum ``expected``; None if it was hashed
        in another form (or with another part size)."""
        if self._xxh is not None:
            return None if expected.startswith(PARTS) else self._xxh.hexdigest() == expected
        if part_size_of(expected) != self.part_size:
            return None
        value, _, count = expected.rsplit(":", 1)[1].partition("-")
        crcs, lengths = self._parts()
        if value == crc32_b64(composite(crcs)):
            return not count or int(count) == len(crcs)
        whole = crcs[0]
        for crc, length in zip(crcs[1:], lengths[1:], strict=True):
            whole = crc32_combine(whole, crc, length)
        return not count and value == crc32_b64(whole)

"""CRC32 as S3 uses it: of every body sent (``x-amz-checksum-crc32``, which the store checks)
and of a multipart object (COMPOSITE: the CRC32 of its parts' CRC32s).

Every CRC32 of content is computed by :func:`crc32`: the stores' bodies and parts here, and the
filesystem's content checksums (:mod:`ckptgw.fsops.contentsum`) built on it.
"""

from __future__ import annotations

import base64
import zlib

try:
    # zlib-ng's CRC32: the same polynomial and values as zlib's, several times faster
    # (carry-less multiply; measured: docs/benchmarks.md), and the drain checksums every byte
    # it sends. It releases the GIL as zlib's does.
    from zlib_ng.zlib_ng import crc32 as _crc32

    CRC32_IMPL = "zlib-ng"
except ImportError:  # a dependency, but its absence only costs CPU: the daemon says so
    _crc32 = zlib.crc32
    CRC32_IMPL = "zlib"


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """``zlib.crc32(data, value)``, computed by the fastest implementation installed. Every
    CRC32 of file content (a part, a body, a read-through's check) is computed here."""
    return _crc32(data, value)


def crc32_b64(crc: int) -> str:
    """The base64 of a big-endian CRC32, as ``x-amz-checksum-crc32`` carries it."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


def composite(crcs: list[int]) -> int:
    """S3's COMPOSITE CRC32 of an object whose parts have these CRC32s."""
    return zlib.crc32(b"".join(c.to_bytes(4, "big") for c in crcs))

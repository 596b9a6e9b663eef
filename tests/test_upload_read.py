"""How an upload reads a small file: on the event loop when the page cache has all of it,
on a worker thread when the disk would be touched; and what a part read short means (no
mount, no store)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash

from ckptgw.drain.uploads.upload import Changed, _read_hashed, _read_hashed_cached, _reason
from ckptgw.fsops.cache import fs_type
from ckptgw.store.interface import SHORT_FILE, StoreError


def _written(path: Path, data: bytes) -> int:
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def test_a_cached_file_is_read_and_hashed_without_a_thread(tmp_path: Path) -> None:
    data = os.urandom(512 << 10)
    fd = _written(tmp_path / "f", data)
    try:
        got = _read_hashed_cached(fd, len(data))
        assert got == (data, xxhash.xxh3_128_hexdigest(data))
        assert got == _read_hashed(fd, len(data))
    finally:
        os.close(fd)


def test_a_file_not_in_the_page_cache_is_left_to_the_thread(tmp_path: Path) -> None:
    if fs_type(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("a memory filesystem has every page cached")
    data = os.urandom(512 << 10)
    fd = _written(tmp_path / "f", data)
    try:
        os.fsync(fd)  # clean pages, which the kernel may then drop
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert _read_hashed_cached(fd, len(data)) is None
        assert _read_hashed(fd, len(data)) == (data, xxhash.xxh3_128_hexdigest(data))
    finally:
        os.close(fd)


def test_a_file_shorter_than_its_size_is_left_to_the_thread(tmp_path: Path) -> None:
    """The thread's read raises Changed for it; the cached read must not hash a short file."""
    fd = _written(tmp_path / "f", b"x" * 1000)
    try:
        assert _read_hashed_cached(fd, 2000) is None
    finally:
        os.close(fd)


def test_a_part_read_short_means_the_file_changed_whatever_else_failed() -> None:
    """A cache file shorter than a part was truncated meanwhile: the upload ends as Changed
    (the file goes again), not as the store error of a sibling part."""
    short = StoreError("the file ends at 3", temporary=False, code=SHORT_FILE)
    other = StoreError("PART 2: 503", temporary=True, code="SlowDown")
    assert isinstance(_reason(ExceptionGroup("parts", [other, short])), Changed)
    assert _reason(ExceptionGroup("parts", [other])) is other

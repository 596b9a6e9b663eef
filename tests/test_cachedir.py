"""The room on the cache disk, checked before a mount (``gateway.cachedir.space_problem``).

Expectations come from ``os.statvfs`` of the test's own directory, so the tests hold on any
disk; one test on a real 64 MiB tmpfs (root only) is the case from the field: the default
256 MiB reserve on a disk smaller than it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptgw.gateway.cachedir import space_problem
from ckptgw.gateway.config import parse_size

MiB = 1 << 20


def capacity_and_free(path: Path) -> tuple[int, int]:
    st = os.statvfs(path)
    return (st.f_blocks - (st.f_bfree - st.f_bavail)) * st.f_frsize, st.f_bavail * st.f_frsize


def suggested(message: str) -> int:
    """The size a message suggests (``set cache.x to "16MiB" or less``), in bytes."""
    return parse_size(message.split('"')[1], "suggestion")


def test_a_disk_with_room_has_no_problem(tmp_path: Path) -> None:
    capacity, free = capacity_and_free(tmp_path)
    reserve = min(free // 2, 256 * MiB)
    assert space_problem(tmp_path, reserve, None) is None
    assert space_problem(tmp_path, reserve, capacity - reserve) is None
    assert space_problem(tmp_path / "not" / "made" / "yet", reserve, None) is None


def test_a_reserve_as_large_as_the_disk_refuses_the_mount(tmp_path: Path) -> None:
    capacity, _ = capacity_and_free(tmp_path)
    for reserve in (capacity, capacity + 1, 2 * capacity):
        problem = space_problem(tmp_path, reserve, None)
        assert problem is not None and problem.fatal
        text = str(problem)
        assert "\n" not in text and str(tmp_path) in text
        assert "nothing could ever be written" in text and "cache.reserve" in text
        assert 0 < suggested(text) < capacity  # a reserve that would work


def test_less_free_than_the_reserve_warns(tmp_path: Path) -> None:
    capacity, free = capacity_and_free(tmp_path)
    if free >= capacity:
        pytest.skip("the disk is empty: the reserve cannot be above free and below its size")
    reserve = (free + capacity) // 2  # halfway: other tests' files may come and go meanwhile
    problem = space_problem(tmp_path, reserve, None)
    assert problem is not None and not problem.fatal
    assert "\n" not in str(problem) and "ENOSPC" in str(problem) and "free" in str(problem)
    # Clean files the cache holds can be evicted: counting them, there is room after all.
    assert space_problem(tmp_path, reserve, None, cached=capacity - free) is None


def test_a_size_limit_beyond_the_disk_warns(tmp_path: Path) -> None:
    capacity, free = capacity_and_free(tmp_path)
    reserve = min(free // 2, 256 * MiB)
    problem = space_problem(tmp_path, reserve, capacity)
    assert problem is not None and not problem.fatal
    text = str(problem)
    assert "\n" not in text and text.startswith("cache.size (") and "set cache.size" in text
    assert suggested(text) <= capacity - reserve


def test_the_problem_is_one_line_for_every_case(tmp_path: Path) -> None:
    capacity, free = capacity_and_free(tmp_path)
    for reserve, limit in ((capacity, None), (free + 1, None), (1, capacity)):
        problem = space_problem(tmp_path, reserve, limit)
        if problem is not None:
            assert problem.message == str(problem) and "\n" not in problem.message


@pytest.fixture
def tmpfs_64m(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(d)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_the_default_reserve_on_a_64_mib_disk(tmpfs_64m: Path) -> None:
    cache = tmpfs_64m / "cache"
    problem = space_problem(cache, 256 * MiB, None)  # the defaults
    assert problem is not None and problem.fatal
    assert "64.0 MiB" in str(problem) and '"16MiB"' in str(problem)
    assert space_problem(cache, 8 * MiB, None) is None
    too_big = space_problem(cache, 8 * MiB, 200 * MiB)
    assert too_big is not None and not too_big.fatal and '"56MiB"' in str(too_big)
    (tmpfs_64m / "filler").write_bytes(b"\0" * (60 * MiB))
    full = space_problem(cache, 8 * MiB, None)
    assert full is not None and not full.fatal and "ENOSPC" in str(full)

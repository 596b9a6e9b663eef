"""The journal's room on a full cache disk, without a mount (the mounted tests are in
tests/test_enospc.py).

Two promises: the journal commits into blocks its WAL already holds
(fsops.journal.connection.WAL_ROOM),
so a disk that writers filled to the last block does not stop it; and on the kernel's path the
disk reserve, a file, is released only while no file is open for writing on that path, and
no writer takes that path again before it is held again (Passthrough.check_room). The
kernel's part (backing ids) is faked here; the rules are the daemon's and are checked step
by step with the free space the daemon reads set by the test."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyfuse3
import pytest
import trio

from ckptgw.fsops.filesystem import Filesystem, FsOptions
from ckptgw.fsops.inodes import Inode
from ckptgw.fsops.journal import Journal
from ckptgw.fsops.journal.connection import WAL_ROOM
from ckptgw.fsops.journal.rows import ROOT_INODE
from tests.test_ops import ME, STORE

MiB = 1 << 20


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_the_wal_keeps_its_room_through_checkpoints_and_a_crash(tmp_path: Path) -> None:
    """The WAL is allocated to WAL_ROOM at open and stays so while SQLite reuses it after
    each checkpoint; after a crash the zeros past its last frame are no frames: every
    commit is found again, and nothing else."""
    wal = tmp_path / "journal.db-wal"
    j = Journal(tmp_path / "journal.db")
    assert allocated(wal) >= WAL_ROOM
    for i in range(3000):  # several checkpoints' worth (one every 1000 pages)
        j.set_meta(f"k{i % 500}", str(i))
    assert allocated(wal) >= WAL_ROOM and wal.stat().st_size >= WAL_ROOM
    j.barrier_sync()
    # The crash: the files as they are now, with no checkpoint at close (a clean close of the
    # connection would checkpoint the WAL into the database and delete it).
    crash = tmp_path / "crash"
    crash.mkdir()
    for name in ("journal.db", "journal.db-wal"):
        shutil.copyfile(tmp_path / name, crash / name)
    j.close()
    assert not wal.exists()  # a clean close leaves no WAL (and no room) behind
    j = Journal(crash / "journal.db")  # recovery reads the WAL's frames up to the first invalid
    try:
        assert j.get_meta("k499") == "2999" and j.get_meta("k0") == "2500"
        assert j.get_meta("k500") is None  # and nothing else: zeros are no frames
        assert allocated(crash / "journal.db-wal") >= WAL_ROOM
    finally:
        j.close()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem needs root")
    d = tmp_path / "tiny"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def fill(disk: Path) -> None:
    """Write a file until the disk has no block left."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = b"\0" * MiB
        while True:
            try:
                os.write(fd, chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                if len(chunk) == 4096:
                    break
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)
    st = os.statvfs(disk)
    assert st.f_bfree * st.f_frsize < 4096


def test_the_journal_commits_on_a_disk_without_a_free_block(tiny_disk: Path) -> None:
    j = Journal(tiny_disk / "journal.db")
    try:
        fill(tiny_disk)
        with pytest.raises(OSError):  # the disk is full for anyone else
            (tiny_disk / "other").write_bytes(b"x" * 4096)
        for i in range(2000):  # about 8 MiB of WAL frames
            j.set_meta(f"k{i % 100}", str(i))
        j.barrier_sync()
        assert j.get_meta("k99") == "1999"
    finally:
        os.unlink(tiny_disk / "filler")
        j.close()


# -- the reserve on the kernel's path ------------------------------------------------------------

RESERVE = 4 * MiB


class Disk:
    """What the daemon reads as the cache disk's free space, set by the test."""

    def __init__(self) -> None:
        self.free = 100 * MiB

    def free_bytes(self) -> int:
        return self.free


@pytest.fixture
def kernel_fs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Filesystem, Disk]]:
    """A filesystem in passthrough mode whose backing ids are faked, with free space set by
    the test."""
    ids = iter(range(1, 1 << 20))
    monkeypatch.setattr(pyfuse3, "passthrough_active", lambda: True, raising=False)
    monkeypatch.setattr(pyfuse3, "passthrough_open", lambda fd: next(ids), raising=False)
    monkeypatch.setattr(pyfuse3, "passthrough_close", lambda bid: None, raising=False)
    opts = FsOptions(store_url=STORE, reserve_bytes=RESERVE, write_wait=0.1)
    fs = Filesystem(tmp_path, opts)
    disk = Disk()
    monkeypatch.setattr(fs.cache, "free_bytes", disk.free_bytes)
    fs.path.wanted = True  # (whatever this machine offers: the kernel's answer is faked)
    fs.path.init()
    assert fs.path.active and fs.cache.held == RESERVE
    try:
        yield fs, disk
    finally:
        fs.close()


def reserve_file(fs: Filesystem) -> int:
    try:
        return allocated(fs.cache.root / "reserve")
    except FileNotFoundError:
        return 0


def test_the_reserve_is_released_only_once_no_writer_is_left_on_the_kernels_path(
    kernel_fs: tuple[Filesystem, Disk],
) -> None:
    fs, disk = kernel_fs
    files = fs.files

    def new(name: bytes) -> Inode:
        return fs.namespace.create_file(ROOT_INODE, name, 0o644, ME)

    async def main() -> None:
        a = new(b"a")
        fa, bid_a = await files.open(a, os.O_WRONLY)
        assert bid_a  # the kernel's path
        disk.free = RESERVE // 4  # a writer filled the disk (the reserve aside)
        files.observe(a)  # (what the watcher does every tick)
        fs.path.check_room()
        assert fs.path.low and fs.cache.held and reserve_file(fs) >= RESERVE
        # However long nothing is written: still held, as the writer is open.
        for _ in range(3):
            await trio.sleep(0.2)
            fs.path.check_room()
        assert fs.cache.held
        b = new(b"b")
        fb, bid_b = await files.open(b, os.O_WRONLY)
        assert bid_b == 0  # a new writer takes the daemon path
        fa2, bid_a2 = await files.open(a, os.O_WRONLY)  # a's inode: its backing id, reserve held
        assert bid_a2 == bid_a
        files.release(fa)
        assert fs.cache.held  # a second writer of a is still open
        files.release(fa2)
        assert not fs.cache.held and reserve_file(fs) == 0  # the last one: the journal's
        files.release(fb)
        # A reader of a takes the kernel's path; a writer of it would have to share its
        # backing id, with the reserve not held: refused, the disk is full.
        fr, bid_r = await files.open(a, os.O_RDONLY)
        assert bid_r
        with pytest.raises(OSError) as e:
            await files.open(a, os.O_WRONLY)
        assert e.value.errno == errno.ENOSPC and not fs.cache.held
        files.release(fr)
        c = new(b"c")
        fc, bid_c = await files.open(c, os.O_WRONLY)
        assert bid_c == 0  # still full: the daemon path
        files.release(fc)
        disk.free = 3 * RESERVE  # room again: the reserve is taken back first
        fd_, bid_d = await files.open(new(b"d"), os.O_WRONLY)
        assert bid_d and fs.cache.held == RESERVE and reserve_file(fs) >= RESERVE
        assert not fs.path.low
        files.release(fd_)

    trio.run(main)


def test_with_no_writer_on_the_kernels_path_a_full_disk_gives_the_reserve_at_once(
    kernel_fs: tuple[Filesystem, Disk],
) -> None:
    """With no writer on the kernel's path open, a full disk gives the reserve to the journal
    at once (nothing to wait for), and the next writers go through the daemon."""
    fs, disk = kernel_fs
    disk.free = RESERVE // 4
    fs.path.check_room()
    assert fs.path.low and not fs.cache.held and reserve_file(fs) == 0
    ino = fs.namespace.create_file(ROOT_INODE, b"x", 0o644, ME)
    assert not fs.path.kernel_writes(True, rdwr=False)
    fh, bid = trio.run(fs.files.open, ino, os.O_WRONLY)
    assert bid == 0
    fs.files.release(fh)

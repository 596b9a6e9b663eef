"""File contents on the cache disk: one cache file per inode, named by inode number.

Naming by inode (not by path) makes rename a journal-only operation. The module also owns the
two disk policies of the write path:

* the space reserve: writes fail with ENOSPC while the journal still has room to commit, so a
  full cache disk never corrupts or blocks the metadata of data already acknowledged;
* early write-back: every ``early_writeback`` bytes written to a file, the kernel is asked to
  start writing them to the disk (``sync_file_range(SYNC_FILE_RANGE_WRITE)``), so the final
  ``fsync`` of a checkpoint finds little left to do. Checkpoints are always fsynced, so this
  moves work off the training stall instead of adding any.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
from dataclasses import dataclass
from pathlib import Path

_SYNC_FILE_RANGE_WRITE = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_sync_file_range = _libc.sync_file_range
_sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_sync_file_range.restype = ctypes.c_int


def start_writeback(fd: int) -> None:
    """Start (not wait for) write-out of the file's dirty pages. Best effort."""
    _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


@dataclass(frozen=True)
class SpaceInfo:
    block_size: int
    total_blocks: int
    free_blocks: int  # after the reserve
    avail_blocks: int  # after the reserve, for unprivileged users
    files: int
    free_files: int


class CacheFiles:
    def __init__(self, root: Path, reserve_bytes: int, early_writeback: int) -> None:
        self.root = root
        self.data = root / "data"
        self.data.mkdir(mode=0o700, exist_ok=True)
        self.reserve_bytes = reserve_bytes
        self.early_writeback = early_writeback
        self._dirfd = os.open(self.data, os.O_RDONLY | os.O_DIRECTORY)

    def close(self) -> None:
        os.close(self._dirfd)

    def path(self, inode: int) -> Path:
        return self.data / f"{inode % 256:02x}" / str(inode)

    def _rel(self, inode: int) -> str:
        return f"{inode % 256:02x}/{inode}"

    def create(self, inode: int) -> None:
        """Create an empty cache file (its directory entry is synced at the first fsync)."""
        shard = f"{inode % 256:02x}"
        with contextlib.suppress(FileExistsError):
            os.mkdir(shard, 0o700, dir_fd=self._dirfd)
        fd = os.open(
            self._rel(inode),
            os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
            0o600,
            dir_fd=self._dirfd,
        )
        os.close(fd)

    def open(self, inode: int) -> int:
        return os.open(self._rel(inode), os.O_RDWR | os.O_CLOEXEC, dir_fd=self._dirfd)

    def exists(self, inode: int) -> bool:
        try:
            os.stat(self._rel(inode), dir_fd=self._dirfd)
        except FileNotFoundError:
            return False
        return True

    def size(self, inode: int) -> int:
        return os.stat(self._rel(inode), dir_fd=self._dirfd).st_size

    def remove(self, inode: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._rel(inode), dir_fd=self._dirfd)

    def truncate(self, inode: int, size: int) -> None:
        fd = self.open(inode)
        try:
            self.check_room(fd, max(0, size - os.fstat(fd).st_size))
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def sync_entry(self, inode: int) -> None:
        """Make the cache file's directory entry durable (needed once, after create)."""
        fd = os.open(f"{inode % 256:02x}", os.O_RDONLY | os.O_DIRECTORY, dir_fd=self._dirfd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def known_inodes(self) -> set[int]:
        """Inode numbers of every cache file present (used by recovery)."""
        found: set[int] = set()
        for shard in os.scandir(self.data):
            if shard.is_dir():
                for entry in os.scandir(shard.path):
                    if entry.name.isdigit():
                        found.add(int(entry.name))
        return found

    # -- space -----------------------------------------------------------------------------------

    def check_room(self, fd: int, nbytes: int) -> None:
        """Raise ENOSPC unless ``nbytes`` more still leave the reserve free."""
        st = os.fstatvfs(fd)
        if st.f_bavail * st.f_frsize - nbytes < self.reserve_bytes:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def space(self) -> SpaceInfo:
        st = os.fstatvfs(self._dirfd)
        reserve_blocks = -(-self.reserve_bytes // st.f_frsize)
        return SpaceInfo(
            block_size=st.f_frsize,
            total_blocks=st.f_blocks,
            free_blocks=max(0, st.f_bfree - reserve_blocks),
            avail_blocks=max(0, st.f_bavail - reserve_blocks),
            files=st.f_files,
            free_files=st.f_favail,
        )

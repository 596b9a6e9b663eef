"""File contents on the cache disk: one cache file per inode, named by inode number.

Naming by inode (not by path) makes rename a journal-only operation. The module also owns the
disk policies of the write path:

* the space reserve: writes fail with ENOSPC while the journal still has room to commit, so a
  full cache disk never corrupts or blocks the metadata of data already acknowledged;
* direct I/O (:class:`DirectWriter`): the page-aligned part of each write goes to the cache file
  with ``O_DIRECT`` from a pool of aligned buffers, several requests in flight on worker
  threads. The data is then on its way to the disk while training still writes, and it is not
  copied a second time into the page cache (the mount's own page cache already holds it), which
  costs the daemon a third of the CPU (docs/benchmarks.md, measurements behind design choices).
  Unaligned heads and tails go through the page cache; the kernel keeps both views coherent;
* early write-back, where direct I/O is not available (tmpfs): every ``early_writeback`` bytes
  the kernel is asked to start writing a file's pages (``sync_file_range``), so the final
  ``fsync`` of a checkpoint finds little left to do.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import trio

from ckptgw.fsops.signal import Signal

STATVFS_FOR = 0.001  # seconds a statvfs of the cache disk is reused
_SYNC_FILE_RANGE_WRITE = 2
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_sync_file_range = _libc.sync_file_range
_sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_sync_file_range.restype = ctypes.c_int


_syncfs = _libc.syncfs
_syncfs.argtypes = [ctypes.c_int]
_syncfs.restype = ctypes.c_int


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


ALIGN = 4096

# Filesystems on which fsync of a newly created file also makes its directory entry durable,
# so the cache file's entry needs no fsync of its own: ext4 (with a journal, the commit that
# holds the inode holds the entry too; without one, ext4_sync_parent writes the parent) and
# XFS (the log force covers the create's transaction). Elsewhere (btrfs, ext2's own driver,
# network filesystems, ...) the directory is fsynced once after the file's first fsync.
ENTRY_DURABLE_WITH_FILE = frozenset({"ext4", "xfs"})
# Nothing on these survives a reboot anyway: no directory fsync either.
NOT_PERSISTENT = frozenset({"tmpfs", "ramfs"})


def fs_type(path: Path) -> str | None:
    """The type of the filesystem ``path`` is on (from /proc/self/mountinfo, by device)."""
    dev = os.stat(path).st_dev
    want = f"{os.major(dev)}:{os.minor(dev)}"
    found = None
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[2] == want and " - " in line:
                found = line.split(" - ", 1)[1].split()[0]  # the last mount of it wins
    return found


@dataclass
class SyncStats:
    """The daemon's own fsyncs of the cache disk (each a device flush, at most)."""

    files: int = 0  # of cache files, for an fsync request
    entries: int = 0  # of a shard directory, for a new cache file's entry


class DirectWriter:
    """O_DIRECT writes of page-aligned runs, from a pool of page-aligned buffers."""

    def __init__(self, buffers: int = 16, buffer_size: int = 1 << 20, threads: int = 8) -> None:
        self.buffer_size = buffer_size
        self._free = [mmap.mmap(-1, buffer_size) for _ in range(buffers)]
        self._available = trio.Semaphore(buffers)
        self._limiter = trio.CapacityLimiter(threads)

    @contextlib.asynccontextmanager
    async def _buffer(self) -> AsyncIterator[mmap.mmap]:
        async with self._available:
            buf = self._free.pop()
            try:
                yield buf
            finally:
                self._free.append(buf)

    async def write(self, fd: int, dfd: int, data: bytes, off: int) -> int:
        """Write ``data`` at ``off``: aligned middle via ``dfd`` (O_DIRECT), the rest via ``fd``."""
        end = off + len(data)
        a0 = -(-off // ALIGN) * ALIGN
        a1 = end // ALIGN * ALIGN
        if a1 <= a0:
            return os.pwrite(fd, data, off)
        view = memoryview(data)
        if off < a0:
            os.pwrite(fd, view[: a0 - off], off)
        if a1 < end:
            os.pwrite(fd, view[a1 - off :], a1)
        pos = a0
        while pos < a1:
            n = min(self.buffer_size, a1 - pos)
            async with self._buffer() as buf:
                buf[:n] = view[pos - off : pos - off + n]
                await trio.to_thread.run_sync(
                    os.pwrite, dfd, memoryview(buf)[:n], pos, limiter=self._limiter
                )
            pos += n
        return len(data)


def direct_io_refusal(directory: Path) -> str | None:
    """Why the filesystem of ``directory`` refuses O_DIRECT writes (one aligned block to a temp
    file, removed), or None if it takes them."""
    probe = directory / f".direct-io-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
    except OSError as e:
        return e.strerror
    try:
        os.pwrite(fd, mmap.mmap(-1, ALIGN), 0)  # mmap: page-aligned memory
        return None
    except OSError as e:
        return e.strerror
    finally:
        os.close(fd)
        probe.unlink()


class CacheFiles:
    """The cache files, and the bytes they hold (``used``, the figure the size limit applies to;
    sizes, not allocated blocks, so a sparse file being fetched counts whole)."""

    def __init__(
        self,
        root: Path,
        reserve_bytes: int,
        early_writeback: int,
        direct_io: bool = True,
    ) -> None:
        self.root = root
        self.data = root / "data"
        self.data.mkdir(mode=0o700, exist_ok=True)
        self.reserve_bytes = reserve_bytes
        self.early_writeback = early_writeback
        self.used = 0
        self.held = 0  # bytes of the reserve held in a file (passthrough mode)
        self.holding = False  # the reserve file is there (a reserve of 0 holds 0 bytes)
        self.release_reserve()  # one left by an earlier mount is not counted as held
        self.room = Signal()  # fired when bytes are freed (and by FileStates when a file is clean)
        self._dirfd = os.open(self.data, os.O_RDONLY | os.O_DIRECTORY)
        self.direct: DirectWriter | None = None
        if direct_io and direct_io_refusal(self.data) is None:
            self.direct = DirectWriter()
        self.fs_type = fs_type(self.data)
        self.entries_need_sync = self.fs_type not in ENTRY_DURABLE_WITH_FILE | NOT_PERSISTENT
        self.syncs = SyncStats()
        self._make_shards()
        self._vfs: os.statvfs_result | None = None
        self._vfs_at = 0.0

    def close(self) -> None:
        """The reserve file goes with the mount: only a mount's kernel writers need it, and the
        next mount takes it again (a cache dir is not left holding the reserve's blocks)."""
        self.release_reserve()
        os.close(self._dirfd)

    def sync_all(self) -> None:
        """Make every cache file and directory entry durable (syncfs of the cache disk).

        Used where per-file tracking of unsynced directory entries does not reach: at a clean
        shutdown, and after recovering from a crash."""
        if _syncfs(self._dirfd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    @staticmethod
    def _shard(inode: int) -> str:
        return f"{inode % 256:02x}"

    def _make_shards(self) -> None:
        """The 256 shard directories, made where missing (a fresh cache) at mount, and their
        entries made durable: made at the first create of each instead, they cost a sharded
        save 0.5 ms for each of its first 256 files."""
        have = set(os.listdir(self._dirfd))
        missing = [s for s in map(self._shard, range(256)) if s not in have]
        for shard in missing:
            with contextlib.suppress(FileExistsError):
                os.mkdir(shard, 0o700, dir_fd=self._dirfd)
        if missing:
            os.fsync(self._dirfd)

    def _rel(self, inode: int) -> str:
        return f"{self._shard(inode)}/{inode}"

    def create(self, inode: int) -> None:
        """Create an empty cache file (its directory entry is synced at the first fsync)."""
        os.close(self.create_sized(inode, 0))

    def create_sized(self, inode: int, size: int) -> int:
        """Create a cache file of ``size`` bytes, all a hole (one being fetched), and return
        a descriptor of it. Blocking: under write load, creating an inode waits for the disk
        (1-2 ms measured), so a caller on the event loop runs this in a thread."""
        self.disk_changed()  # (O_TRUNC frees the blocks of a stale file of that number)
        fd = os.open(
            self._rel(inode),
            os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
            0o600,
            dir_fd=self._dirfd,
        )
        try:
            if size:
                os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open(self, inode: int) -> int:
        return os.open(self._rel(inode), os.O_RDWR | os.O_CLOEXEC, dir_fd=self._dirfd)

    def open_read(self, inode: int) -> int:
        """A read-only descriptor (an upload's: it may be handed to a part worker process)."""
        return os.open(self._rel(inode), os.O_RDONLY | os.O_CLOEXEC, dir_fd=self._dirfd)

    def open_direct(self, inode: int) -> int:
        """A second, O_DIRECT descriptor for :class:`DirectWriter`; -1 without direct I/O."""
        if self.direct is None:
            return -1
        flags = os.O_WRONLY | os.O_CLOEXEC | os.O_DIRECT
        return os.open(self._rel(inode), flags, dir_fd=self._dirfd)

    def exists(self, inode: int) -> bool:
        try:
            os.stat(self._rel(inode), dir_fd=self._dirfd)
        except FileNotFoundError:
            return False
        return True

    def size(self, inode: int) -> int:
        return os.stat(self._rel(inode), dir_fd=self._dirfd).st_size

    def remove(self, inode: int) -> None:
        try:
            size = os.stat(self._rel(inode), dir_fd=self._dirfd).st_size
            os.unlink(self._rel(inode), dir_fd=self._dirfd)
        except FileNotFoundError:
            return
        self.uncharge(size)

    def uncharge(self, nbytes: int) -> None:
        self.disk_changed()  # a remove or a truncate freed blocks
        if nbytes > 0:
            self.used = max(0, self.used - nbytes)
            self.room.fire()

    def sync_file(self, fd: int, inode: int, datasync: bool, entry: bool) -> None:
        """Make a cache file's content durable (blocking: on a worker thread), and with
        ``entry`` its directory entry too (asked only where ``entries_need_sync``)."""
        (os.fdatasync if datasync else os.fsync)(fd)
        if entry:
            dfd = os.open(self._shard(inode), os.O_RDONLY | os.O_DIRECTORY, dir_fd=self._dirfd)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def known_inodes(self) -> set[int]:
        """Inode numbers of every cache file present (used by recovery)."""
        return set(self.each_inode())

    def each_inode(self) -> Iterator[int]:
        """The inode number of each cache file present, as the shards are listed."""
        for shard in os.scandir(self.data):
            if shard.is_dir():
                with os.scandir(shard.path) as entries:
                    for entry in entries:
                        if entry.name.isdigit():
                            yield int(entry.name)

    # -- space -----------------------------------------------------------------------------------

    # With passthrough the kernel writes cache files without asking: the reserve is then held
    # as a file of that size (``held``), which fsops.passthrough gives back to the journal
    # when the disk fills and no writer on the kernel's path is open, and takes again once
    # there is room, before such a writer opens.

    @property
    def _reserve_path(self) -> Path:
        return self.root / "reserve"

    def hold_reserve(self) -> bool:
        """Allocate the reserve as a file; False if the disk has no room for it now."""
        self.disk_changed()
        fd = os.open(self._reserve_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(1, self.reserve_bytes))  # blocks, not a sparse size
        except OSError:
            os.ftruncate(fd, 0)
            return False
        finally:
            os.close(fd)
        self.held = self.reserve_bytes
        self.holding = True
        return True

    def release_reserve(self) -> None:
        self.disk_changed()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._reserve_path)
        self.held = 0
        self.holding = False

    def _statvfs(self) -> os.statvfs_result:
        """The cache disk's statvfs, taken again once :data:`STATVFS_FOR` has passed or the
        daemon itself changed what the disk holds (:meth:`disk_changed`): a create asks for
        it five times, and the kernel's writes between them are far below the reserve."""
        now = time.monotonic()
        if self._vfs is None or now - self._vfs_at > STATVFS_FOR:
            self._vfs, self._vfs_at = os.fstatvfs(self._dirfd), now
        return self._vfs

    def disk_changed(self) -> None:
        self._vfs = None

    def free_bytes(self) -> int:
        """Free bytes on the cache disk, as statvfs says."""
        st = self._statvfs()
        return st.f_bavail * st.f_frsize

    def disk_room(self) -> int:
        """Bytes that may still be written to the cache disk, keeping the reserve free."""
        return self.free_bytes() - (self.reserve_bytes - self.held)

    def space(self) -> SpaceInfo:
        st = self._statvfs()
        reserve_blocks = -(-(self.reserve_bytes - self.held) // st.f_frsize)
        return SpaceInfo(
            block_size=st.f_frsize,
            total_blocks=st.f_blocks,
            free_blocks=max(0, st.f_bfree - reserve_blocks),
            avail_blocks=max(0, st.f_bavail - reserve_blocks),
            files=st.f_files,
            free_files=st.f_favail,
        )

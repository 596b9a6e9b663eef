"""Kernel FUSE passthrough: the kernel reads and writes cache files itself.

With passthrough (Linux >= 6.9, libfuse >= 3.17, pyfuse3 built with
``deploy/passthrough/pyfuse3-passthrough.patch``, CAP_SYS_ADMIN), an open may name a *backing
file*, here the inode's cache file: the kernel then serves that open's reads, writes and
mmaps from it, and the daemon sees no READ or WRITE for it. Otherwise every byte goes through
the daemon (:mod:`fsops.files`, O_DIRECT into the cache file): the *daemon* data path.

The mode is chosen at mount (:func:`unavailable`, then what the kernel agrees to at INIT)
and kept for the mount. In passthrough mode the kernel's write-back cache is off (the kernel
allows one or the other); files opened on the daemon path (a file still being fetched) are
then written through, request by request.

Each open is decided per inode (:meth:`Passthrough.backing`), because the kernel refuses
(EIO) a passthrough open of an inode that has page-cached opens, and the reverse:

* an inode with passthrough opens: the new open shares their backing id;
* an inode with daemon-path opens: the new open takes the daemon path too;
* otherwise an inode whose whole content is in the cache (not ``remote``) goes passthrough;
  a remote one (fetched on demand) takes the daemon path.

The disk reserve (the room the journal always has) cannot be checked write by write when the
kernel writes: it is held as a file instead, which no writer can take, and given back to the
journal when the disk fills, but only once no file is open for writing on the kernel's path
(:meth:`Passthrough.check_room`): freed while one was, it would be that writer's too.

The daemon still sees open, fsync, release, getattr and setattr, which is where it learns
what the kernel wrote: :meth:`fsops.files.OpenFiles.observe` reads the cache file's size and
mtime. It sees no FLUSH at a passthrough open's ``close()`` (:meth:`Passthrough.flush_skipped`).
"""

from __future__ import annotations

import errno
import logging
import platform
from dataclasses import dataclass

import pyfuse3
import trio

from ckptgw.fsops.cache import CacheFiles
from ckptgw.fsops.inodes import Inode, fs_error
from ckptgw.fsops.journal.rows import State

log = logging.getLogger(__name__)

PASSTHROUGH = "passthrough"
DAEMON = "daemon"
_MIN_KERNEL = (6, 9)
_CAP_SYS_ADMIN = 21
# FileInfo.noflush came to the patch later: a venv built before has passthrough without it.
NOFLUSH = hasattr(pyfuse3.FileInfo(), "noflush")


def _kernel() -> tuple[int, int]:
    parts = platform.release().split(".")
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def _has_cap_sys_admin() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_ADMIN & 1)
    except OSError:
        pass
    return False


def supported() -> bool:
    """Whether this pyfuse3 was built with passthrough (``make`` builds it so)."""
    return hasattr(pyfuse3, "passthrough_open")


def unavailable(wanted: bool) -> str | None:
    """Why this mount cannot use passthrough, or None if it may ask the kernel for it."""
    if not wanted:
        return "mount.passthrough = false"
    if not supported():
        return "pyfuse3 lacks passthrough (libfuse < 3.17; `make` builds both into the venv)"
    if _kernel() < _MIN_KERNEL:
        return f"kernel {platform.release()} is older than 6.9"
    if not _has_cap_sys_admin():
        return "the daemon lacks CAP_SYS_ADMIN (needed to register backing files)"
    return None


@dataclass
class PathStats:
    passthrough_opens: int = 0  # opens served by the kernel from the cache file
    daemon_opens: int = 0  # opens whose bytes went through the daemon


class Passthrough:
    """The mount's data path and the backing ids of open inodes."""

    def __init__(self, wanted: bool, cache: CacheFiles, *, writers: bool = True) -> None:
        self.reason = unavailable(wanted)
        self.wanted = self.reason is None  # asked of the kernel at INIT
        self.negotiated = False  # the kernel agreed at INIT (its write-back cache is off)
        self.active = False  # passthrough in use: negotiated, and backing files register
        # Whether files opened for writing may take the kernel's path: not with a
        # ``cache.size``, which the daemon enforces write by write.
        self.writers = writers
        self.cache = cache
        self.low = False  # the cache disk filled up: new writers take the daemon path
        self.writing = 0  # opens for writing on the kernel's path (the reserve stays held)
        self._registered = False  # a backing file registered at least once
        self.stats = PathStats()
        self.initialized = trio.Event()  # set at INIT, once the mode is known

    @property
    def mode(self) -> str:
        return PASSTHROUGH if self.active else DAEMON

    def init(self) -> None:
        """Called at INIT: record what the kernel agreed to, and say it."""
        self.initialized.set()
        if self.wanted:
            self.negotiated = self.active = bool(pyfuse3.passthrough_active())
            if not self.active:
                self.reason = "the kernel did not offer FUSE passthrough at mount"
        if self.active:
            self.low = not self.cache.hold_reserve()
            log.info("data path: passthrough (the kernel reads and writes cache files)")
            if not self.writers:
                log.info(
                    "cache.size is set: files opened for writing go through the daemon, "
                    "which keeps the size write by write"
                )
        else:
            log.info("data path: daemon (%s)", self.reason)

    def check_room(self) -> None:
        """The disk reserve, where the kernel writes (called whenever the daemon learns what
        it wrote, at the release of a writer on the kernel's path, and every tick of
        :meth:`fsops.files.OpenFiles.watch`). The journal must always be able to commit: when
        the cache disk is nearly full, new writers take the daemon path, which keeps the
        reserve write by write, and the reserve file is given back to the journal, but only
        while no file is open for writing on the kernel's path (:attr:`writing`): blocks
        freed while one is open are that writer's as much as the journal's, and no time
        without writes proves that it will not write again. So the reserve is released
        only after the RELEASE of the last such writer (after its last descriptor is gone,
        so not at a FLUSH, which a ``dup`` outlives), and a writer may take the kernel's path
        again only once the reserve is held again (:meth:`kernel_writes`). Meanwhile the
        journal commits into the room it keeps in its own WAL
        (:data:`fsops.journal.connection.WAL_ROOM`).
        Once three reserves are free again, the reserve is taken back."""
        if not self.active:
            return
        free = self.cache.free_bytes()
        if self.cache.holding and free < self.cache.reserve_bytes // 2:
            if not self.low:
                self.low = True
                log.warning(
                    "cache disk full: new writers go through the daemon until room is freed"
                )
            if not self.writing:
                self.cache.release_reserve()
                log.warning("cache disk full: its reserve goes to the journal")
        elif free >= 3 * self.cache.reserve_bytes and (self.low or not self.cache.holding):
            self.low = not self.cache.holding and not self.cache.hold_reserve()
            if not self.low:
                log.info("cache disk has room again: writers use passthrough")

    def flush_skipped(self, writable: bool) -> bool:
        """Whether a passthrough open's ``close()``, a reader's or a writer's alike, may go
        without FLUSH: the kernel then sends only RELEASE, after the last descriptor of the
        open is closed (before that ``close()`` returns, unless the kernel's queue of
        background requests is full), one round trip fewer per file (0.1-0.2 ms on 2
        cores). What FLUSH would do, RELEASE does: the size and mtime the kernel wrote, the
        attributes journaled, and the reserve given back if the disk is full
        (:meth:`check_room`, which a FLUSH could not do: a ``dup`` of the descriptor may
        still write). A failure to journal them then reaches no ``close()``; ``fsync``
        still reports it."""
        return NOFLUSH

    def kernel_writes(self, writable: bool, rdwr: bool) -> bool:
        """Whether a new open (of an inode without opens on either path) may take the
        kernel's path. A writer only while the reserve is held (the disk has room): a writer
        on the kernel's path can use every free block, so none may be open while the reserve
        is the journal's. Not for ``O_RDWR``: a shared writable mmap of a passthrough open
        writes the cache file even after close, which the daemon would never learn."""
        return not writable or (self.writers and not self.low and self.cache.holding and not rdwr)

    def admits_writer(self, ino: Inode) -> None:
        """Refuse (``ENOSPC``) a writer of an inode that has a backing id while the reserve is
        not held: the kernel allows one backing file per inode and no open of it on the
        daemon path, so the writer would share it and write on the kernel's path, where it
        could take the journal's room."""
        if ino.backing_id and not self.cache.holding:
            raise fs_error(errno.ENOSPC)

    def backing(self, ino: Inode, writable: bool, rdwr: bool = False) -> int:
        """The backing id for a new open of ``ino`` (its cache file open in ``ino.fd``), or 0
        for the daemon path. Counted in the inode's open counts; undone by :meth:`closed`."""
        bid = 0
        if writable:
            self.check_room()  # (the reserve taken back, if the disk has room again)
        if ino.backing_id:
            if writable:
                self.admits_writer(ino)
            bid = ino.backing_id
        elif (
            self.active
            and ino.daemon_opens == 0
            and ino.state is not State.REMOTE
            and self.kernel_writes(writable, rdwr)
        ):
            bid = self._register(ino)
        if bid:
            ino.backing_id = bid
            ino.passthrough_opens += 1
            self.writing += writable
            self.stats.passthrough_opens += 1
        else:
            ino.daemon_opens += 1
            self.stats.daemon_opens += 1
        return bid

    def _register(self, ino: Inode) -> int:
        try:
            bid = int(pyfuse3.passthrough_open(ino.fd))
        except OSError as e:
            if self._registered:  # it worked before: this open alone takes the daemon path
                log.warning("no backing file for inode %d (%s): daemon path", ino.id, e.strerror)
                return 0
            # e.g. a cache dir on a stacked file system (overlayfs over overlayfs): this
            # mount goes on without passthrough rather than failing opens.
            self.active = False
            self.reason = f"the kernel refused a backing file: {e.strerror}"
            self.cache.release_reserve()  # the daemon path keeps the reserve by itself
            log.error("passthrough off for this mount: %s", self.reason)
            return 0
        self._registered = True
        return bid

    def closed(self, ino: Inode, bid: int, writable: bool) -> None:
        """An open of ``ino`` that :meth:`backing` decided was released: the kernel can no
        longer write through it (RELEASE comes after its last descriptor, and the last
        request on it, are gone)."""
        if not bid:
            ino.daemon_opens -= 1
            return
        ino.passthrough_opens -= 1
        self.writing -= writable
        if ino.passthrough_opens == 0 and ino.backing_id:
            ino.backing_seen = (-1, -1)
            try:
                pyfuse3.passthrough_close(ino.backing_id)
            except OSError as e:
                log.warning("releasing backing id %d: %s", ino.backing_id, e.strerror)
            ino.backing_id = 0

"""The pyfuse3 ``Operations``: thin handlers over Namespace and OpenFiles.

Errors are translated in exactly one place, :func:`_translate`, applied to every handler by
:func:`_fuse_boundary`: an ``OSError`` becomes ``FUSEError(errno)``, a full journal becomes
ENOSPC, anything else is logged with its traceback and becomes EIO. A handler that let any
other exception escape would end ``pyfuse3.main()`` and with it the mount.
"""

from __future__ import annotations

import errno
import functools
import inspect
import logging
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pyfuse3

from ckptgw.fsops.files import OpenFiles
from ckptgw.fsops.inodes import Inode
from ckptgw.fsops.journal.rows import InodeRow, State
from ckptgw.fsops.namespace import AttrChange, Namespace
from ckptgw.fsops.remote import Remote
from ckptgw.fsops.requeststats import RequestStats
from ckptgw.fsops.space import CacheSpace

log = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Awaitable[Any]])
_C = TypeVar("_C", bound=type)


def _translate(fn: _F) -> _F:
    op = fn.__name__

    @functools.wraps(fn)
    async def wrapper(self: Operations, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        self.stats.in_flight += 1
        try:
            return await fn(self, *args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except OSError as e:
            raise pyfuse3.FUSEError(e.errno or errno.EIO) from None
        except sqlite3.OperationalError as e:
            if "full" in str(e):
                raise pyfuse3.FUSEError(errno.ENOSPC) from None
            log.exception("journal error in %s", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except Exception:
            log.exception("unexpected error in %s", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            self.stats.in_flight -= 1
            self.stats.add(op, time.perf_counter() - started)

    return wrapper  # type: ignore[return-value]


def _fuse_boundary(cls: _C) -> _C:
    """Wrap every request handler the class defines with :func:`_translate`."""
    for name, fn in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(fn):
            setattr(cls, name, _translate(fn))
    return cls


@_fuse_boundary
class Operations(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_acl = False

    def __init__(
        self,
        namespace: Namespace,
        files: OpenFiles,
        space: CacheSpace,
        remote: Remote,
        *,
        writeback_cache: bool = True,
        attr_timeout: float = 1.0,
        blksize: int = 1 << 20,
        stats: RequestStats | None = None,
    ) -> None:
        super().__init__()
        self.stats = stats if stats is not None else RequestStats()
        self.ns = namespace
        self.files = files
        self.space = space
        self.table = namespace.table
        self.remote = remote
        self.enable_writeback_cache = writeback_cache
        # Asked of the kernel at INIT; when it agrees, the write-back cache is not.
        self.enable_passthrough = files.path.wanted
        self.attr_timeout = attr_timeout
        self.blksize = blksize

    def init(self) -> None:
        self.files.path.init()
        self.stats.watch_queue()

    def attrs(self, ino: InodeRow) -> pyfuse3.EntryAttributes:
        if isinstance(ino, Inode):
            self.files.observe(ino)  # what the kernel wrote, with passthrough
        a = pyfuse3.EntryAttributes()
        a.st_ino = ino.id
        a.generation = ino.epoch  # with st_ino, what a file handle names (fsops.journal)
        # A remote entry not yet described (its mode, owner and mtime still to be read from
        # the store) must not be kept by the kernel: its next use looks it up again.
        timeout = self.attr_timeout if self.remote.known(ino) else 0.0
        a.entry_timeout = a.attr_timeout = timeout
        a.st_mode = ino.mode
        a.st_nlink = self.ns.nlink(ino)
        a.st_uid = ino.uid
        a.st_gid = ino.gid
        a.st_rdev = ino.rdev
        a.st_size = ino.size
        a.st_blksize = self.blksize
        a.st_blocks = (ino.size + 511) // 512 if ino.is_reg else 0
        a.st_atime_ns = ino.atime_ns
        a.st_mtime_ns = ino.mtime_ns
        a.st_ctime_ns = ino.ctime_ns
        return a

    # -- names -----------------------------------------------------------------------------------

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        if name not in (b".", b".."):
            await self.remote.refresh(self.table.get(parent_inode))
        try:
            ino = self.ns.lookup(parent_inode, name)  # takes the kernel's reference
        except OSError as e:
            if e.errno != errno.ENOENT or name in (b".", b".."):
                raise
            return self._absent(parent_inode)
        if ino.state is State.REMOTE and name not in (b".", b".."):
            try:
                await self.remote.describe(ino)
            except BaseException:
                ino.lookups -= 1  # no reply reaches the kernel
                raise
        return self.attrs(ino)

    def _absent(self, parent_inode: int) -> pyfuse3.EntryAttributes:
        """A negative entry: the kernel keeps "no such name" for as long as that stays true
        here (a create through the mount replaces it; a name from the store cannot show up
        before the directory's next listing), and asks nothing until then."""
        timeout = min(self.attr_timeout, self.remote.absent_for(self.table.get(parent_inode)))
        if timeout <= 0:
            raise pyfuse3.FUSEError(errno.ENOENT)
        a = pyfuse3.EntryAttributes()
        a.st_ino = 0
        a.entry_timeout = timeout
        return a

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, nlookup in inode_list:
            self.table.forget(inode, nlookup)

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        return self.attrs(self.table.get(inode))

    async def setattr(
        self,
        inode: int,
        attr: pyfuse3.EntryAttributes,
        fields: pyfuse3.SetattrFields,
        fh: int | None,
        ctx: pyfuse3.RequestContext,
    ) -> pyfuse3.EntryAttributes:
        change = AttrChange(
            mode=attr.st_mode if fields.update_mode else None,
            uid=attr.st_uid if fields.update_uid else None,
            gid=attr.st_gid if fields.update_gid else None,
            size=attr.st_size if fields.update_size else None,
            atime_ns=attr.st_atime_ns if fields.update_atime else None,
            mtime_ns=attr.st_mtime_ns if fields.update_mtime else None,
            ctime_ns=attr.st_ctime_ns if fields.update_ctime else None,
        )
        ino = self.table.get(inode)
        if change.size is not None and ino.state is State.REMOTE:
            await self.remote.ensure_whole(ino)  # keep what the new size keeps
        self.files.observe(ino)  # the kernel's writes first, then this change over them
        ino = await self.ns.setattr(inode, change)
        self.files.observe(ino, adopt=False)
        return self.attrs(ino)

    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        return self.ns.readlink(inode)

    async def mknod(
        self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        return self.attrs(self.ns.mknod(parent_inode, name, mode, rdev, ctx))

    async def mkdir(
        self, parent_inode: int, name: bytes, mode: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        return self.attrs(self.ns.mkdir(parent_inode, name, mode, ctx))

    async def symlink(
        self, parent_inode: int, name: bytes, target: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        return self.attrs(self.ns.symlink(parent_inode, name, target, ctx))

    async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self.ns.unlink(parent_inode, name)

    async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        self.ns.rmdir(parent_inode, name)

    async def rename(
        self,
        parent_inode_old: int,
        name_old: bytes,
        parent_inode_new: int,
        name_new: bytes,
        flags: int,
        ctx: pyfuse3.RequestContext,
    ) -> None:
        self.ns.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)

    async def link(
        self, inode: int, new_parent_inode: int, new_name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        # One inode, one name: an object store has no hard links (see ARCHITECTURE.md).
        raise pyfuse3.FUSEError(errno.EPERM)

    # -- files -----------------------------------------------------------------------------------

    async def create(
        self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        rdwr = (flags & os.O_ACCMODE) == os.O_RDWR
        if self.files.path.active and self.files.path.kernel_writes(True, rdwr):
            await self.space.admit()  # before the name exists (a writer on the kernel's path)
        ino = self.ns.create_file(parent_inode, name, mode, ctx)
        info = self._file_info(*await self.files.open(ino, flags), flags)
        if (flags & os.O_ACCMODE) == os.O_RDONLY:  # created, never written: no writer's release
            self.files.states.quiet(ino)  # will report it (an NFSv4 OPEN with read access)
        return info, self.attrs(ino)

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        ino = self.table.get(inode)
        remote = ino.state is State.REMOTE
        if remote:
            await self.remote.prepare_open(ino, flags)
        return self._file_info(*await self.files.open(ino, flags), flags, keep_cache=not remote)

    def _file_info(
        self, fh: int, backing_id: int, flags: int, *, keep_cache: bool = True
    ) -> pyfuse3.FileInfo:
        if not backing_id:
            # An inode's content only changes through this mount (a rewrite from elsewhere
            # gets a new inode): the kernel may keep its pages. Not those of a file that was
            # remote at open: they can only be from a fetch that did not complete or failed
            # its checksum (a read returns its bytes before the file is verified whole).
            return pyfuse3.FileInfo(fh=fh, keep_cache=keep_cache)
        # The kernel reads and writes the cache file (fsops.passthrough).
        info = pyfuse3.FileInfo(fh=fh, keep_cache=False, backing_id=backing_id)
        if self.files.path.flush_skipped((flags & os.O_ACCMODE) != os.O_RDONLY):
            info.noflush = True
        return info

    async def read(self, fh: int, off: int, size: int) -> bytes:
        ino = self.files.handle(fh).inode
        if ino.state is State.REMOTE:
            await self.remote.ensure(ino, off, size)
        return self.files.read(fh, off, size)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return await self.files.write(fh, off, buf)

    async def flush(self, fh: int) -> None:
        self.files.flush(fh)

    async def release(self, fh: int) -> None:
        self.files.release(fh)

    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.files.fsync(fh, datasync, alone=self.stats.alone())

    # -- directories -----------------------------------------------------------------------------

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        d = self.table.get(inode)
        if not d.is_dir:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        await self.remote.refresh(d, describe=True)
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        after = start_id
        while batch := self.table.children(fh, after, 512):
            for row in batch:
                assert row.name is not None
                if not pyfuse3.readdir_reply(token, row.name, self.attrs(row), row.id):
                    return
                self.table.adopt(row).lookups += 1  # readdirplus takes a lookup reference
                after = row.id

    async def releasedir(self, fh: int) -> None:
        pass

    async def fsyncdir(self, fh: int, datasync: bool) -> None:
        await self.files.barrier(None, 0, alone=self.stats.alone())

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        space = self.table.cache.space()
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = space.block_size
        s.f_blocks = space.total_blocks
        s.f_bfree = space.free_blocks
        s.f_bavail = space.avail_blocks
        if self.space.limit is not None:  # the configured size is the filesystem's size
            free = self.space.free_bytes() // space.block_size
            s.f_blocks = min(s.f_blocks, self.space.limit // space.block_size)
            s.f_bfree, s.f_bavail = min(s.f_bfree, free), min(s.f_bavail, free)
        s.f_files = space.files
        s.f_ffree = s.f_favail = space.free_files
        s.f_namemax = 255
        return s

    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        self.table.get(inode)
        return True  # the kernel checks permissions itself (default_permissions)

    # -- extended attributes -----------------------------------------------------------------------

    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        return self.ns.getxattr(inode, name)

    async def setxattr(
        self, inode: int, name: bytes, value: bytes, ctx: pyfuse3.RequestContext
    ) -> None:
        await self.ns.setxattr(inode, name, value)

    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> Sequence[bytes]:
        return self.ns.listxattr(inode)

    async def removexattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
        await self.ns.removexattr(inode, name)

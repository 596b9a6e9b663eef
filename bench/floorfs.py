"""The floor: a FUSE daemon that does nothing but pass a directory through.

It is built as ckptgw's own mount is (pyfuse3 and trio, ``default_permissions``, kernel
passthrough for the data where this pyfuse3 has it), with none of ckptgw's work: no
journal, no cache accounting, no drain; it fsyncs on the event loop's own thread (ckptgw
does so for small files when nothing else waits), and a passthrough open's close sends no
FLUSH (as ckptgw's, where the pyfuse3 has ``FileInfo.noflush``): the least a pyfuse3 daemon
can do.
What a sharded save costs through it is what pyfuse3 and trio cost on this machine, request
by request; the ``floor`` section of :mod:`bench.suite` puts it beside the disk, libfuse's
own C example (``passthrough_hp``) and ckptgw. It keeps its inodes in memory, has no hard
links or xattrs, and is for the benchmark only.

    python -m bench.floorfs [--no-passthrough] SOURCE MOUNTPOINT     (runs until unmounted)
"""

from __future__ import annotations

import argparse
import errno
import functools
import inspect
import os
from typing import Any, TypeVar

import pyfuse3
import trio

from ckptgw.fsops.passthrough import NOFLUSH

_C = TypeVar("_C", bound=type)


def _error(e: OSError) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(e.errno or errno.EIO)


def _errors_answered(cls: _C) -> _C:
    """Every handler answers an OSError with its errno (pyfuse3 ends the mount on any other
    exception than FUSEError)."""
    for name, fn in list(vars(cls).items()):
        if inspect.iscoroutinefunction(fn):

            async def wrapper(*args: Any, _fn: Any = fn) -> Any:
                try:
                    return await _fn(*args)
                except OSError as e:
                    raise _error(e) from None

            setattr(cls, name, functools.wraps(fn)(wrapper))
    return cls


@_errors_answered
class Floor(pyfuse3.Operations):
    def __init__(self, source: str, passthrough: bool) -> None:
        super().__init__()
        self.enable_passthrough = passthrough
        self.paths: dict[int, str] = {pyfuse3.ROOT_INODE: source}
        self.inodes: dict[str, int] = {source: pyfuse3.ROOT_INODE}
        self.backing: dict[int, int] = {}  # fh (the file's descriptor) -> backing id
        self._next = pyfuse3.ROOT_INODE + 1

    def _inode(self, path: str) -> int:
        ino = self.inodes.get(path)
        if ino is None:
            ino, self._next = self._next, self._next + 1
            self.inodes[path], self.paths[ino] = ino, path
        return ino

    def _path(self, parent: int, name: bytes) -> str:
        return os.path.join(self.paths[parent], os.fsdecode(name))

    def _attrs(self, ino: int, st: os.stat_result) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size", "st_blocks"):
            setattr(a, k, getattr(st, k))
        a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
        a.st_ino, a.st_blksize = ino, 4096
        a.entry_timeout = a.attr_timeout = 60.0
        return a

    def _stat(self, ino: int, path: str) -> pyfuse3.EntryAttributes:
        try:
            return self._attrs(ino, os.lstat(path))
        except OSError as e:
            raise _error(e) from None

    async def lookup(self, parent: int, name: bytes, ctx: Any = None) -> pyfuse3.EntryAttributes:
        path = self._path(parent, name)
        try:
            st = os.lstat(path)
        except OSError as e:
            raise _error(e) from None
        return self._attrs(self._inode(path), st)

    async def getattr(self, ino: int, ctx: Any = None) -> pyfuse3.EntryAttributes:
        return self._stat(ino, self.paths[ino])

    async def setattr(
        self, ino: int, attr: Any, fields: Any, fh: int | None, ctx: Any
    ) -> pyfuse3.EntryAttributes:
        if fields.update_size:
            os.truncate(self.paths[ino], attr.st_size)
        return self._stat(ino, self.paths[ino])

    async def getxattr(self, ino: int, name: bytes, ctx: Any) -> bytes:
        raise pyfuse3.FUSEError(errno.ENODATA)

    async def mkdir(self, parent: int, name: bytes, mode: int, ctx: Any) -> Any:
        path = self._path(parent, name)
        os.mkdir(path, mode & ~ctx.umask)
        return self._stat(self._inode(path), path)

    async def rename(
        self, old_parent: int, old: bytes, new_parent: int, new: bytes, flags: int, ctx: Any
    ) -> None:
        src, dst = self._path(old_parent, old), self._path(new_parent, new)
        try:
            os.rename(src, dst)
        except OSError as e:
            raise _error(e) from None
        ino = self.inodes.pop(src, None)
        if ino is not None:
            self.inodes[dst], self.paths[ino] = ino, dst

    async def unlink(self, parent: int, name: bytes, ctx: Any) -> None:
        path = self._path(parent, name)
        os.unlink(path)
        self.inodes.pop(path, None)

    async def rmdir(self, parent: int, name: bytes, ctx: Any) -> None:
        path = self._path(parent, name)
        os.rmdir(path)
        self.inodes.pop(path, None)

    async def opendir(self, ino: int, ctx: Any) -> int:
        return ino

    async def readdir(self, ino: int, off: int, token: Any) -> None:
        names = sorted(os.listdir(self.paths[ino]))
        for i, name in enumerate(names[off:], off):
            path = os.path.join(self.paths[ino], name)
            attrs = self._stat(self._inode(path), path)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attrs, i + 1):
                break

    async def releasedir(self, fh: int) -> None:
        pass

    def _file(self, fd: int) -> pyfuse3.FileInfo:
        if not self.enable_passthrough:
            return pyfuse3.FileInfo(fh=fd)
        try:
            bid = int(pyfuse3.passthrough_open(fd))
        except OSError:
            os.close(fd)
            raise
        self.backing[fd] = bid
        info = pyfuse3.FileInfo(fh=fd, keep_cache=False, backing_id=bid)
        if NOFLUSH:
            info.noflush = True  # close() sends no FLUSH, as ckptgw's passthrough opens
        return info

    async def create(
        self, parent: int, name: bytes, mode: int, flags: int, ctx: Any
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        path = self._path(parent, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode & ~ctx.umask)
        return self._file(fd), self._attrs(self._inode(path), os.fstat(fd))

    async def open(self, ino: int, flags: int, ctx: Any) -> pyfuse3.FileInfo:
        return self._file(os.open(self.paths[ino], flags & ~(os.O_CREAT | os.O_EXCL | os.O_DIRECT)))

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return os.pread(fh, size, off)

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return os.pwrite(fh, buf, off)

    async def fsync(self, fh: int, datasync: bool) -> None:
        (os.fdatasync if datasync else os.fsync)(fh)

    async def flush(self, fh: int) -> None:
        os.fstat(fh)  # (ckptgw learns here what the kernel wrote; at release if no flush)

    async def release(self, fh: int) -> None:
        bid = self.backing.pop(fh, 0)
        if bid:
            pyfuse3.passthrough_close(bid)
        os.close(fh)

    async def forget(self, inodes: Any) -> None:
        pass

    async def statfs(self, ctx: Any) -> pyfuse3.StatvfsData:
        st, out = os.statvfs(self.paths[pyfuse3.ROOT_INODE]), pyfuse3.StatvfsData()
        for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree"):
            setattr(out, k, getattr(st, k))
        out.f_favail, out.f_namemax = st.f_favail, 255
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("mountpoint")
    ap.add_argument("--no-passthrough", action="store_true", help="every byte through here")
    args = ap.parse_args()
    fs = Floor(args.source, hasattr(pyfuse3, "passthrough_open") and not args.no_passthrough)
    pyfuse3.init(fs, args.mountpoint, {"default_permissions", "fsname=floorfs"})
    try:
        trio.run(pyfuse3.main)
    except BaseException:
        pyfuse3.close(unmount=True)
        raise
    pyfuse3.close(unmount=False)  # unmounted already: that is how main() returns


if __name__ == "__main__":
    main()

"""What the filesystem needs from the store side to show files it does not hold.

The implementation is :class:`drain.reads.readthrough.ReadThrough` (listings merged into the
journal, content fetched into the cache); :class:`LocalOnly` serves a cache on its own.
"""

from __future__ import annotations

import errno
import math
from typing import Protocol

from ckptgw.fsops.inodes import Inode, fs_error
from ckptgw.fsops.journal import InodeRow, State


class Remote(Protocol):
    async def refresh(self, directory: Inode, *, describe: bool = False) -> None:
        """Merge the store's view of ``directory`` into the journal, unless recently done.
        ``describe``: the directory is about to be read (readdir), and every name in it may
        be stat'ed next: read the attributes of the entries still unknown, in parallel."""

    def absent_for(self, directory: Inode) -> float:
        """Seconds for which a name ``directory`` lacks now may be taken as absent (the kernel
        keeps the negative entry): until the store's view of it is due to be listed again.
        Raises EIO where nothing may be taken as absent: the store was never listed there
        and cannot be now (a false "no such file" would hide a file the store has)."""
        ...

    async def describe(self, ino: Inode) -> None:
        """Before the kernel sees a remote entry: read its attributes from the store unless
        recently done (a failure leaves them as they are)."""

    def known(self, row: InodeRow) -> bool:
        """Whether the row's attributes are final (else the kernel must not keep them)."""

    async def prepare_open(self, ino: Inode, flags: int) -> None:
        """Before a remote file is opened: check it still exists (ENOENT if not), then start
        fetching it, or for writing fetch it whole (or nothing, with O_TRUNC)."""

    async def ensure(self, ino: Inode, off: int, size: int) -> None:
        """Return once bytes [off, off + size) of a file being fetched are in the cache."""

    async def ensure_whole(self, ino: Inode) -> None:
        """Return once the whole content of a remote file is in the cache (state clean)."""


class LocalOnly:
    async def refresh(self, directory: Inode, *, describe: bool = False) -> None:
        pass

    def absent_for(self, directory: Inode) -> float:
        return math.inf  # nothing appears except through the mount itself

    async def describe(self, ino: Inode) -> None:
        pass

    def known(self, row: InodeRow) -> bool:
        return True

    async def prepare_open(self, ino: Inode, flags: int) -> None:
        await self.ensure_whole(ino)

    async def ensure(self, ino: Inode, off: int, size: int) -> None:
        await self.ensure_whole(ino)

    async def ensure_whole(self, ino: Inode) -> None:
        if ino.state is State.REMOTE:
            raise fs_error(errno.EIO)  # only in the store, and there is no store

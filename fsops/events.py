"""What the filesystem tells the drain: the whole fsops -> drain contract, one interface.

The filesystem is built with an object that has these methods (the drain's scheduler,
:class:`drain.uploads.scheduler.Scheduler`, or :class:`NoDrain` for a cache on its own) and
calls them on the trio thread. None of them may block or raise: they record what happened and
wake the drain, which does its work in its own tasks. The other direction, the store side of
reading (listings, fetches), is :class:`fsops.remote.Remote`.
"""

from __future__ import annotations

from typing import Protocol


class DrainEvents(Protocol):
    def written(self, inode: int) -> None:
        """A dirty file is quiet for now: its last writable handle was released, an fsync
        ended, or it was truncated without a handle. It may be uploaded after the settle
        delay, unless something happens to it meanwhile."""

    def changed(self, inode: int) -> None:
        """The content of a file is about to change, or its name went: an upload of it that
        is under way is out of date and must stop."""

    def store_ops_added(self) -> None:
        """Store operations (moves, deletes) were journaled and are waiting to be done."""

    def renamed(self, inode: int) -> None:
        """A dirty file was renamed: the last step of a save (temp file, fsync, rename). A
        quiet file need not wait out the rest of its settle delay, which is there to see
        where it ends up."""


class NoDrain:
    """For a filesystem with no drain attached (tests of the filesystem alone, tools)."""

    def written(self, inode: int) -> None:
        pass

    def changed(self, inode: int) -> None:
        pass

    def store_ops_added(self) -> None:
        pass

    def renamed(self, inode: int) -> None:
        pass

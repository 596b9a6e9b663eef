"""Names and attributes: lookup, create, mknod, mkdir, symlink, unlink, rmdir, rename, setattr,
xattrs.

Every entry below the root goes to the store (:mod:`fsops.objectmeta` says how): a new one is
``dirty`` until the drain has put its object. An attribute that the object's metadata carries
(mode, owner, mtime, ``user.*`` extended attributes) changed on an entry the store holds
journals a ``meta`` store operation (an in-place copy with the new metadata), so the content
does not travel again.

A directory that holds entries and has what a listing gives a directory without a marker
object (:func:`needs_no_marker`) gets no marker: the drain makes it clean without a request
(:meth:`FileStates.marker_implied`). When a change here would make a listing show it
otherwise (its last entry goes, or a chmod, chown or setxattr), it becomes dirty in the
change's transaction (:meth:`FileStates.marker_needed`), and the drain PUTs its marker. So does
a directory of another node that has no marker. A change of its mtime alone is not sent: a
listing gives such a directory the time it was listed.

Each operation validates first, then changes the journal in one transaction, then frees cache
files of inodes it destroyed (a crash in between leaves only cache files without a row, which
recovery removes). Errors are raised as OSError with an errno; the FUSE layer translates them.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from dataclasses import dataclass
from typing import Protocol

import pyfuse3

from ckptgw.fsops.inodes import Inode, InodeTable, fs_error
from ckptgw.fsops.journal import InodeRow, Journal, State
from ckptgw.fsops.names import KeyRules
from ckptgw.fsops.objectmeta import XATTR_NAMESPACE, xattrs_fit
from ckptgw.fsops.space import CacheSpace
from ckptgw.fsops.state import FileStates
from ckptgw.fsops.storekeys import StoreKeys

log = logging.getLogger(__name__)

#: The permission bits a listing gives a directory that has no marker object
#: (:mod:`drain.reads.listing`); its owner is its parent's, and it has no extended attributes.
LISTED_DIR_MODE = 0o755


def shown_without_marker(journal: Journal, row: InodeRow) -> bool:
    """Whether a listing shows directory ``row`` with the attributes it has, if it has no
    marker object: permission bits :data:`LISTED_DIR_MODE`, its parent's owner, no extended
    attributes. (Not its mtime: a listing gives it the time it was listed.)"""
    if row.parent is None or row.mode & 0o7777 != LISTED_DIR_MODE:
        return False
    parent = journal.get(row.parent)
    return (
        parent is not None
        and (row.uid, row.gid) == (parent.uid, parent.gid)
        and not journal.list_xattrs(row.id)
    )


def needs_no_marker(journal: Journal, row: InodeRow) -> bool:
    """Whether a fresh node sees directory ``row`` as it is without a marker object: it
    holds an entry (whose key a listing shows it as a prefix of) and
    :func:`shown_without_marker`. An empty one needs its marker, or it is not seen at all."""
    return (
        stat.S_ISDIR(row.mode)
        and shown_without_marker(journal, row)
        and journal.has_children(row.id)
    )


class Caller(Protocol):
    """The parts of pyfuse3.RequestContext we use (a plain object works in tests)."""

    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...
    @property
    def umask(self) -> int: ...


@dataclass
class AttrChange:
    """What setattr changes; None means unchanged. Times are in nanoseconds."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    atime_ns: int | None = None
    mtime_ns: int | None = None
    ctime_ns: int | None = None


class Namespace:
    def __init__(
        self,
        table: InodeTable,
        rules: KeyRules,
        keys: StoreKeys,
        space: CacheSpace,
        states: FileStates,
    ) -> None:
        self.table = table
        self.space = space
        self.journal: Journal = table.journal
        self.rules = rules
        self.keys = keys
        self.states = states

    # -- lookups ---------------------------------------------------------------------------------

    def lookup(self, parent: int, name: bytes) -> Inode:
        """Resolve a name and take one kernel lookup reference on the result."""
        if name == b".":
            ino = self.table.get(parent)
        elif name == b"..":
            p = self.table.get(parent)
            ino = self.table.get(p.parent if p.parent is not None else parent)
        else:
            if len(name) > 255:
                raise fs_error(errno.ENAMETOOLONG)
            found = self.table.lookup(parent, name)
            if found is None:
                raise fs_error(errno.ENOENT)
            ino = found
        ino.lookups += 1
        return ino

    def nlink(self, ino: InodeRow) -> int:
        if ino.parent is None and ino.id != 1:
            return 0
        if stat.S_ISDIR(ino.mode):
            return 2 + self.journal.count_subdirs(ino.id)
        return 1

    # -- creating names --------------------------------------------------------------------------

    def _dir(self, inode: int) -> Inode:
        d = self.table.get(inode)
        if not d.is_dir:
            raise fs_error(errno.ENOTDIR)
        if d.parent is None and d.id != 1:
            raise fs_error(errno.ENOENT)  # the directory was removed while in use
        return d

    def _check_new(self, parent: Inode, name: bytes) -> None:
        self.rules.check_name(name)
        if self.table.lookup(parent.id, name) is not None:
            raise fs_error(errno.EEXIST)
        self.rules.check_key(self.journal.path_components(parent.id), name)

    def _new_row(self, parent: Inode, name: bytes, mode: int, caller: Caller) -> InodeRow:
        now = time.time_ns()
        gid = caller.gid
        if parent.mode & stat.S_ISGID:  # BSD group semantics in set-gid directories
            gid = parent.gid
            if stat.S_ISDIR(mode):
                mode |= stat.S_ISGID
        return InodeRow(
            id=0,
            parent=parent.id,
            name=name,
            mode=mode,
            uid=caller.uid,
            gid=gid,
            size=0,
            atime_ns=now,
            mtime_ns=now,
            ctime_ns=now,
            target=None,
            state=State.CLEAN,  # regular files: set by FileStates.insert_local
            generation=1,
        )

    def _link_new(self, parent: Inode, row: InodeRow, *, cache_file: bool = False) -> Inode:
        """Insert the row (and create its empty cache file) in one transaction."""
        with self.journal.transaction():
            row.id = self.states.insert_local(row)
            # An object left under this name (the entry's before) is replaced, not deleted.
            self.keys.claim(row, self.keys.new_key(parent.id, row.name or b"", row.mode))
            if cache_file:
                self.table.cache.create(row.id)
            self.journal.touch_dir(parent.id, row.ctime_ns)
        # Into memory only once committed: a rolled-back insert leaves nothing behind.
        ino = self.table.adopt(row)
        ino.entry_synced = not cache_file
        parent.mtime_ns = parent.ctime_ns = row.ctime_ns
        ino.lookups += 1
        if not cache_file:
            self.states.quiet(ino)  # nothing writes it: it goes once settled
        return ino

    def mkdir(self, parent_id: int, name: bytes, mode: int, caller: Caller) -> Inode:
        parent = self._dir(parent_id)
        self._check_new(parent, name)
        mode = stat.S_IFDIR | (mode & ~caller.umask & 0o7777)
        return self._link_new(parent, self._new_row(parent, name, mode, caller))

    def symlink(self, parent_id: int, name: bytes, target: bytes, caller: Caller) -> Inode:
        parent = self._dir(parent_id)
        self._check_new(parent, name)
        row = self._new_row(parent, name, stat.S_IFLNK | 0o777, caller)
        row.target, row.size = target, len(target)
        return self._link_new(parent, row)

    def create_file(self, parent_id: int, name: bytes, mode: int, caller: Caller) -> Inode:
        """A new regular file with an empty cache file; dirty from the start."""
        parent = self._dir(parent_id)
        self._check_new(parent, name)
        mode = stat.S_IFREG | (mode & ~caller.umask & 0o7777)
        return self._link_new(parent, self._new_row(parent, name, mode, caller), cache_file=True)

    def mknod(self, parent_id: int, name: bytes, mode: int, rdev: int, caller: Caller) -> Inode:
        """A regular file, FIFO, socket or device. A special file is a name and attributes
        only: the kernel serves a FIFO or a device itself, and the store keeps an empty object
        that says what it is. (Making a device needs CAP_MKNOD, which the kernel checks.)"""
        kind = stat.S_IFMT(mode)
        if kind in (0, stat.S_IFREG):
            ino = self.create_file(parent_id, name, mode, caller)
            self.states.quiet(ino)  # made without an open: no release will report it
            return ino
        if kind not in (stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK):
            raise fs_error(errno.EINVAL)
        parent = self._dir(parent_id)
        self._check_new(parent, name)
        row = self._new_row(parent, name, kind | (mode & ~caller.umask & 0o7777), caller)
        if kind in (stat.S_IFCHR, stat.S_IFBLK):
            row.rdev = rdev
        return self._link_new(parent, row)

    # -- removing names --------------------------------------------------------------------------

    def unlink(self, parent_id: int, name: bytes) -> None:
        parent = self._dir(parent_id)
        ino = self._existing(parent, name)
        if ino.is_dir:
            raise fs_error(errno.EISDIR)
        self._remove(parent, ino)

    def rmdir(self, parent_id: int, name: bytes) -> None:
        parent = self._dir(parent_id)
        ino = self._existing(parent, name)
        if not ino.is_dir:
            raise fs_error(errno.ENOTDIR)
        if self.journal.has_children(ino.id):
            raise fs_error(errno.ENOTEMPTY)
        self._remove(parent, ino)

    def _existing(self, parent: Inode, name: bytes) -> Inode:
        ino = self.table.lookup(parent.id, name)
        if ino is None:
            raise fs_error(errno.ENOENT)
        return ino

    def _remove(self, parent: Inode, ino: Inode) -> None:
        now = time.time_ns()
        with self.journal.transaction():
            self.keys.unlinked(ino)
            freed = self.table.unlink(ino)
            self.journal.touch_dir(parent.id, now)
            self._keep_shown(parent, emptied=True)
        parent.mtime_ns = parent.ctime_ns = now
        if freed:
            self.table.cache.remove(ino.id)

    # -- rename ------------------------------------------------------------------------------------

    def rename(
        self, old_parent_id: int, old_name: bytes, new_parent_id: int, new_name: bytes, flags: int
    ) -> None:
        old_parent = self._dir(old_parent_id)
        new_parent = self._dir(new_parent_id)
        src = self._existing(old_parent, old_name)
        self.rules.check_name(new_name)
        dst = self.table.lookup(new_parent.id, new_name)
        exchange = bool(flags & pyfuse3.RENAME_EXCHANGE)
        if flags & pyfuse3.RENAME_NOREPLACE and dst is not None:
            raise fs_error(errno.EEXIST)
        if exchange and dst is None:
            raise fs_error(errno.ENOENT)
        if dst is src:
            return
        if src.is_dir and self.journal.is_ancestor(src.id, new_parent.id):
            raise fs_error(errno.EINVAL)
        if (
            exchange
            and dst is not None
            and dst.is_dir
            and self.journal.is_ancestor(dst.id, old_parent.id)
        ):
            raise fs_error(errno.EINVAL)
        if dst is not None and not exchange:
            if src.is_dir and not dst.is_dir:
                raise fs_error(errno.ENOTDIR)
            if not src.is_dir and dst.is_dir:
                raise fs_error(errno.EISDIR)
            if dst.is_dir and self.journal.has_children(dst.id):
                raise fs_error(errno.ENOTEMPTY)
        self._check_moved_key(src, new_parent, new_name)
        if exchange and dst is not None:
            self._check_moved_key(dst, old_parent, old_name)

        now = time.time_ns()
        freed = False
        with self.journal.transaction():
            if exchange and dst is not None:
                self.journal.set_name(dst.id, None, None)  # free (new_parent, new_name) first
                self.journal.set_name(src.id, new_parent.id, new_name)
                self.journal.set_name(dst.id, old_parent.id, old_name)
                dst.parent, dst.name, dst.ctime_ns = old_parent.id, old_name, now
                # Each takes the other's keys: src's objects step aside first, or the move
                # of dst's onto them would overwrite them before they are copied.
                self.keys.step_aside(src)
                self._moved(dst)
            elif dst is not None:
                self.keys.unlinked(dst)
                freed = self.table.unlink(dst)
                self.journal.set_name(src.id, new_parent.id, new_name)
            else:
                self.journal.set_name(src.id, new_parent.id, new_name)
            self._moved(src)
            src.parent, src.name, src.ctime_ns = new_parent.id, new_name, now
            self.table.persist(src)
            if exchange and dst is not None:
                self.table.persist(dst)
                self._keep_shown(dst)  # its owner against its new parent's
            self._keep_shown(src)
            if old_parent is not new_parent:
                self._keep_shown(old_parent, emptied=True)
            for d in {old_parent.id: old_parent, new_parent.id: new_parent}.values():
                self.journal.touch_dir(d.id, now)
                d.mtime_ns = d.ctime_ns = now
        if freed and dst is not None:
            self.table.cache.remove(dst.id)
        if src.is_reg and src.state is State.DIRTY:
            self.keys.events.renamed(src.id)

    def _moved(self, ino: Inode) -> None:
        """Its name is already changed in the journal: move what the store holds (for a
        directory, its marker and everything below it)."""
        key = self.keys.key_of(ino.id)
        if ino.is_dir:
            self.keys.moved_tree(ino.id, key)
        self.keys.moved(ino.id, key)

    def _check_moved_key(self, ino: Inode, new_parent: Inode, new_name: bytes) -> None:
        subtree = self.journal.longest_suffix(ino.id) if ino.is_dir else 0
        self.rules.check_key(self.journal.path_components(new_parent.id), new_name, subtree)

    # -- attributes ------------------------------------------------------------------------------

    async def setattr(self, inode: int, change: AttrChange) -> Inode:
        ino = self.table.get(inode)
        now = time.time_ns()
        before = (ino.mode, ino.uid, ino.gid, ino.mtime_ns)
        if change.size is not None and change.size != ino.size:
            if not ino.is_reg:
                raise fs_error(errno.EINVAL)
            await self.states.mark_dirty(ino)
            # Growth is a hole: it takes no blocks, so nothing is charged (writes into it are,
            # as they land). A size the cache filesystem cannot hold fails there, with EFBIG.
            fd = ino.fd if ino.fd >= 0 else self.table.cache.open(ino.id)
            try:
                os.ftruncate(fd, change.size)
            finally:
                if fd != ino.fd:
                    os.close(fd)
            self.space.shrink(ino, change.size)
            ino.size = change.size
            ino.mtime_ns = now
        if change.mode is not None:
            ino.mode = stat.S_IFMT(ino.mode) | (change.mode & 0o7777)
        if change.uid is not None:
            ino.uid = change.uid
        if change.gid is not None:
            ino.gid = change.gid
        if change.atime_ns is not None:
            ino.atime_ns = change.atime_ns
        if change.mtime_ns is not None:
            ino.mtime_ns = change.mtime_ns
        ino.ctime_ns = change.ctime_ns if change.ctime_ns is not None else now
        changed = (ino.mode, ino.uid, ino.gid, ino.mtime_ns) != before
        with self.journal.transaction():
            self.table.persist(ino)
            again = changed and self._attrs_changed(ino)
            if ino.is_dir and (ino.uid, ino.gid) != before[1:3]:
                # What a listing gives the directories in it without a marker: its owner.
                # Only this node's own: another node's directory listed here (remote) may
                # have a marker not read yet, which a PUT from here would overwrite.
                for sub in self.journal.subdirs(ino.id):
                    if sub.state is State.CLEAN:
                        self._keep_shown(sub)
        if again:
            await self._send_again(ino)
        if change.size is not None and ino.writers == 0:
            self.states.quiet(ino)  # truncated without an open handle
        return ino

    def _attrs_changed(self, ino: Inode) -> bool:
        """Metadata that the store keeps changed (called in the change's transaction): see
        that the store gets it. A dirty entry takes it with its upload; one the store holds
        gets it by an in-place copy, journaled here; a directory without a marker gets one
        if a listing would no longer show it as it is (:meth:`_keep_shown`). Returns True
        where the entry must go again instead (:meth:`_send_again`): it is being uploaded
        (its metadata was fixed when the upload began)."""
        if ino.parent is None or ino.state is State.DIRTY:
            return False  # the root (not in the store), an orphan, or not sent yet
        if ino.state is State.UPLOADING:
            return True
        if not ino.stored_key:
            if ino.is_dir:  # no marker
                self._keep_shown(ino)
                return False
            return True
        self.keys.metadata_changed(ino)
        return False

    def _keep_shown(self, d: InodeRow, *, emptied: bool = False) -> None:
        """In the transaction of a change of directory ``d`` or of what is in it (``emptied``:
        an entry left it): if ``d`` has no marker object and a fresh node's listing would no
        longer show it as it is (it is empty now, or :func:`shown_without_marker` no longer
        holds), it becomes dirty, and the drain PUTs its marker. Its mtime alone is not
        sent."""
        d = self.table.current(d)
        if (
            not d.is_dir
            or d.parent is None
            or d.stored_key
            or d.state not in (State.CLEAN, State.REMOTE)
        ):
            return  # the root, an orphan, a marker kept, or its upload takes it as it is
        # An entry leaving changes only whether it is empty (an unlink of every file of a
        # checkpoint asks no more than that); its own change, whether a listing shows it so.
        if emptied:
            needed = not self.journal.has_children(d.id)
        else:
            needed = not shown_without_marker(self.journal, d)
        if needed:
            self.states.marker_needed(d)

    async def _send_again(self, ino: Inode) -> None:
        await self.states.mark_dirty(ino)
        if ino.writers == 0:
            self.states.quiet(ino)

    def readlink(self, inode: int) -> bytes:
        ino = self.table.get(inode)
        if ino.target is None:
            raise fs_error(errno.EINVAL)
        return ino.target

    # -- extended attributes -------------------------------------------------------------------
    # Stored in the journal and drained in the object's metadata (fsops.objectmeta). Only the
    # "user." namespace: "system.*" (POSIX ACLs) would not be enforced here (no enable_acl),
    # and "trusted.*"/"security.*" mean something to this node's kernel only. Asking for any
    # other name is ENOTSUP, not ENODATA, as setting it is: `ls -l` then asks once per mount
    # (coreutils remembers a filesystem without SELinux labels or ACLs) instead of twice a file.

    @staticmethod
    def _check_xattr_name(name: bytes) -> None:
        if not name.startswith(XATTR_NAMESPACE):
            raise fs_error(errno.ENOTSUP)

    def getxattr(self, inode: int, name: bytes) -> bytes:
        self._check_xattr_name(name)
        value = self.journal.get_xattr(self.table.get(inode).id, name)
        if value is None:
            raise fs_error(pyfuse3.ENOATTR)
        return value

    async def setxattr(self, inode: int, name: bytes, value: bytes) -> None:
        self._check_xattr_name(name)
        ino = self.table.get(inode)
        pairs = dict(self.journal.xattrs(ino.id))
        if pairs.get(name) == value:
            return
        pairs[name] = value
        if not xattrs_fit(pairs.items()):
            log.warning(
                "setxattr %s on inode %d refused: the extended attributes of one entry must "
                "fit in the object's metadata (about 1 KiB in all)",
                name.decode(errors="replace"),
                ino.id,
            )
            raise fs_error(errno.ENOSPC)
        ino.ctime_ns = time.time_ns()
        with self.journal.transaction():
            self.journal.set_xattr(ino.id, name, value)
            self.journal.update_attrs(ino)
            again = self._attrs_changed(ino)
        if again:
            await self._send_again(ino)

    def listxattr(self, inode: int) -> list[bytes]:
        return list(self.journal.list_xattrs(self.table.get(inode).id))

    async def removexattr(self, inode: int, name: bytes) -> None:
        self._check_xattr_name(name)
        ino = self.table.get(inode)
        with self.journal.transaction():
            if not self.journal.remove_xattr(ino.id, name):
                raise fs_error(pyfuse3.ENOATTR)
            ino.ctime_ns = time.time_ns()
            self.journal.update_attrs(ino)
            again = self._attrs_changed(ino)
        if again:
            await self._send_again(ino)

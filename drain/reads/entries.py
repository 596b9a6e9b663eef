"""What the store says about one entry: its object's metadata, read and applied to its row.

A listing shows keys, sizes and ETags only. The rest (mode, owner, mtime, extended attributes,
a file's checksum, and whether a small object is a symlink or a special file: see
:mod:`fsops.objectmeta`) is in each object's metadata, which takes a HEAD. A listing HEADs the
entries it has not seen, in parallel and up to a bound (:mod:`drain.reads.listing`); any other
remote entry is described at its first lookup, and until then the kernel is told not to keep
its attributes (:meth:`Entries.known`). Lookups of one entry share one read, and a lookup
waits for it at most ``store.lookup_wait`` (:mod:`drain.reads.readthrough`): past that it answers
with the listing's attributes, still not kept, and the read goes on. An open HEADs the object
again unless that was done within ``fresh_for`` seconds: it must not open what was deleted or
rewritten meanwhile.
"""

from __future__ import annotations

import errno
import logging
import stat
import time

import trio

from ckptgw.fsops.contentsum import parts_checksum
from ckptgw.fsops.inodes import Inode, InodeTable, fs_error
from ckptgw.fsops.journal import InodeRow, State
from ckptgw.fsops.objectmeta import EntryMeta, decode
from ckptgw.fsops.state import FileStates
from ckptgw.fsops.storekeys import StoreKeys
from ckptgw.store.interface import ObjectInfo, Store, StoreError

log = logging.getLogger(__name__)


def read_meta(info: ObjectInfo) -> EntryMeta:
    """The entry an object stands for; metadata we cannot read counts as none (a plain file).
    A multipart upload's checksum is its part size with the store's CRC32, if ``info`` has it
    (a HEAD's, not a ranged GET's)."""
    try:
        meta = decode(info.metadata)
    except ValueError as e:
        log.warning("ignoring unreadable metadata of %s: %s", info.key, e)
        return EntryMeta()
    if meta.checksum is None and meta.part_size is not None and info.crc32:
        meta.checksum = parts_checksum(meta.part_size, info.crc32)
    return meta


def apply_attrs(row: InodeRow, meta: EntryMeta) -> None:
    """Mode bits, owner and mtime from the metadata (the kind and a device's number are fixed
    when a row is made)."""
    if meta.mode is not None:
        row.mode = stat.S_IFMT(row.mode) | meta.mode
    if meta.uid is not None:
        row.uid = meta.uid
    if meta.gid is not None:
        row.gid = meta.gid
    if meta.mtime_ns is not None:
        row.mtime_ns = row.ctime_ns = meta.mtime_ns


class Entries:
    """``store`` retries temporary errors itself (:class:`ckptgw.store.retry.RetryingStore`);
    ``lookup_store`` (default: ``store``) serves a lookup's HEAD, which should get few
    attempts, as a listing does."""

    def __init__(
        self,
        table: InodeTable,
        states: FileStates,
        keys: StoreKeys,
        store: Store,
        fresh_for: float = 5.0,
        *,
        lookup_store: Store | None = None,
    ) -> None:
        self.table = table
        self.journal = table.journal
        self.states = states
        self.keys = keys
        self.store = store
        self.lookup_store = lookup_store or store
        self.fresh_for = fresh_for
        self._checked: dict[int, float] = {}  # inode -> when its object was last read
        self._reading: dict[int, trio.Event] = {}  # inode -> a lookup's read under way

    def known(self, row: InodeRow) -> bool:
        """Whether the row's attributes are final: it is not a remote entry still to be
        described."""
        return row.state is not State.REMOTE or row.id in self._checked

    def described(self, row: InodeRow, info: ObjectInfo | None, meta: EntryMeta) -> None:
        """Apply what the store said about a remote entry (``info`` None: a directory with no
        marker), in the caller's transaction."""
        key = info.key if info is not None else None
        etag = info.etag if info is not None else None
        self.states.remote_checked(row, meta.checksum, key, etag)
        apply_attrs(row, meta)
        self.journal.update_attrs(row)
        if row.is_reg or row.is_dir:
            self.journal.replace_xattrs(row.id, list(meta.xattrs.items()))
        self._checked[row.id] = time.monotonic()
        if len(self._checked) > 100_000:
            self._checked = {i: t for i, t in self._checked.items() if self.table.peek(i)}

    async def describe(self, ino: Inode, *, strict: bool) -> None:
        """Read a remote entry's object: for a lookup, unless that was ever done; before an
        open, unless done within ``fresh_for`` seconds.

        ``strict`` (before an open): an object that is gone is ENOENT, one rewritten since the
        listing ESTALE, a store that cannot answer EIO. Otherwise (a lookup) any of these
        leaves the entry as it is: the next listing settles it, and lookups of one entry
        share one read (a stalled store is not sent a HEAD per lookup)."""
        if ino.state is not State.REMOTE:
            return
        seen = self._checked.get(ino.id)
        if seen is not None and (not strict or time.monotonic() - seen < self.fresh_for):
            return  # a lookup needs it described once; later changes come with listings
        if strict:
            await self._read(ino, strict=True)
            return
        busy = self._reading.get(ino.id)
        if busy is not None:
            await busy.wait()
            return
        done = self._reading[ino.id] = trio.Event()
        try:
            await self._read(ino, strict=False)
        finally:
            del self._reading[ino.id]
            done.set()

    async def _read(self, ino: Inode, *, strict: bool) -> None:
        key = self.keys.entry_key(ino) if ino.is_dir else ino.stored_key
        if key is None:
            if strict:
                raise fs_error(errno.EIO)
            return
        if strict:
            await self.keys.settled(key, 30)  # our own move of it may still be under way
        try:
            info = await (self.store if strict else self.lookup_store).head(key)
        except StoreError as e:
            if strict:
                log.warning("cannot open %s: %s", key, e)
                raise fs_error(errno.EIO) from None
            log.info("cannot read the metadata of %s: %s", key, e)
            return
        if not self._still(ino, key):
            return
        if ino.is_dir:
            with self.journal.transaction():
                self.described(ino, info, read_meta(info) if info else EntryMeta())
            return
        if info is None:
            if strict:
                log.info("%s is no longer in the store", key)
                raise fs_error(errno.ENOENT)
            return
        if info.etag != ino.stored_etag:
            # Rewritten since the listing: the next listing gives the name a new inode.
            if strict:
                log.info("%s changed in the store since it was listed", info.key)
                raise fs_error(errno.ESTALE)
            return
        with self.journal.transaction():
            self.described(ino, info, read_meta(info))

    def read_by_get(self, ino: Inode, info: ObjectInfo) -> bool:
        """A GET of a remote file's object (pinned to its ETag) answered with ``info``: apply
        it as a HEAD's answer, unless the entry changed meanwhile. Whether it applied."""
        if not self._still(ino, info.key) or info.etag != ino.stored_etag:
            return False
        with self.journal.transaction():
            self.described(ino, info, read_meta(info))
        return True

    def _still(self, ino: Inode, key: str) -> bool:
        """Whether what the store says of ``key`` now still describes the remote entry
        ``ino``."""
        if ino.state is not State.REMOTE:
            return False  # changed while the request ran (O_TRUNC, fetched by another open)
        now_key = self.keys.entry_key(ino) if ino.is_dir else ino.stored_key
        # Renamed meanwhile, or a change of ours (a move, a metadata update) is still on its
        # way to the store: what the store says now is older than the row.
        return now_key == key and key not in self.journal.pending_keys()

"""The shared namespace: what the store holds, merged into the journal one directory at a time.

When the kernel looks up a name or opens a directory, the directory is listed in the store
(one delimiter LIST, every page) unless it was listed less than ``ttl`` seconds ago, so a
burst of creates in a directory costs one LIST, not one HEAD per name. The merge, in one
journal transaction:

* an object the journal does not have becomes a ``remote`` row, a prefix a ``remote``
  directory. Size and times come from the listing; the rest from the object's metadata
  (:mod:`drain.reads.entries`). A directory's marker and a small object (it may be a symlink or a
  special file, which decides the row's kind) are read here, before the merge, in parallel
  (one whose metadata cannot be read now is left for the next listing). A bigger object is a
  regular file, described later: by its first lookup (a HEAD), by the first response of a
  fetch of it (a warm-up's: no HEAD at all), or, when the directory is about to be read
  (``ls -l``, ``du``), by :meth:`Listings.describe_all`, in parallel for up to ``describe``
  entries, so that stat-ing every name does not cost one HEAD after another;
* local entries win: a dirty or uploading entry is left as it is, and so is a name that is a
  directory here and an object there, or the other way round;
* a clean or remote entry whose object has another ETag was rewritten by someone else (last
  writer wins): unless it is open here, it is replaced by a new remote inode (the kernel
  keeps size and mtime of an inode it knows, so the same inode could not show the new size);
* a remote or clean entry whose object is gone was deleted by someone else: the name goes,
  unless the entry is open, or the object is ours and newer than the listing, or a store
  operation of ours is moving it (a directory goes only when nothing is left in it here);
* an object or prefix this gateway is deleting or moving away (a pending store operation), or
  deleted after the listing started (a tombstone in :class:`fsops.storekeys.StoreKeys`), is
  not brought back: the listing is older than the delete.

A failed listing is logged once (until one works again); it is tried again after ``ttl``.

**A slow store.** A listing runs in the background (:mod:`drain.reads.lookupwait`) and a lookup
waits for it at most ``store.lookup_wait`` seconds after it started; later lookups share it
rather than start another, and its merge is made whenever it completes. Past the deadline, a lookup
is answered from the journal only where the journal's view of the directory can be trusted
to say "no such name" (:meth:`Listings.has_view`): the directory was listed or made since the
mount, or, from before it, made on this node or holding entries (a view as old as its last
listing then). Either way local entries win, so the saving node is never held up by the
store. A directory with no such view (a fresh node restoring a checkpoint: nothing in the
journal to answer from) waits for its first listing, bounded by the store's own request
deadlines and attempts; if that listing fails, a name it lacks is an error (EIO), not "no
such file", and so is reading the directory: an empty answer would be a false one (unless
the store said the bucket does not exist: then it holds nothing, and "no such file" is
true). A
negative answer is never kept by the kernel while the listing is late or failing
(:meth:`Listings.fresh_for` is 0 then).
"""

from __future__ import annotations

import logging
import stat
import time
from dataclasses import dataclass

import trio

from ckptgw.drain.reads.entries import Entries, read_meta
from ckptgw.drain.reads.lookupwait import LookupWait, Pending
from ckptgw.fsops.inodes import Inode
from ckptgw.fsops.journal.rows import ROOT_INODE, InodeRow, State
from ckptgw.fsops.names import RESERVED
from ckptgw.fsops.namespace import LISTED_DIR_MODE
from ckptgw.fsops.objectmeta import SMALL_OBJECT, EntryMeta
from ckptgw.fsops.parts import OnParts, Parts
from ckptgw.store.interface import Listing, ObjectInfo, Store, StoreError


@dataclass(frozen=True)
class _Described:
    """A small object's metadata (and a symlink's target), read before the merge."""

    info: ObjectInfo
    meta: EntryMeta
    target: bytes | None = None


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ListingConfig:
    listing_ttl: float = 5.0
    heads: int = 16  # metadata reads (HEADs) in flight during one listing
    describe: int = 1000  # entries described at once before a readdir; others: at lookup


class Listings(OnParts):
    """``store`` retries temporary errors itself (:class:`ckptgw.store.retry.RetryingStore`); a
    listing is on the path of a lookup, so it should be given few attempts. ``waits``: the
    lookup path's deadline; without one (or until it runs) a listing runs in its caller's
    task and is always waited for."""

    def __init__(
        self,
        parts: Parts,
        entries: Entries,
        store: Store,
        config: ListingConfig,
        waits: LookupWait | None = None,
    ) -> None:
        super().__init__(parts)
        self.entries = entries
        self.store = store
        self.config = config
        self.waits = waits if waits is not None else LookupWait()
        # directory inode -> when its last listing started (trio's clock), and the same of
        # the listings that were merged
        self._tried: dict[int, float] = {}
        self._listed: dict[int, float] = {}
        self._from_store: set[int] = set()  # directories this mount's listings made
        self._inflight: dict[int, Pending] = {}
        self._describing: dict[int, Pending] = {}  # directory -> its describe_all
        self._failing = False

    def fresh_for(self, d: Inode) -> float:
        """Seconds until the store's view of ``d`` is due to be listed again (0: now, or
        the store could not be listed, or a listing is still under way: a name may show up
        when it completes)."""
        last = self._tried.get(d.id)
        if last is None or self._failing or d.id in self._inflight:
            return 0.0
        return max(0.0, self.config.listing_ttl - (trio.current_time() - last))

    def has_view(self, d: InodeRow) -> bool:
        """Whether the journal may say that a name ``d`` lacks is not there, without asking
        the store: ``d`` was listed since the mount, or made by this mount (not by one of its
        listings): it was new then, and every name in it since came through this mount or a
        listing of it. (A removed directory still open somewhere holds nothing.)

        From an earlier mount (this node restarted), the journal's view is as old as the last
        listing of it then, as for a directory listed ``ttl`` ago: a directory made on this
        node (not learnt from a listing) has one, and so does any that holds entries (they
        came from a listing of it, or were made in it here). Only what this node knows
        nothing of, a fresh node's root and the directories its listings only named, has
        none: there the store is asked, and a failure is an error, not an empty answer."""
        if d.id in self._listed or (d.parent is None and d.id != ROOT_INODE):
            return True
        if d.epoch == self.journal.epoch and d.id not in self._from_store:
            return True
        if d.id == ROOT_INODE or d.state is State.REMOTE or d.id in self._from_store:
            return self.journal.has_children(d.id)
        return True

    async def refresh(self, d: Inode, *, deadline: float | None = None) -> None:
        """Merge the store's view of ``d`` unless it was listed less than ``ttl`` ago (the
        listing under way, if any, is shared). ``deadline`` (trio's clock), on a lookup's
        path: wait for the listing until then at most, and no longer than the lookup wait
        after it started, where :meth:`has_view` lets the journal answer meanwhile; without
        a deadline (a warm-up) wait for it to end."""
        if not d.is_dir or (d.parent is None and d.id != ROOT_INODE):
            return
        job = self._inflight.get(d.id)
        if job is None:
            last = self._tried.get(d.id)
            if last is not None and trio.current_time() - last < self.config.listing_ttl:
                return
            prefix = self._prefix(d)
            job = await self.waits.start(
                self._inflight,
                d,
                f"LIST {prefix or '(the top level)'}",
                lambda job: self._refresh(d, prefix, job.started),
                self.table,
            )
        if deadline is None:
            await job.done.wait()
        elif not await self.waits.join(job, deadline):
            if self.has_view(d):
                self.waits.from_journal += 1
                return
            await job.done.wait()  # nothing to answer from: the first listing is the answer

    def _prefix(self, d: InodeRow) -> str:
        """The keys of what is in ``d`` start with this."""
        prefix = self.keys.key_of(d.id)
        return prefix if d.id == ROOT_INODE else prefix + "/"

    async def _refresh(self, d: Inode, prefix: str, began: float) -> bool:
        started = time.monotonic()  # what the merge compares our own deletes and uploads with
        listing, nothing = await self._list(prefix)
        self._tried[d.id] = began
        if listing is None:
            if nothing:  # no merge: what is clean here may be the only copy left
                self._listed[d.id] = began
            return False
        described = await self._describe_new(d, prefix, listing)
        if d.parent is None and d.id != ROOT_INODE:
            return False  # removed meanwhile
        if self._prefix(d) != prefix:
            # Renamed while it was listed (a listing may outlive its lookup by minutes):
            # what it shows is of the old name, whose objects are moving away.
            self._tried.pop(d.id, None)
            return False
        self._merge(d, prefix, listing, started, described)
        self._listed[d.id] = began
        return True

    async def describe_all(self, d: Inode, *, deadline: float | None = None) -> None:
        """Read the metadata of ``d``'s remote entries not yet described, up to ``describe``
        of them, ``heads`` at a time: the directory is about to be read, and ``ls -l`` or
        ``du`` then stats every name (a lookup of an entry still unknown would HEAD it, one
        after another). A read that fails leaves the entry for its lookup. ``deadline``, as
        for :meth:`refresh`: the reads go on in the background past it (an entry's lookup
        meanwhile shares its read: :meth:`drain.reads.entries.Entries.describe`)."""
        job = self._describing.get(d.id) or await self.waits.start(
            self._describing,
            d,
            f"HEADs of the entries of {self._prefix(d) or 'the top level'}",
            lambda _: self._describe_all(d),
            self.table,
        )
        if deadline is None:
            await job.done.wait()
        elif not await self.waits.join(job, deadline):
            self.waits.undescribed += 1

    async def _describe_all(self, d: Inode) -> bool:
        todo: list[InodeRow] = []
        after = 0
        while len(todo) < self.config.describe and (rows := self.table.children(d.id, after, 1000)):
            after = rows[-1].id
            todo += [r for r in rows if not self.entries.known(r)]
        limiter = trio.CapacityLimiter(self.config.heads)

        async def one(row: InodeRow) -> None:
            ino = self.table.adopt(row)
            ino.pins += 1
            try:
                async with limiter:
                    await self.entries.describe(ino, strict=False)
            finally:
                ino.pins -= 1
                self.table.release_if_unused(ino)

        async with trio.open_nursery() as nursery:
            for row in todo[: self.config.describe]:
                nursery.start_soon(one, row)
        return True

    async def _list(self, prefix: str) -> tuple[Listing | None, bool]:
        """The listing, or None if the store could not be listed; and whether it says that
        it holds nothing there (no such bucket: the journal's view is then whole, and the
        save goes on into the cache, to be drained once the store is fixed, e.g. by
        ``ckptgw cache rebind``)."""
        try:
            listing = await self.store.list_dir(prefix)
        except StoreError as e:
            if not self._failing:
                log.warning(
                    "cannot list the store (%s); lookups are answered from what this node "
                    "knows (an error in directories not listed since the mount)",
                    e,
                )
            self._failing = True
            return None, e.code == "NoSuchBucket"
        if self._failing:
            log.info("listing the store works again")
            self._failing = False
        return listing, False

    async def _describe_new(
        self, d: Inode, prefix: str, listing: Listing
    ) -> dict[str, _Described | None]:
        """Read the metadata of small objects new to this node (they may be symlinks or
        special files: a symlink's target is read too), then of new directories' markers (a
        directory's key: None if it has no marker), up to ``describe`` of them, in parallel.
        A read that fails leaves the entry out of the answer."""
        small: list[str] = []
        other: list[str] = []
        for o in listing.objects:
            if o.key == prefix or o.size > SMALL_OBJECT:
                continue
            found = self.journal.lookup(d.id, o.key[len(prefix) :].encode())
            if found is None or found.stored_etag != o.etag:
                small.append(o.key)
        for p in listing.dirs:
            if self.journal.lookup(d.id, p[len(prefix) : -1].encode()) is None:
                other.append(p)
        etags = {o.key: o.etag for o in listing.objects}
        todo = (small + other)[: self.config.describe]  # the rest at a later listing / lookup
        out: dict[str, _Described | None] = {}
        limiter = trio.CapacityLimiter(self.config.heads)

        async def one(key: str) -> None:
            async with limiter:
                try:
                    info = await self.store.head(key)
                    if key.endswith("/"):
                        out[key] = None if info is None else _Described(info, read_meta(info))
                        return
                    if info is None or info.etag != etags[key]:
                        return  # changed since the listing: the next one sees it
                    meta = read_meta(info)
                    target = None
                    if meta.kind == stat.S_IFLNK:
                        target = await self.store.get(key, etag=info.etag)
                except StoreError as e:
                    log.info("cannot read the metadata of %s now (%s)", key, e)
                    return
                out[key] = _Described(info, meta, target)

        async with trio.open_nursery() as nursery:
            for key in todo:
                nursery.start_soon(one, key)
        return out

    # -- the merge -------------------------------------------------------------------------------

    def _merge(
        self,
        d: Inode,
        prefix: str,
        listing: Listing,
        started: float,
        described: dict[str, _Described | None],
    ) -> None:
        pending = self.journal.pending_keys()
        seen: set[bytes] = set()
        freed: list[int] = []
        with self.journal.transaction():
            root = d.id == ROOT_INODE
            for o in listing.objects:
                name = self._name(o.key[len(prefix) :])
                if name is not None and not (root and name.startswith(RESERVED)):
                    seen.add(name)
                    freed += self._file(d, name, o, pending, started, described.get(o.key))
            for p in listing.dirs:
                name = self._name(p[len(prefix) : -1])
                if name is not None and not (root and name.startswith(RESERVED)):
                    seen.add(name)
                    self._dir(d, name, p, pending, started, described)
            after = 0
            while batch := self.journal.children(d.id, after, 1024):
                for row in batch:
                    after = row.id
                    if row.name is not None and bytes(row.name) not in seen:
                        freed += self._vanished(row, pending, started)
        for inode in freed:
            self.table.cache.remove(inode)

    def _name(self, name: str) -> bytes | None:
        raw = name.encode()
        if not name or "/" in name or name in (".", "..") or len(raw) > 255:
            if name:
                log.debug("skipping store key component %r: not a file name here", name)
            return None
        return raw

    @staticmethod
    def _in_use(row: InodeRow) -> bool:
        return isinstance(row, Inode) and bool(row.opens or row.pins or row.fd >= 0)

    def _gone(self, key: str, pending: set[str], started: float) -> bool:
        """Whether we are deleting ``key`` (or moving it away), or deleted it after the
        listing started: then the listing is older than the delete."""
        if key.endswith("/"):
            if any(k.startswith(key) for k in pending):
                return True
        elif key in pending:
            return True
        return self.keys.removed_since(key, started)

    def _new_row(self, d: Inode, name: bytes, mode: int, size: int, mtime_ns: int) -> InodeRow:
        return InodeRow(
            id=0,
            parent=d.id,
            name=name,
            mode=mode,
            uid=d.uid,
            gid=d.gid,
            size=size,
            atime_ns=0,  # never opened here: the first to go when the cache needs room
            mtime_ns=mtime_ns,
            ctime_ns=mtime_ns,
            target=None,
            state=State.REMOTE,
            generation=1,
        )

    def _insert_listed(
        self, d: Inode, name: bytes, o: ObjectInfo, described: _Described | None
    ) -> None:
        """A new remote row for an object (described, if it is small)."""
        mtime_ns = int(o.mtime * 1e9)
        meta = described.meta if described is not None else EntryMeta()
        default = 0o644 if meta.kind == stat.S_IFREG else 0o777 if meta.kind == stat.S_IFLNK else 0
        row = self._new_row(d, name, meta.kind | default, o.size, mtime_ns)
        row.rdev = meta.rdev
        if described is not None and described.target is not None:
            row.target, row.size = described.target, len(described.target)
        elif meta.kind != stat.S_IFREG:
            row.size = 0
        self.states.insert_listed(row, o.key, o.etag)
        if described is not None:
            self.entries.described(row, described.info, meta)

    def _file(
        self,
        d: Inode,
        name: bytes,
        o: ObjectInfo,
        pending: set[str],
        started: float,
        described: _Described | None,
    ) -> list[int]:
        if o.size <= SMALL_OBJECT and described is None:
            return []  # what it is is not known yet (its metadata could not be read)
        found = self.journal.lookup(d.id, name)
        if found is None:
            if not self._gone(o.key, pending, started):
                self._insert_listed(d, name, o, described)
            return []
        row = self.table.current(found)
        if stat.S_ISDIR(row.mode) or row.state not in (State.CLEAN, State.REMOTE):
            return []  # local wins: a directory here, or not yet in the store
        if row.stored_key == o.key and row.stored_etag == o.etag:
            return []
        if o.key in pending or row.stored_key in pending or self._in_use(row):
            return []
        if self.keys.recently_stored.get(o.key, -1.0) >= started - 1.0:
            return []  # ours, and newer than the listing (which shows the older object)
        # Rewritten by someone else: the store's version is the current one. It gets a new
        # inode, because the kernel (write-back cache) never takes a new size or mtime for an
        # inode it knows; an old inode still looked up lives on as an orphan until forgotten.
        log.info("%s changed in the store; the cached copy is dropped", o.key)
        freed = self.table.unlink(self.table.adopt(row))
        self._insert_listed(d, name, o, described)
        return [row.id] if freed and row.is_reg and row.state is State.CLEAN else []

    def _dir(
        self,
        d: Inode,
        name: bytes,
        key: str,
        pending: set[str],
        started: float,
        described: dict[str, _Described | None],
    ) -> None:
        if self.journal.lookup(d.id, name) is not None or self._gone(key, pending, started):
            return
        # No marker read (yet): what a listing gives such a directory, and a marker-less one
        # made on a node with these attributes PUTs none (fsops.namespace.needs_no_marker).
        row = self._new_row(d, name, stat.S_IFDIR | LISTED_DIR_MODE, 0, time.time_ns())
        self._from_store.add(self.states.insert_listed(row, None, None))
        if key in described:  # else its marker, if any, is read at its lookup
            marker = described[key]
            meta = marker.meta if marker is not None else EntryMeta()
            self.entries.described(row, marker.info if marker is not None else None, meta)

    def _vanished(self, found: InodeRow, pending: set[str], started: float) -> list[int]:
        row = self.table.current(found)
        if self._in_use(row) or row.state not in (State.CLEAN, State.REMOTE):
            return []
        if stat.S_ISDIR(row.mode):
            if self.journal.has_children(row.id):
                return []
            if not row.stored_key:
                # No marker, and nothing in it any more: the store holds nothing of it (what
                # was in it was deleted elsewhere). One emptied here is dirty instead, until
                # its marker is put (fsops.namespace).
                self.table.unlink(self.table.adopt(row))
                return []
        key = row.stored_key
        if key is None or key in pending:
            return []
        if self.keys.recently_stored.get(key, -1.0) >= started - 1.0:
            return []  # ours, and newer than the listing
        log.info("%s was deleted from the store; the name goes here too", key)
        freed = self.table.unlink(self.table.adopt(row))
        return [row.id] if freed and row.is_reg and row.state is State.CLEAN else []

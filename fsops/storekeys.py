"""What namespace changes mean for objects already in the store (rules in ARCHITECTURE.md).

Called inside the namespace operation's journal transaction, so the store operation it
implies commits with the change itself and is resumed after a crash:

* dirty, never stored: renamed or unlinked, nothing (it is uploaded to its key later);
* dirty, an older version stored at S: renamed or unlinked, delete S;
* uploading: as dirty for S; a rename lets the upload finish and move its object to the new
  key (or go again, if another file was moved to its old key meanwhile); an unlink cancels
  the upload and deletes what it may have sent (its key), in order before any later change
  of that key;
* clean (or remote), stored at S: renamed to K, move S -> K (server-side copy, then delete
  S); unlinked, delete S; its stored metadata changed (chmod, chown, utimes, xattrs), copy S
  onto itself with the new metadata ('meta').

A key is replaced, never removed and then added: an entry that takes a name (created, or
renamed to it) whose key still holds another entry's object, to be deleted or moved away by a
pending operation, claims it (:meth:`StoreKeys.claim`). The delete is dropped (unless it is
being sent), and the object stays until the new entry's upload or move overwrites it, which S3
does atomically; until then it is the entry's previous version (``stored_key`` of a dirty or
uploading row). Only keys that no entry holds are deleted: a delete, or a move's delete of its
source, is skipped by :mod:`drain.uploads.storeops` when an entry holds the key by then.

An exchange of two stored entries (RENAME_EXCHANGE) copies one of them to a temporary key
under ``.ckptgw-exchange/`` first, so that neither move overwrites what the other still has to
copy; each original key stays in place until the other's object is copied onto it.

This holds for every kind of entry. A directory's object is its marker, whose key ends in "/"
(:meth:`StoreKeys.entry_key`); renaming a directory moves its marker and every object below.
"""

from __future__ import annotations

import collections
import stat
import time
import uuid

import trio

from ckptgw.fsops.events import DrainEvents
from ckptgw.fsops.inodes import Inode, InodeTable
from ckptgw.fsops.journal import InodeRow, State, StoreOp
from ckptgw.fsops.state import FileStates

RECENT = 600.0  # seconds a key stays in recently_stored / recently_removed


class StoreKeys:
    def __init__(
        self, table: InodeTable, states: FileStates, events: DrainEvents, prefix: str
    ) -> None:
        self.table = table
        self.journal = table.journal
        self.states = states
        self.events = events
        self.prefix = prefix
        # Keys this gateway wrote lately (monotonic time): a listing that started before an
        # object landed does not show it, which must not read as "someone deleted it".
        self.recently_stored: Recent = Recent()
        # Keys this gateway deleted lately (monotonic time the delete completed): a listing
        # that started before then may still show the object, which must not bring it back.
        self.recently_removed: Recent = Recent()
        self._op_done = trio.Event()
        # Keys whose delete is being sent now (drain.uploads.storeops): too late for a claim.
        self.deleting: set[str] = set()

    def note_stored(self, key: str) -> None:
        self.recently_stored.note(key, time.monotonic())
        self.recently_removed.pop(key, None)

    def note_removed(self, key: str) -> None:
        """``key`` is deleted now; so, perhaps, are the prefixes ("a/", "a/b/") above it."""
        now = time.monotonic()
        self.recently_removed.note(key, now)
        parts = key.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.recently_removed.note("/".join(parts[:i]) + "/", now)

    def removed_since(self, key: str, started: float) -> bool:
        """Whether this gateway deleted ``key`` (an object, or a prefix ending in "/") after
        a listing that started at ``started`` (monotonic) began: the listing may show it."""
        return self.recently_removed.get(key, -1.0) >= started - 1.0

    # -- journaled store operations ------------------------------------------------------------

    def held(self, key: str) -> bool:
        """Whether an entry holds ``key``: its content is (or, after a pending move, will be)
        there, or it is the previous version that the entry's upload replaces. Such a key is
        never deleted."""
        return self.journal.stored_at(key) is not None

    def replaced(self, key: str) -> bool:
        """Whether ``key`` is held only as the previous version of an entry whose new version
        has not replaced it yet (a dirty or uploading row's): the entry's, not what a store
        operation or retention planned before it took the name."""
        row = self.journal.stored_at(key)  # a clean or remote holder comes first
        return row is not None and self.table.current(row).state in (
            State.DIRTY,
            State.UPLOADING,
        )

    def done(self, *ops: StoreOp, kept: frozenset[str] = frozenset()) -> None:
        """Store operations are carried out: forget them (one transaction), and wake whoever
        waits for their keys. ``kept``: keys they were to delete that an entry held by then,
        so they were left in place."""
        with self.journal.transaction():
            for op in ops:
                self.journal.done_store_op(op.id)
        for op in ops:
            if op.kind == "meta":
                self.note_stored(op.src)
            elif op.src not in kept:
                self.note_removed(op.src)
            if op.dst is not None:
                self.note_stored(op.dst)
        self._op_done.set()
        self._op_done = trio.Event()
        self.states.changes.bump()  # a file that waited for its move is durable now

    async def settled(self, key: str, timeout: float) -> None:
        """Return once no pending store operation touches ``key`` (or after ``timeout``)."""
        with trio.move_on_after(timeout):
            while key in self.journal.pending_keys():
                await self._op_done.wait()

    def key(self, components: list[bytes]) -> str:
        return self.prefix + "/".join(c.decode() for c in components)

    def key_of(self, inode: int) -> str:
        """The key of the entry's path (a directory's: the prefix of what is below it,
        without the final "/")."""
        return self.key(self.journal.path_components(inode))

    def entry_key(self, row: InodeRow) -> str:
        """The key of the entry's own object: its path, and a directory's marker ends in "/"."""
        return object_key(self.key_of(row.id), row.mode)

    def _row(self, inode: int) -> InodeRow | None:
        mem = self.table.peek(inode)
        return mem if mem is not None else self.journal.get(inode)

    def _delete(self, key: str, inode: int, etag: str | None = None) -> None:
        """Journal the delete of ``key``, unless another file's content is (or, with a move
        pending, will be) there: a rename put that file in this one's old place. An entry
        that takes the name before the delete is sent claims the object instead."""
        if self.journal.stored_at(key, other_than=inode) is None:
            self.journal.add_store_op("delete", key, None, etag)
            self.events.store_ops_added()

    def new_key(self, parent: int, name: bytes, mode: int) -> str:
        """The key of an entry named ``name`` in directory ``parent``, from the directory's
        path (remembered: a save creates many files in one), not a walk up from the entry."""
        return object_key(self.key([*self.journal.path_components(parent), name]), mode)

    def claim(self, row: InodeRow, key: str) -> None:
        """``row`` has just taken its name (a create, a rename), whose key is ``key``: keep
        what the store holds there for the entry that had the name before, until ``row``
        replaces it.

        A pending delete of the key is dropped, unless it is being sent; a pending move away
        from the key leaves it in place (:mod:`drain.uploads.storeops` deletes no key an entry
        holds). A clean or remote entry replaces the object by its own move to the key; an
        entry not uploaded yet records it as its previous version, which its upload
        overwrites (and a rename or unlink before then deletes)."""
        if row.parent is None:
            return
        if row.state in (State.CLEAN, State.REMOTE) and row.stored_key != key:
            return  # it writes nothing there (a directory without a marker)
        if key in self.deleting:
            return  # too late: its delete is on its way
        # Only an object known to be there (its ETag journaled: a stored entry's) is kept; a
        # delete of what an upload may have left (no ETag) goes on: nothing durable is there,
        # and this entry's upload waits for it.
        ops = [op for op in self.journal.store_ops_from(key) if op.etag is not None]
        if not ops:
            return
        for op in ops:
            if op.kind == "delete":
                self.journal.done_store_op(op.id)
        if (
            row.state in (State.DIRTY, State.UPLOADING)
            and row.stored_key != key
            and self.journal.stored_at(key, other_than=row.id) is None
        ):
            self.states.stored_previous(row, key, ops[-1].etag)
        self.events.store_ops_added()  # an upload that waited for the key may start

    def moved(self, inode: int, new_path: str) -> None:
        """The entry's path is ``new_path`` (a key) now."""
        row = self._row(inode)
        if row is None:
            return
        key = object_key(new_path, row.mode)
        self._move_stored(row, key)
        self.claim(self._row(inode) or row, key)

    def _move_stored(self, row: InodeRow, new_key: str) -> None:
        """What the store holds of ``row`` follows it to ``new_key``."""
        if not row.stored_key or row.stored_key == new_key:
            return
        if row.state is State.UPLOADING:
            record = self.journal.get_upload(row.id)
            if record is None or record.key == row.stored_key:
                return  # the upload overwrites that object, then moves it to new_key
        if row.state in (State.CLEAN, State.REMOTE):
            old = row.stored_key
            self.journal.add_store_op("move", old, new_key, row.stored_etag)
            self.states.stored_moved(row, new_key)
            if self.journal.has_store_op("meta", old):
                # A metadata update of the old key is pending: the move copies the object
                # as it is, so the update follows it to the new key.
                self.journal.add_store_op("meta", new_key)
            self.events.store_ops_added()
        else:
            self._delete(row.stored_key, row.id, row.stored_etag)
            self.states.stored_dropped(row)

    def moved_tree(self, directory: int, new_dir_key: str) -> None:
        """Everything below a directory whose path is ``new_dir_key`` now."""
        for inode, rel in self.journal.subtree(directory):
            self.moved(inode, f"{new_dir_key}/{rel}")

    def step_aside(self, ino: InodeRow) -> None:
        """Move what the store holds of ``ino`` (a directory: and below it) to a temporary
        key, from which its next :meth:`moved` takes it to its place."""
        aside = f"{self.prefix}.ckptgw-exchange/{uuid.uuid4().hex}"
        if stat.S_ISDIR(ino.mode):
            self.moved_tree(ino.id, aside)
        self.moved(ino.id, aside)

    def metadata_changed(self, row: InodeRow) -> None:
        """What the store holds of a clean or remote entry is current but its metadata is
        not: journal an in-place copy with the metadata it has when the copy runs."""
        if row.stored_key:
            self.journal.add_store_op("meta", row.stored_key, None, row.stored_etag)
            self.events.store_ops_added()

    def unlinked(self, ino: Inode) -> None:
        """Call before the name goes (the row may go with it). Cancels an upload of it in any
        phase, so that its cache file (and the disk space) is let go of at once."""
        self.events.changed(ino.id)
        doomed = set()
        if ino.state is State.UPLOADING:
            record = self.journal.get_upload(ino.id)
            if record is not None:
                # What the upload sent may land: delete it, in order before any later change
                # of that key (a rename over it journals a move to it after this).
                doomed.add(record.key)
        stored, etag = ino.stored_key, ino.stored_etag
        if stored:
            doomed.add(stored)
            self.states.stored_dropped(ino)
        for key in sorted(doomed):
            self._delete(key, ino.id, etag if key == stored else None)

    def sent_stale(self, ino: Inode, key: str, etag: str | None) -> None:
        """An upload of ``ino`` to ``key`` (its key when the upload began) ended without making
        it clean, and may have left an object there: of older content, or (cancelled) of
        nothing we know. Under the file's current name it is overwritten by the next upload
        (recorded, so a rename or unlink before then deletes it). Elsewhere it is deleted,
        unless another file has been moved to that key since. An unlinked file's upload key
        was doomed by :meth:`unlinked` already."""
        if ino.parent is None:
            return
        if key == self.entry_key(ino):
            if ino.stored_key is None:
                self.states.stored_stale(ino, key, etag)
            return
        self._delete(key, ino.id, etag)
        if ino.stored_key == key:
            self.states.stored_dropped(ino)


def object_key(path_key: str, mode: int) -> str:
    return path_key + "/" if stat.S_ISDIR(mode) else path_key


class Recent(collections.OrderedDict[str, float]):
    """Keys and when they were last noted (monotonic), for ``RECENT`` seconds. Kept in the
    order they were noted, so forgetting the old ones looks at those only: O(1) amortized
    per key. (Rebuilding the whole map at each note once it held 10,000 keys made a drain
    of 10,000 files quadratic: each upload copied every key stored in the last 10 minutes.)"""

    def note(self, key: str, now: float) -> None:
        self[key] = now
        self.move_to_end(key)
        while self:
            oldest, then = next(iter(self.items()))
            if now - then < RECENT:
                break
            del self[oldest]

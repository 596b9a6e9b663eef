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
  S); unlinked, delete S.
"""

from __future__ import annotations

import time

import trio

from fsops.events import DrainEvents
from fsops.inodes import Inode, InodeTable
from fsops.journal import InodeRow, State, StoreOp
from fsops.state import FileStates

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
        self.recently_stored: dict[str, float] = {}
        # Keys this gateway deleted lately (monotonic time the delete completed): a listing
        # that started before then may still show the object, which must not bring it back.
        self.recently_removed: dict[str, float] = {}
        self._op_done = trio.Event()

    def note_stored(self, key: str) -> None:
        self.recently_stored[key] = time.monotonic()
        self.recently_removed.pop(key, None)
        self.recently_stored = _trimmed(self.recently_stored)

    def note_removed(self, key: str) -> None:
        """``key`` is deleted now; so, perhaps, are the prefixes ("a/", "a/b/") above it."""
        now = time.monotonic()
        self.recently_removed[key] = now
        parts = key.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.recently_removed["/".join(parts[:i]) + "/"] = now
        self.recently_removed = _trimmed(self.recently_removed)

    def removed_since(self, key: str, started: float) -> bool:
        """Whether this gateway deleted ``key`` (an object, or a prefix ending in "/") after
        a listing that started at ``started`` (monotonic) began: the listing may show it."""
        return self.recently_removed.get(key, -1.0) >= started - 1.0

    # -- journaled store operations ------------------------------------------------------------

    def done(self, op: StoreOp) -> None:
        """A store operation is carried out: forget it, and wake whoever waits for its keys."""
        with self.journal.transaction():
            self.journal.done_store_op(op.id)
        self.note_removed(op.src)
        if op.dst is not None:
            self.note_stored(op.dst)
        self._op_done.set()
        self._op_done = trio.Event()

    async def settled(self, key: str, timeout: float) -> None:
        """Return once no pending store operation touches ``key`` (or after ``timeout``)."""
        with trio.move_on_after(timeout):
            while key in self.journal.pending_keys():
                await self._op_done.wait()

    def key(self, components: list[bytes]) -> str:
        return self.prefix + "/".join(c.decode() for c in components)

    def key_of(self, inode: int) -> str:
        return self.key(self.journal.path_components(inode))

    def _row(self, inode: int) -> InodeRow | None:
        mem = self.table.peek(inode)
        return mem if mem is not None else self.journal.get(inode)

    def moved(self, inode: int, new_key: str) -> None:
        row = self._row(inode)
        if row is None or not row.stored_key or row.stored_key == new_key:
            return  # nothing stored (an upload in progress moves its own object when done)
        if row.state in (State.CLEAN, State.REMOTE):
            self.journal.add_store_op("move", row.stored_key, new_key, row.stored_etag)
            self.states.stored_moved(row, new_key)
        else:
            self.journal.add_store_op("delete", row.stored_key)
            self.states.stored_dropped(row)
        self.events.store_ops_added()

    def moved_tree(self, directory: int, new_dir_key: str) -> None:
        for inode, rel in self.journal.subtree(directory):
            self.moved(inode, f"{new_dir_key}/{rel}")

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
        if ino.stored_key:
            doomed.add(ino.stored_key)
            self.states.stored_dropped(ino)
        for key in sorted(doomed):
            self.journal.add_store_op("delete", key)
        if doomed:
            self.events.store_ops_added()


def _trimmed(recent: dict[str, float]) -> dict[str, float]:
    if len(recent) <= 10_000:
        return recent
    now = time.monotonic()
    return {k: t for k, t in recent.items() if now - t < RECENT}

"""What namespace changes mean for objects already in the store (rules in ARCHITECTURE.md).

Called inside the namespace operation's journal transaction, so the store operation it
implies commits with the change itself and is resumed after a crash:

| state of the file | renamed to key K | unlinked / replaced |
|---|---|---|
| dirty, never stored | nothing (it will be uploaded to K) | nothing |
| dirty, an older version stored at S | delete S | delete S |
| uploading | nothing now; the upload moves its object to K when done | upload cancelled |
| clean (or remote), stored at S | move S -> K (server-side copy, then delete S) | delete S |
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fsops.inodes import Inode, InodeTable
from fsops.journal import InodeRow, State


class StoreKeys:
    def __init__(self, table: InodeTable, prefix: str) -> None:
        self.table = table
        self.journal = table.journal
        self.prefix = prefix
        # Set by the drain engine: wake up (new store ops) / an inode's content or name changed.
        self.wake: Callable[[], None] = lambda: None
        self.changed: Callable[[int], None] = lambda inode: None
        # Keys this gateway wrote lately (monotonic time): a listing that started before an
        # object landed does not show it, which must not read as "someone deleted it".
        self.recently_stored: dict[str, float] = {}

    def note_stored(self, key: str) -> None:
        now = time.monotonic()
        self.recently_stored[key] = now
        if len(self.recently_stored) > 10_000:
            self.recently_stored = {k: t for k, t in self.recently_stored.items() if now - t < 600}

    def key(self, components: list[bytes]) -> str:
        return self.prefix + "/".join(c.decode() for c in components)

    def key_of(self, inode: int) -> str:
        return self.key(self.journal.path_components(inode))

    def _row(self, inode: int) -> InodeRow | None:
        mem = self.table.peek(inode)
        return mem if mem is not None else self.journal.get(inode)

    def _save(self, row: InodeRow) -> None:
        if isinstance(row, Inode):
            self.table.persist(row)
        else:
            self.journal.update_attrs(row)

    def moved(self, inode: int, new_key: str) -> None:
        row = self._row(inode)
        if row is None or not row.stored_key or row.state is State.UPLOADING:
            return  # an upload in progress moves its own object when it completes
        if row.stored_key == new_key:
            return
        if row.state in (State.CLEAN, State.REMOTE):
            self.journal.add_store_op("move", row.stored_key, new_key, row.stored_etag)
            row.stored_key = new_key
        else:
            self.journal.add_store_op("delete", row.stored_key)
            row.stored_key = row.stored_etag = None
        self._save(row)
        self.wake()

    def moved_tree(self, directory: int, new_dir_key: str) -> None:
        for inode, rel in self.journal.subtree(directory):
            self.moved(inode, f"{new_dir_key}/{rel}")

    def unlinked(self, ino: Inode) -> None:
        """Call before the name goes (the row may go with it). Cancels an upload of it in any
        phase, so that its cache file (and the disk space) is let go of at once."""
        self.changed(ino.id)
        if ino.stored_key:
            self.journal.add_store_op("delete", ino.stored_key)
            ino.stored_key = ino.stored_etag = None
            self._save(ino)
            self.wake()

"""The per-entry state machine: every change of an entry's drain state, in one place.

Every entry below the root has a state, whatever its kind: a regular file's object holds its
content, a directory's marker object, a symlink's or special file's object what it is (see
:mod:`fsops.objectmeta`). Only regular files have content in the cache, so only they are
evicted or fetched. An entry's journal row has *state columns*: ``state`` and
``generation``, and where the store holds its content (``stored_key``, ``stored_etag``,
``checksum``). They change in this module and nowhere else (:meth:`Journal.set_state` is
called from here only, and :meth:`Journal.update_attrs` cannot write them; a test checks
both). Every method checks the state it starts from against :data:`TRANSITIONS`. A change
from any other state is a bug: it is logged as an error and refused with
:class:`StateError`, never carried out silently.

Every method takes the journal row or the in-memory inode and always changes the in-memory
inode when there is one (so the two never disagree), and commits its change; called inside
a journal transaction it joins that transaction.

ARCHITECTURE.md's diagram is generated from :data:`TRANSITIONS` (``python -m ckptgw.fsops.state``)
and a test checks that the two agree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from ckptgw.fsops.events import DrainEvents
from ckptgw.fsops.inodes import Inode, InodeTable
from ckptgw.fsops.journal.rows import InodeRow, State
from ckptgw.fsops.signal import Signal

log = logging.getLogger(__name__)


class StateError(Exception):
    """A transition was asked of a file in a state it does not start from: a bug."""


@dataclass(frozen=True)
class Transition:
    method: str  # the FileStates method that makes it
    src: State | None  # None: the row is created in ``dst``
    dst: State
    when: str


DIRTY, UPLOADING, CLEAN, REMOTE = State.DIRTY, State.UPLOADING, State.CLEAN, State.REMOTE

TRANSITIONS: tuple[Transition, ...] = (
    Transition("insert_local", None, DIRTY, "create, mknod, mkdir, symlink"),
    Transition("insert_listed", None, REMOTE, "a listing shows an object this node lacks"),
    Transition(
        "mark_dirty", CLEAN, DIRTY, "write, truncate, open with O_TRUNC or (passthrough) to write"
    ),
    Transition("mark_dirty", REMOTE, DIRTY, "open with O_TRUNC"),
    Transition(
        "mark_dirty",
        UPLOADING,
        DIRTY,
        "write, truncate, chmod etc. or (passthrough) open to write, during the upload",
    ),
    Transition("begin_upload", DIRTY, UPLOADING, "the drain takes it: no writer, settled"),
    Transition("finish_upload", UPLOADING, CLEAN, "object complete, same generation and size"),
    Transition(
        "marker_implied",
        UPLOADING,
        CLEAN,
        "a directory that a listing shows as it is: no marker, no request",
    ),
    Transition("abandon_upload", UPLOADING, DIRTY, "upload failed, cancelled, or restart"),
    Transition("evict", CLEAN, REMOTE, "cache full: least recently opened first"),
    Transition("fetched", REMOTE, CLEAN, "read-through: fetched whole and verified"),
    Transition("lost", CLEAN, DIRTY, "its object vanished before a move: upload again"),
    Transition("cache_file_missing", CLEAN, REMOTE, "recovery after a crash"),
    Transition(
        "marker_needed",
        CLEAN,
        DIRTY,
        "a marker-less directory emptied here, or its chmod, chown, setxattr",
    ),
    Transition("marker_needed", REMOTE, DIRTY, "the same, another node's"),
    Transition("rebind", DIRTY, DIRTY, "`ckptgw cache rebind`: the new store holds nothing yet"),
    Transition("rebind", CLEAN, DIRTY, "`ckptgw cache rebind`: upload again, to the new store"),
    Transition("rebind", REMOTE, DIRTY, "`ckptgw cache rebind` of a directory with entries here"),
)

_ALLOWED: dict[str, set[State | None]] = {}
for _t in TRANSITIONS:
    _ALLOWED.setdefault(_t.method, set()).add(_t.src)


def mermaid() -> str:
    """The state diagram, as ARCHITECTURE.md shows it."""
    lines = ["```mermaid", "stateDiagram-v2"]
    for t in TRANSITIONS:
        src = "[*]" if t.src is None else t.src.value
        lines.append(f"    {src} --> {t.dst.value}: {t.method}")
    lines.append("```")
    return "\n".join(lines)


def table() -> str:
    """The transitions as a Markdown table, as ARCHITECTURE.md shows it."""
    lines = ["| from | to | method | when |", "|---|---|---|---|"]
    for t in TRANSITIONS:
        src = "(new)" if t.src is None else f"`{t.src.value}`"
        lines.append(f"| {src} | `{t.dst.value}` | `{t.method}` | {t.when} |")
    return "\n".join(lines)


class FileStates:
    def __init__(self, table: InodeTable, events: DrainEvents, room: Signal) -> None:
        self.table = table
        self.journal = table.journal
        self.events = events
        self.room = room
        # Changes of what is durable so far (every state transition, and every batch of store
        # operations done, since a file can wait for its move): what lets a client wait until
        # entries are durable without asking again and again.
        self.changes = Signal()

    def _current(self, row: InodeRow) -> InodeRow:
        return self.table.current(row)

    def _check(self, method: str, row: InodeRow) -> None:
        if row.state not in _ALLOWED[method]:
            raise self._refuse(method, row)

    def _write(self, row: InodeRow) -> None:
        with self.journal.transaction():
            self.journal.set_state(row)
        self.changes.fire()  # inside an outer transaction that rolls back: a wake-up for nothing

    # -- rows that start in a state ------------------------------------------------------------

    def insert_local(self, row: InodeRow) -> int:
        """A new file made here: dirty, generation 1, stored nowhere. Returns its number."""
        row.state, row.generation = DIRTY, 1
        row.stored_key = row.stored_etag = row.checksum = None
        row.id = self.journal.insert(row)
        return row.id

    def insert_listed(self, row: InodeRow, key: str | None, etag: str | None) -> int:
        """An entry only the store has (another node drained it). Returns its number. A
        directory may have no marker object (``key`` None): only objects below it."""
        row.state, row.generation = REMOTE, 1
        row.stored_key, row.stored_etag, row.checksum = key, etag, None
        row.id = self.journal.insert(row)
        return row.id

    # -- content -----------------------------------------------------------------------------

    async def mark_dirty(self, ino: Inode) -> None:
        """Make a content change safe to start: before the cache file differs from what the
        store has (or what an upload is reading), the journal durably says dirty with a new
        generation, and an upload under way is told to stop. A dirty file stays as it is."""
        while ino.dirtying is not None:
            await ino.dirtying.wait()
        if ino.state is DIRTY:
            return
        self._check("mark_dirty", ino)
        ino.dirtying = trio.Event()
        try:
            ino.state = DIRTY
            ino.generation += 1
            self._write(ino)
            # After the new generation is set: an upload that checks it from now on sees it.
            self.events.changed(ino.id)
            await self.journal.barrier()
        finally:
            ino.dirtying.set()
            ino.dirtying = None

    def quiet(self, ino: Inode) -> None:
        """Nobody writes the file now: a dirty one may be drained after the settle delay."""
        if ino.parent is not None and ino.state is DIRTY:
            self.events.written(ino.id)

    # -- the drain -----------------------------------------------------------------------------

    def begin_upload(self, ino: Inode) -> int:
        """The drain takes a settled dirty file: from now on any change of its content goes
        through :meth:`mark_dirty`, which stops the upload. Returns the generation taken."""
        self._check("begin_upload", ino)
        ino.state = UPLOADING
        self._write(ino)
        return ino.generation

    def finish_upload(
        self, ino: Inode, generation: int, size: int, key: str, etag: str, checksum: str | None
    ) -> bool:
        """The object for ``generation`` is complete at ``key``. The file becomes clean if it
        is still ``uploading`` that generation and size; returns whether it did. A file
        written meanwhile (dirty already) stays as it is; a size that is not the one uploaded
        is a bug (logged; the file goes again); any other state is refused."""
        if ino.state is DIRTY:
            return False  # written during the upload (mark_dirty)
        self._check("finish_upload", ino)
        if ino.generation != generation:
            raise self._refuse("finish_upload", ino)  # uploading another generation: a bug
        if ino.size != size:
            msg = (
                f"bug: inode {ino.id} is {ino.size} bytes, its upload of generation "
                f"{generation} has {size}; it stays dirty and goes again"
            )
            log.error("%s", msg)
            self.abandon_upload(ino)
            return False
        ino.state = CLEAN
        ino.stored_key, ino.stored_etag, ino.checksum = key, etag, checksum
        self._write(ino)
        self.room.fire()  # evictable now: a writer waiting for room may go on
        return True

    def marker_implied(self, ino: Inode, generation: int) -> bool:
        """The drain took a directory that needs no marker object: a listing shows it as it
        is without one (it holds an entry, and has the mode and owner a listing gives such a
        directory: :func:`fsops.namespace.needs_no_marker`). It becomes clean, stored
        nowhere, without a request; returns whether it did (a directory changed meanwhile
        stays dirty). Once a listing would show it otherwise, :meth:`marker_needed` makes it
        dirty again. A directory whose key holds an object of ours is never one (a bug)."""
        if ino.state is DIRTY:
            return False
        self._check("marker_implied", ino)
        if ino.generation != generation or ino.stored_key:
            raise self._refuse("marker_implied", ino)
        ino.state = CLEAN
        ino.stored_key = ino.stored_etag = ino.checksum = None
        self._write(ino)
        return True

    def abandon_upload(self, row: InodeRow) -> None:
        """An upload ended without making the file clean: it is dirty again, same generation
        (the content did not change). A file already dirty (changed meanwhile) is left."""
        row = self._current(row)
        if row.state is DIRTY:
            return
        self._check("abandon_upload", row)
        row.state = DIRTY
        self._write(row)

    def lost(self, row: InodeRow) -> None:
        """The object of a clean file vanished from the store before a move reached it: the
        cache has the content, so the file is dirty again and will be uploaded."""
        row = self._current(row)
        self._check("lost", row)
        row.state, row.stored_key, row.stored_etag = DIRTY, None, None
        row.generation += 1
        self._write(row)

    def marker_needed(self, row: InodeRow) -> None:
        """A directory without a marker object (clean, or another node's) that a listing
        would no longer show as it is: emptied here (its last entry unlinked or renamed
        away), or given a mode, owner or extended attribute a listing cannot show. It is
        dirty with a new generation, and the drain PUTs its marker. Called in the
        transaction of the change that made it needed: a crash cannot keep one without the
        other. A directory that has a marker is never one (a bug)."""
        row = self._current(row)
        self._check("marker_needed", row)
        if row.stored_key:
            raise self._refuse("marker_needed", row)
        row.state, row.generation = DIRTY, row.generation + 1
        self._write(row)
        if row.parent is not None:
            self.events.written(row.id)  # nobody writes a directory: due once settled

    # -- the cache as a bounded tier -------------------------------------------------------------

    def evict(self, row: InodeRow) -> None:
        """Commit that a clean file is only in the store; the caller then removes the cache
        file (a crash in between leaves a stray file, which recovery removes)."""
        row = self._current(row)
        self._check("evict", row)
        row.state = REMOTE
        self._write(row)
        if isinstance(row, Inode):
            row.charged = 0

    def fetched(self, ino: Inode, checksum: str) -> None:
        """A remote file's content is in the cache, whole and verified."""
        self._check("fetched", ino)
        ino.state, ino.checksum = CLEAN, checksum
        ino.charged = ino.size
        self._write(ino)
        self.room.fire()

    def cache_file_missing(self, row: InodeRow) -> None:
        """Recovery found no cache file for a clean file: the store still has it."""
        self._check("cache_file_missing", row)
        row.state = REMOTE
        self._write(row)

    def rebind(self, row: InodeRow) -> None:
        """The cache is bound to another store (``ckptgw cache rebind``, never while mounted),
        which holds none of it: the entry is dirty with a new generation and stored nowhere,
        so the next mount uploads it there. An upload in progress was abandoned at recovery."""
        row = self._current(row)
        self._check("rebind", row)
        row.state, row.generation = DIRTY, row.generation + 1
        row.stored_key = row.stored_etag = row.checksum = None
        self._write(row)

    # -- where the store holds the content (no change of state) ---------------------------------

    def stored_moved(self, row: InodeRow, key: str) -> None:
        """A journaled move takes the object of a clean or remote file to ``key``."""
        row = self._current(row)
        if row.state not in (CLEAN, REMOTE):
            raise self._refuse("stored_moved", row)
        row.stored_key = key
        self._write(row)

    def stored_dropped(self, row: InodeRow) -> None:
        """The object at ``stored_key`` is (to be) deleted: nothing holds this content now."""
        row = self._current(row)
        row.stored_key = row.stored_etag = None
        self._write(row)

    def stored_stale(self, ino: Inode, key: str, etag: str | None) -> None:
        """An upload ended after the file changed: the object at ``key`` (its path) may hold
        an older generation. Recorded so that a rename or unlink deletes it."""
        if ino.state is not DIRTY:
            raise self._refuse("stored_stale", ino)
        ino.stored_key, ino.stored_etag = key, etag
        self._write(ino)

    def stored_previous(self, row: InodeRow, key: str, etag: str | None) -> None:
        """The entry took a name under which the store still holds another entry's object (a
        file it replaced, or one unlinked just before it was created): that object is kept
        as this entry's previous version, which its upload replaces (a rename or unlink
        first deletes it, as any older version). So the name is never missing from the store
        while the new version drains."""
        row = self._current(row)
        if row.state not in (DIRTY, UPLOADING):
            raise self._refuse("stored_previous", row)
        row.stored_key, row.stored_etag = key, etag
        self._write(row)

    def etag_changed(self, row: InodeRow, etag: str) -> None:
        """A server-side copy gave our object a new ETag."""
        row = self._current(row)
        row.stored_etag = etag
        self._write(row)

    def remote_checked(
        self, row: InodeRow, checksum: str | None, key: str | None, etag: str | None
    ) -> None:
        """The object of a remote entry was read: its checksum (a file), or whether there is a
        marker (a directory: ``key`` None if not)."""
        row = self._current(row)
        if row.state is not REMOTE:
            raise self._refuse("remote_checked", row)
        row.checksum, row.stored_key, row.stored_etag = checksum, key, etag
        self._write(row)

    def _refuse(self, method: str, row: InodeRow) -> StateError:
        msg = f"bug: {method} of inode {row.id} in state {row.state.value} refused"
        log.error("%s", msg)
        return StateError(msg)


if __name__ == "__main__":
    print(mermaid())
    print()
    print(table())

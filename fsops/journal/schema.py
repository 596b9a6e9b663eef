"""The journal's schema: its tables (``create_tables``, every column commented), the version
that :mod:`.connection` migrates to, the indexes added to older journals at open, and the
pieces of SQL the query sets share (the inode columns, what "directory", "regular file", "not
durable" and "named" are in SQL)."""

from __future__ import annotations

import sqlite3
import stat

from ckptgw.fsops.journal.rows import InodeRow, State

SCHEMA_VERSION = 4

INODE_COLS = (
    "id, parent, name, mode, uid, gid, size, atime_ns, mtime_ns, ctime_ns, target, state, "
    "generation, stored_key, stored_etag, checksum, rdev, epoch"
)


IS_DIR = f"(mode & {stat.S_IFMT(0xFFFFFFFF)}) = {stat.S_IFDIR}"
IS_REG = f"(mode & {stat.S_IFMT(0xFFFFFFFF)}) = {stat.S_IFREG}"
# A directory's link count (2 + its subdirectories) is asked with every reply about it: this
# index answers it without walking the directory's files (added to older journals at open).
SUBDIRS_INDEX = f"CREATE INDEX IF NOT EXISTS inodes_subdirs ON inodes (parent) WHERE {IS_DIR}"
# An entry that takes a name looks for pending operations on its key (StoreKeys.claim): a
# create in the middle of an `rm -rf` of thousands of files must not scan them all.
STORE_OPS_INDEX = "CREATE INDEX IF NOT EXISTS store_ops_by_src ON store_ops (src)"
# The entries not in the store yet (dirty_files: the drain's audit, flush, the emergency
# drain's end) are read without a scan of every entry the journal holds.
NOT_DURABLE = f"state IN ('{State.DIRTY.value}', '{State.UPLOADING.value}')"
# "Named" (not the root, not an orphan) without the index on parent: a scan of it from the
# first parent on would cost a read of every entry (the planner, without statistics, takes it
# over the small index on entries not durable).
NAMED = "+parent IS NOT NULL"
NOT_DURABLE_INDEX = (
    f"CREATE INDEX IF NOT EXISTS inodes_not_durable ON inodes (id) WHERE {NOT_DURABLE}"
)


def inode_row(r: tuple[object, ...]) -> InodeRow:
    row = InodeRow(*r)  # type: ignore[arg-type]
    row.state = State(row.state)
    return row


def create_tables(db: sqlite3.Connection) -> None:
    """Create the schema. Sentinels: ``parent IS NULL`` marks the root (id 1) and inodes that
    were unlinked while still open or looked up (orphans, freed in ``forget`` or at the next
    mount); ``target`` is only set for symlinks."""
    statement = ""
    for line in _SCHEMA.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            db.execute(statement)
            statement = ""


_SCHEMA = """
        -- Key/value facts about this cache: schema_version, store_url, clean_shutdown (0/1),
        -- epoch (mounts so far: see Journal.begin_epoch).
        CREATE TABLE meta (
            key   TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );

        -- One row per inode: every kind of entry (regular file, directory, symlink, FIFO,
        -- socket, device). Hard links are not supported (EPERM), so every inode has at most
        -- one name and the namespace lives in the same row: (parent, name).
        CREATE TABLE inodes (
            id         INTEGER PRIMARY KEY,   -- FUSE inode number; 1 is the root
            parent     INTEGER,               -- NULL: root or orphan (see above)
            name       BLOB,                  -- one path component, bytes as given by the kernel
            mode       INTEGER NOT NULL,      -- st_mode including the file type bits
            uid        INTEGER NOT NULL,
            gid        INTEGER NOT NULL,
            size       INTEGER NOT NULL DEFAULT 0,
            atime_ns   INTEGER NOT NULL,
            mtime_ns   INTEGER NOT NULL,
            ctime_ns   INTEGER NOT NULL,
            target     BLOB,                  -- symlink target, NULL otherwise
            state      TEXT NOT NULL,         -- dirty | uploading | clean | remote (State)
            generation INTEGER NOT NULL DEFAULT 1, -- bumped on every transition into dirty
            stored_key  TEXT,                 -- where the store holds this inode's content
            stored_etag TEXT,                 --   (NULL: nowhere; see ARCHITECTURE.md)
            checksum   TEXT,                  -- of the content at stored_key (fsops.contentsum)
            rdev       INTEGER NOT NULL DEFAULT 0, -- device number (character, block devices)
            epoch      INTEGER NOT NULL DEFAULT 0, -- mount epoch that gave out `id` (see InodeRow)
            UNIQUE (parent, name)
        );
        -- readdir walks a directory in inode-number order: offsets stay stable while entries
        -- are added or removed, and a rename never moves an entry within its directory.
        CREATE INDEX inodes_by_parent ON inodes (parent, id);
        CREATE INDEX inodes_by_stored_key ON inodes (stored_key) WHERE stored_key IS NOT NULL;

        -- One row per upload in progress: what is being uploaded, so that a restart
        -- resumes it (same generation) or aborts it (anything changed).
        CREATE TABLE uploads (
            inode      INTEGER PRIMARY KEY,
            generation INTEGER NOT NULL,      -- the content generation being uploaded
            key        TEXT NOT NULL,         -- the object key it goes to
            upload_id  TEXT,                  -- multipart upload id; NULL for a single PUT
            part_size  INTEGER NOT NULL,
            size       INTEGER NOT NULL,
            checksum   TEXT NOT NULL          -- a single PUT's xxh3-128; "crc32:<part size>"
        );

        -- Finished parts of multipart uploads.
        CREATE TABLE parts (
            inode  INTEGER NOT NULL,
            number INTEGER NOT NULL,
            etag   TEXT NOT NULL,
            crc32  INTEGER,               -- of the bytes sent (NULL: journaled by version 3)
            PRIMARY KEY (inode, number)
        ) WITHOUT ROWID;

        -- Store operations a namespace change implies, committed with it and done in id order:
        -- 'move' (server-side copy src -> dst, then delete src unless an entry holds src by
        -- then), 'delete' (src, unless an entry holds it by then; an entry that takes the
        -- name before the delete starts drops it: StoreKeys.claim) and 'meta' (src copied
        -- onto itself with the entry's metadata).
        CREATE TABLE store_ops (
            id     INTEGER PRIMARY KEY,
            kind   TEXT NOT NULL,            -- move | delete | meta
            src    TEXT NOT NULL,
            dst    TEXT,
            etag   TEXT                      -- src's etag when journaled (move, delete), if known
        );

        CREATE TABLE xattrs (
            inode INTEGER NOT NULL,
            name  BLOB NOT NULL,
            value BLOB NOT NULL,
            PRIMARY KEY (inode, name)
        ) WITHOUT ROWID;
"""

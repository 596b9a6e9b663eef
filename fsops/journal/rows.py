"""The rows the journal gives back and takes: plain data, no SQL. What the rest of the code
imports to speak of an inode, its state, an upload in progress or a pending store operation."""

from __future__ import annotations

import enum
import stat
from dataclasses import dataclass

ROOT_INODE = 1  # the root directory's inode number (FUSE's), made with the journal


class State(enum.StrEnum):
    """Per-file state; see ARCHITECTURE.md for the transitions and invariants."""

    DIRTY = "dirty"  # the cache holds content the store lacks
    UPLOADING = "uploading"  # an upload of `generation` is under way
    CLEAN = "clean"  # the object under the current path has this generation's content
    REMOTE = "remote"  # known from the store, not in the cache


@dataclass
class InodeRow:
    id: int
    parent: int | None
    name: bytes | None
    mode: int
    uid: int
    gid: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    target: bytes | None
    state: State
    generation: int
    stored_key: str | None = None
    stored_etag: str | None = None
    checksum: str | None = None
    rdev: int = 0
    # The mount epoch that gave this inode its number: the generation in its FUSE (and so
    # NFS) file handles. Numbers are never reused within an epoch, so (id, epoch) names one
    # inode for the life of the journal, and a handle of a deleted file is stale, never another.
    epoch: int = 0

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_reg(self) -> bool:
        return stat.S_ISREG(self.mode)


@dataclass
class UploadRow:
    inode: int
    generation: int
    key: str
    upload_id: str | None
    part_size: int
    size: int
    checksum: str


@dataclass
class StoreOp:
    id: int
    kind: str
    src: str
    dst: str | None
    etag: str | None

"""How an entry is written into its object's metadata, and read back on another node.

Every entry below the root has an object under its path: a regular file's holds its content,
a symlink's its target, a FIFO's, socket's or device's nothing, and a directory has a
zero-byte *marker* object whose key ends in "/" ("run/step_5/"). The object's user metadata
carries what a listing cannot: the kind of entry, the permission bits, owner, mtime, a
device's number, the ``user.*`` extended attributes and (regular files) the content checksum:
its xxh3-128 for a single PUT, or the size of the parts of a multipart upload, whose checksum
is then the store's CRC32 of its parts (:mod:`fsops.contentsum`).
An object without a ``type`` is a regular file, so files written by other tools read as such.

S3 limits user metadata to 2 KB. The fixed fields take about 150 bytes; the extended attributes
get :data:`XATTR_BUDGET` bytes once encoded, and a ``setxattr`` beyond it is refused (ENOSPC)
rather than kept on this node only.
"""

from __future__ import annotations

import base64
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from ckptgw.fsops.contentsum import part_size_of
from ckptgw.fsops.journal.rows import InodeRow

CHECKSUM = "xxh3-128"
PART_SIZE = "part-size"  # a multipart upload's: its checksum is the store's CRC32 of its parts
XATTR_BUDGET = 1536
#: Objects up to this size may be symlinks or special files (a symlink's target is at most
#: PATH_MAX - 1 bytes): a listing reads their metadata to learn what they are.
SMALL_OBJECT = 4096

_KINDS = {
    stat.S_IFDIR: "dir",
    stat.S_IFLNK: "symlink",
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "char",
    stat.S_IFBLK: "block",
}
_BY_NAME = {v: k for k, v in _KINDS.items()}


@dataclass
class EntryMeta:
    """What an object's metadata says; None: not said (an object from another tool)."""

    kind: int = stat.S_IFREG  # the S_IFMT bits
    mode: int | None = None  # permission bits (0o7777)
    uid: int | None = None
    gid: int | None = None
    mtime_ns: int | None = None
    rdev: int = 0
    xattrs: dict[bytes, bytes] = field(default_factory=dict)
    checksum: str | None = None  # xxh3-128 (the parts form needs the store's CRC32 too)
    part_size: int | None = None


# The one namespace of extended attributes kept (fsops.namespace): the others mean something
# to one node's kernel only, and one read from a foreign object's metadata is left out.
XATTR_NAMESPACE = b"user."


def encode_xattrs(xattrs: Iterable[tuple[bytes, bytes]]) -> str:
    """One metadata value: (name length, name, value length, value)... in base64url."""
    raw = b"".join(
        len(n).to_bytes(1, "big") + n + len(v).to_bytes(2, "big") + v for n, v in sorted(xattrs)
    )
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_xattrs(text: str) -> dict[bytes, bytes]:
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    out, pos = {}, 0
    while pos < len(raw):
        n = raw[pos]
        name = raw[pos + 1 : pos + 1 + n]
        pos += 1 + n
        size = int.from_bytes(raw[pos : pos + 2], "big")
        out[name] = raw[pos + 2 : pos + 2 + size]
        pos += 2 + size
        if len(name) != n or pos > len(raw):
            raise ValueError("truncated xattrs")
    return out


def xattrs_fit(xattrs: Iterable[tuple[bytes, bytes]]) -> bool:
    return len(encode_xattrs(xattrs)) <= XATTR_BUDGET


#: The fields :func:`encode` writes; an update replaces these and keeps any other tool's.
FIELDS = frozenset(
    {"mode", "uid", "gid", "mtime-ns", "type", "size", "rdev", "xattrs", CHECKSUM, PART_SIZE}
)
_CONTENT = (CHECKSUM, PART_SIZE)


def updated(existing: dict[str, str], ours: dict[str, str]) -> dict[str, str]:
    """``existing`` metadata with our fields replaced by ``ours`` (a checksum ``ours`` lacks
    is kept: the content did not change)."""
    out = {k: v for k, v in existing.items() if k not in FIELDS or k in _CONTENT}
    out.update(ours)
    return out


def encode(
    row: InodeRow,
    xattrs: Iterable[tuple[bytes, bytes]],
    *,
    size: int | None = None,
    checksum: str | None = None,
) -> dict[str, str]:
    """The metadata of a journal row's object (``size``: the size being uploaded, if not the
    row's)."""
    meta = {
        "mode": f"{row.mode & 0o7777:o}",
        "uid": str(row.uid),
        "gid": str(row.gid),
        "mtime-ns": str(row.mtime_ns),
    }
    kind = _KINDS.get(stat.S_IFMT(row.mode))
    if kind is not None:
        meta["type"] = kind
    else:
        meta["size"] = str(row.size if size is None else size)
    if stat.S_ISCHR(row.mode) or stat.S_ISBLK(row.mode):
        meta["rdev"] = str(row.rdev)
    pairs = list(xattrs)
    if pairs:
        meta["xattrs"] = encode_xattrs(pairs)
    part_size = part_size_of(checksum)
    if part_size is not None:
        meta[PART_SIZE] = str(part_size)
    elif checksum is not None:
        meta[CHECKSUM] = checksum
    return meta


def decode(metadata: dict[str, str]) -> EntryMeta:
    """Raises ValueError for metadata that is not ours and not absent (a corrupt field)."""
    m = EntryMeta(checksum=metadata.get(CHECKSUM))
    if PART_SIZE in metadata:
        m.part_size = int(metadata[PART_SIZE])
        if m.part_size <= 0:
            raise ValueError(f"part size {m.part_size}")
    kind = metadata.get("type")
    if kind is not None:
        if kind not in _BY_NAME:
            raise ValueError(f"unknown entry type {kind!r}")
        m.kind = _BY_NAME[kind]
    if "mode" in metadata:
        m.mode = int(metadata["mode"], 8) & 0o7777
    if "uid" in metadata:
        m.uid = int(metadata["uid"])
    if "gid" in metadata:
        m.gid = int(metadata["gid"])
    if "mtime-ns" in metadata:
        m.mtime_ns = int(metadata["mtime-ns"])
    if "rdev" in metadata:
        m.rdev = int(metadata["rdev"])
    if "xattrs" in metadata:
        pairs = decode_xattrs(metadata["xattrs"]).items()
        m.xattrs = {n: v for n, v in pairs if n.startswith(XATTR_NAMESPACE)}
    return m

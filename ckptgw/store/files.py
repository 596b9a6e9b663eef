"""``file:///PATH``: a directory as an object store (the embedded default, or a shared FS).

An object is a file at ``PATH/<key>``, written as temp file + fsync + rename + fsync of the
directory, so a reader never sees half an object. Metadata is kept in the ``user.ckptgw``
extended attribute (as JSON); a completed multipart upload's COMPOSITE CRC32, as S3 keeps one,
in ``user.ckptgw.crc32`` (computed as the parts are joined). Multipart uploads are staged
under ``PATH/.ckptgw-uploads/<id>/`` with one file per part, so resuming works as it does on
S3. All blocking I/O runs on worker threads.

A directory marker ``a/b/`` (a key ending in "/", see :class:`~ckptgw.store.interface.Store`) is the
empty file ``PATH/a/b/.ckptgw-dir``, its metadata in the same xattr; objects under ``a/b/``
live beside it. Names starting with ``.ckptgw-`` are the store's own: below the root they are
never keys (``_path`` refuses them) and never listed. At the root, ``.ckptgw-tmp``,
``.ckptgw-uploads`` and ``.ckptgw-dir`` are refused and never listed; other ``.ckptgw-`` keys
there (the gateway's pins, ``.ckptgw-pins/...``) are keys like any other, left out of
``list_dir`` (the mount never shows them) but listed by ``iter_objects``.

A key cannot be both an object and a directory here: with an object ``a/b``, a put of
``a/b/x`` or of the marker ``a/b/`` fails (permanent StoreError), which S3 would accept.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

import trio
import xxhash

from ckptgw.store.crc import composite, crc32, crc32_b64
from ckptgw.store.interface import (
    PIECE,
    Body,
    Described,
    Listing,
    NotFound,
    ObjectInfo,
    Progress,
    Stale,
    Store,
    StoreError,
    Upload,
    check_copy,
    is_marker,
    marker_error,
    short_read,
)
from ckptgw.store.url import StoreURL

T = TypeVar("T")
_INTERNAL = ".ckptgw-"
_MARKER = f"{_INTERNAL}dir"  # the file of a directory marker, in its directory
_PRIVATE = {f"{_INTERNAL}tmp", f"{_INTERNAL}uploads", _MARKER}  # the store's own at the root
_TAGS = "user.ckptgw.tags"
_XATTR = "user.ckptgw"
_CRC = "user.ckptgw.crc32"  # a multipart upload's COMPOSITE CRC32 ("<b64>-<parts>"), as S3's
_COPY_CHUNK = 8 << 20


def _etag(st: os.stat_result) -> str:
    """An object's version: a rewrite (temp + rename) always changes size or mtime."""
    return f"{st.st_size:x}-{st.st_mtime_ns:x}-{st.st_ino:x}"


def _info(
    key: str, st: os.stat_result, metadata: dict[str, str] | None = None, crc32: str | None = None
) -> ObjectInfo:
    return ObjectInfo(key, st.st_size, _etag(st), metadata or {}, st.st_mtime, crc32)


def _crc_of(file: Path | int) -> bytes | None:
    """A multipart upload's CRC32, kept as an extended attribute of its file (none: None)."""
    try:
        return os.getxattr(file, _CRC)
    except OSError:
        return None


def _described(key: str, file: Path | int, st: os.stat_result) -> ObjectInfo:
    """What a HEAD says: with the metadata and the store's CRC32 (a multipart upload's)."""
    crc = _crc_of(file)
    return _info(key, st, _meta_of(file), None if crc is None else crc.decode())


def _meta_of(file: Path | int) -> dict[str, str]:
    """An object's metadata, kept as an extended attribute of its file (none: {})."""
    try:
        meta: dict[str, str] = json.loads(os.getxattr(file, _XATTR))
    except OSError:
        return {}
    return meta


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore(Store):
    def __init__(self, url: StoreURL) -> None:
        self.url = str(url)
        self.root = Path(url.prefix)
        self._tmp = self.root / f"{_INTERNAL}tmp"
        self._uploads = self.root / f"{_INTERNAL}uploads"

    async def _run(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return await trio.to_thread.run_sync(fn)
        except StoreError:
            raise
        except FileNotFoundError:
            raise NotFound(f"{what}: not found") from None
        except OSError as e:
            temporary = e.errno in (errno.EINTR, errno.EAGAIN, errno.EIO, errno.ETIMEDOUT)
            raise StoreError(
                f"{what}: {e.strerror}",
                temporary=temporary,
                code=errno.errorcode.get(e.errno or 0, ""),
            ) from None

    def _path(self, key: str) -> Path:
        """The file of ``key`` (of a marker "a/b/": ``a/b/.ckptgw-dir``). BadKey (permanent)
        for a key that is no relative path, and for the store's own names (module doc)."""
        parts = (key[:-1] if is_marker(key) else key).split("/")
        if (
            not key
            or key.startswith("/")
            or any(p in ("", ".", "..") for p in parts)
            or parts[0] in _PRIVATE
            or any(p.startswith(_INTERNAL) for p in parts[1:])
        ):
            raise StoreError(f"bad key {key!r} for a file store", temporary=False, code="BadKey")
        path = self.root.joinpath(*parts)
        return path / _MARKER if is_marker(key) else path

    def _key(self, rel: str, name: str) -> str | None:
        """The key of file ``name`` in directory ``rel`` (relative to the root, "" for the
        root) that a listing shows: a marker's key, or None for the store's own files."""
        if name == _MARKER:
            return f"{rel}/" if rel else None
        if rel and name.startswith(_INTERNAL):
            return None
        return f"{rel}/{name}" if rel else name

    # -- objects ---------------------------------------------------------------------------------

    async def check(self) -> None:
        def go() -> None:
            self.root.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(exist_ok=True)
            if not os.access(self.root, os.W_OK | os.X_OK):
                raise StoreError(f"store {self.root} is not writable", temporary=False)

        await self._run(f"checking store {self.root}", go)

    def _install(
        self, tmp: Path, dst: Path, metadata: dict[str, str], crc32: bytes | None = None
    ) -> str:
        """Move a fully written, fsynced temp file into place, durably; returns its ETag."""
        with contextlib.suppress(OSError):
            os.setxattr(tmp, _XATTR, json.dumps(metadata).encode())
            if crc32 is not None:
                os.setxattr(tmp, _CRC, crc32)
        etag = _etag(os.stat(tmp))  # a new inode: the ETag differs from the object it replaces
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.rename(tmp, dst)
        _fsync_dir(dst.parent)
        return etag

    def _write_tmp(self, chunks: list[bytes]) -> Path:
        self._tmp.mkdir(parents=True, exist_ok=True)
        tmp = self._tmp / uuid.uuid4().hex
        with open(tmp, "wb") as f:
            for c in chunks:
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    async def put(self, key: str, data: bytes, metadata: dict[str, str]) -> str:
        dst = self._path(key)
        if data and is_marker(key):
            raise marker_error(key, f"PUT {key}")

        return await self._run(
            f"PUT {key}", lambda: self._install(self._write_tmp([data]), dst, metadata)
        )

    async def get(
        self, key: str, start: int = 0, end: int | None = None, *, etag: str | None = None
    ) -> bytes:
        path = self._path(key)

        def go() -> bytes:
            with open(path, "rb") as f:
                if etag is not None and _etag(os.fstat(f.fileno())) != etag:
                    raise Stale(f"GET {key}: the object changed (ETag is no longer {etag})")
                f.seek(start)
                return f.read(-1 if end is None else max(0, end - start))

        return await self._run(f"GET {key}", go)

    async def get_into(
        self,
        key: str,
        start: int,
        end: int,
        fd: int,
        *,
        etag: str | None = None,
        progress: Progress | None = None,
        described: Described | None = None,
    ) -> None:
        path = self._path(key)

        def go() -> None:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if etag is not None and _etag(st) != etag:
                    raise Stale(f"GET {key}: the object changed (ETag is no longer {etag})")
                if described is not None:
                    trio.from_thread.run_sync(described, _described(key, f.fileno(), st))
                done = 0
                while done < end - start:
                    data = os.pread(f.fileno(), min(PIECE, end - start - done), start + done)
                    if not data:
                        raise short_read(key, start, end, done)
                    os.pwrite(fd, data, start + done)
                    done += len(data)
                    if progress is not None:
                        trio.from_thread.run_sync(progress, done)

        await self._run(f"GET {key}", go)

    async def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)

        def go() -> ObjectInfo | None:
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                return None
            if not os.path.isfile(path):
                return None
            return _described(key, path, st)

        return await self._run(f"HEAD {key}", go)

    async def delete(self, key: str) -> None:
        """Remove the object's file (a marker's: only the marker, not what is under it), and
        the directories up to the root that this leaves empty."""
        path = self._path(key)

        def go() -> None:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(path)
                _fsync_dir(path.parent)
            parent = path.parent  # drop directories the key leaves empty
            while parent != self.root:
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent

        await self._run(f"DELETE {key}", go)

    async def put_tags(self, key: str, tags: dict[str, str]) -> None:
        path = self._path(key)
        await self._run(f"TAG {key}", lambda: os.setxattr(path, _TAGS, json.dumps(tags).encode()))

    async def copy(self, src: str, dst: str, metadata: dict[str, str] | None = None) -> str:
        """A local copy of any size (``copy_limit`` is None): nothing is gained by parts. The
        copy is a new file, installed as ``put`` installs one; its metadata is ``src``'s or
        ``metadata`` (tags are not copied).

        ``src == dst`` (with ``metadata``) rewrites the metadata xattr of the object in place
        instead, without copying its data: one setxattr, which the kernel applies under the
        inode's lock and getxattr reads whole, so a reader sees the old or the new metadata,
        never a mix; then an fsync. The data, the tags, the mtime and so the ETag stay (S3
        gives the object a new LastModified, and a new ETag if it was a multipart upload). On
        a filesystem without xattrs objects have no metadata (as with ``put``): nothing
        changes."""
        check_copy(src, dst, metadata)
        s, d, what = self._path(src), self._path(dst), f"COPY {src} -> {dst}"
        if metadata is not None and src == dst:
            return await self._run(what, lambda: self._replace_metadata(what, s, metadata))

        def go() -> str:
            self._tmp.mkdir(parents=True, exist_ok=True)
            tmp = self._tmp / uuid.uuid4().hex
            shutil.copyfile(s, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            meta = _meta_of(s) if metadata is None else metadata
            return self._install(tmp, d, meta, _crc_of(s))  # the same content, the same CRC32

        return await self._run(what, go)

    def _replace_metadata(self, what: str, path: Path, metadata: dict[str, str]) -> str:
        """Set the metadata xattr of the object at ``path`` in place, durably; its ETag."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except NotADirectoryError:
            raise NotFound(f"{what}: not found") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a directory: no object (as head says)
                raise NotFound(f"{what}: not found")
            try:
                os.setxattr(fd, _XATTR, json.dumps(metadata).encode())
            except OSError as e:
                if e.errno != errno.ENOTSUP:  # ENOTSUP: no xattrs here, as in _install
                    raise
            os.fsync(fd)
            return _etag(st)
        finally:
            os.close(fd)

    async def iter_objects(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """Markers included (as "a/b/"); the store's own names are left out (module doc)."""

        def go() -> list[ObjectInfo]:
            found = []
            for dirpath, dirnames, filenames in os.walk(self.root):
                rel = os.path.relpath(dirpath, self.root)
                if rel == ".":
                    dirnames[:] = [d for d in dirnames if d not in _PRIVATE]
                    rel = ""
                else:
                    dirnames[:] = [d for d in dirnames if not d.startswith(_INTERNAL)]
                for name in filenames:
                    key = self._key(rel, name)
                    if key is None or not key.startswith(prefix):
                        continue
                    with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                        found.append(_info(key, os.stat(os.path.join(dirpath, name))))
            return sorted(found, key=lambda o: o.key)

        for info in await self._run(f"LIST {prefix}", go):
            yield info

    async def list_dir(self, prefix: str) -> Listing:
        """Every directory one level below ``prefix`` is among ``dirs``: one exists while a
        marker or an object is under it (``delete`` removes the directories it empties; a
        crash may leave an empty one). Markers are never among ``objects`` (the one of
        ``prefix`` itself included), and the store's own names are never listed."""
        if prefix and not prefix.endswith("/"):
            raise StoreError(f"LIST {prefix}: not a directory prefix", temporary=False)
        where = self._path(prefix[:-1]) if prefix else self.root

        def go() -> Listing:
            objects, dirs = [], []
            try:
                entries = sorted(os.scandir(where), key=lambda e: e.name)
            except (FileNotFoundError, NotADirectoryError):
                return Listing([], [])
            for e in entries:
                if e.name.startswith(_INTERNAL):  # markers and the store's own, at every level
                    continue
                if e.is_dir(follow_symlinks=False):
                    dirs.append(f"{prefix}{e.name}/")
                elif e.is_file(follow_symlinks=False):
                    objects.append(_info(prefix + e.name, e.stat(follow_symlinks=False)))
            return Listing(objects, dirs)

        return await self._run(f"LIST {prefix}", go)

    # -- multipart -------------------------------------------------------------------------------

    def _upload_dir(self, upload_id: str) -> Path:
        if not upload_id.isalnum():
            raise NotFound(f"upload {upload_id!r}: not found", "NoSuchUpload")
        return self._uploads / upload_id

    async def create_multipart(self, key: str, metadata: dict[str, str]) -> str:
        self._path(key)
        if is_marker(key):
            raise marker_error(key, f"CREATE-MULTIPART {key}")
        upload_id = uuid.uuid4().hex

        def go() -> str:
            d = self._upload_dir(upload_id)
            d.mkdir(parents=True)
            (d / "upload.json").write_text(json.dumps({"key": key, "metadata": metadata}))
            _fsync_dir(d)
            return upload_id

        return await self._run(f"CREATE-MULTIPART {key}", go)

    def _stage_part(self, d: Path, what: str, number: int, fill: Callable[[BinaryIO], str]) -> str:
        """Write part ``number`` of the upload in ``d`` through ``fill`` (which returns the
        part's ETag), durably, replacing a part sent before with that number."""
        if not d.is_dir():
            raise NotFound(f"{what}: no such upload", "NoSuchUpload")
        self._tmp.mkdir(parents=True, exist_ok=True)
        tmp = self._tmp / uuid.uuid4().hex
        with open(tmp, "wb") as f:
            etag = fill(f)
            f.flush()
            os.fsync(f.fileno())
        name = f"part-{number:05}.{etag}"
        os.rename(tmp, d / name)
        for old in d.glob(f"part-{number:05}.*"):
            if old.name != name:
                old.unlink()
        _fsync_dir(d)
        return etag

    async def upload_part(
        self, key: str, upload_id: str, number: int, data: Body, crc32: int | None = None
    ) -> str:
        d, what = self._upload_dir(upload_id), f"PART {number} of {key}"

        def fill(f: BinaryIO) -> str:
            f.write(data)
            return xxhash.xxh3_128_hexdigest(data)

        return await self._run(what, lambda: self._stage_part(d, what, number, fill))

    async def copy_part(
        self,
        src: str,
        dst: str,
        upload_id: str,
        number: int,
        start: int,
        end: int,
        *,
        etag: str | None = None,
    ) -> str:
        d, s = self._upload_dir(upload_id), self._path(src)
        what = f"COPY part {number} {src} -> {dst}"

        def fill(f: BinaryIO) -> str:
            digest = xxhash.xxh3_128()
            with open(s, "rb") as source:
                if etag is not None and _etag(os.fstat(source.fileno())) != etag:
                    raise Stale(f"{what}: the object changed (ETag is no longer {etag})")
                source.seek(start)
                left = max(0, end - start)
                while left and (chunk := source.read(min(left, _COPY_CHUNK))):
                    f.write(chunk)
                    digest.update(chunk)
                    left -= len(chunk)
            return digest.hexdigest()

        return await self._run(what, lambda: self._stage_part(d, what, number, fill))

    async def list_parts(self, key: str, upload_id: str) -> dict[int, str]:
        d = self._upload_dir(upload_id)

        def go() -> dict[int, str]:
            if not d.is_dir():
                raise NotFound(f"LIST-PARTS {key}: no such upload", "NoSuchUpload")
            parts = {}
            for p in d.glob("part-*"):
                number, etag = p.name.removeprefix("part-").split(".", 1)
                parts[int(number)] = etag
            return parts

        return await self._run(f"LIST-PARTS {key}", go)

    async def complete_multipart(self, key: str, upload_id: str, etags: list[str]) -> str:
        d, dst = self._upload_dir(upload_id), self._path(key)

        def go() -> str:
            info = json.loads((d / "upload.json").read_text())
            self._tmp.mkdir(parents=True, exist_ok=True)
            tmp = self._tmp / uuid.uuid4().hex
            crcs = []
            with open(tmp, "wb") as out:
                for n, etag in enumerate(etags, 1):
                    part = d / f"part-{n:05}.{etag}"
                    if not part.exists():
                        raise StoreError(
                            f"COMPLETE {key}: part {n} ({etag}) is missing",
                            temporary=False,
                            code="InvalidPart",
                        )
                    crc = 0
                    with open(part, "rb") as src:
                        while chunk := src.read(_COPY_CHUNK):
                            out.write(chunk)
                            crc = crc32(chunk, crc)
                    crcs.append(crc)
                out.flush()
                os.fsync(out.fileno())
            value = f"{crc32_b64(composite(crcs))}-{len(crcs)}".encode()
            etag = self._install(tmp, dst, info["metadata"], value)
            shutil.rmtree(d)
            return etag

        return await self._run(f"COMPLETE {key}", go)

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        d = self._upload_dir(upload_id)
        await self._run(f"ABORT {key}", lambda: shutil.rmtree(d, ignore_errors=True))

    async def iter_uploads(self, prefix: str) -> AsyncIterator[Upload]:
        def go() -> list[Upload]:
            found = []
            if self._uploads.is_dir():
                for d in sorted(self._uploads.iterdir()):
                    with contextlib.suppress(OSError, ValueError):
                        key = json.loads((d / "upload.json").read_text())["key"]
                        if key.startswith(prefix):
                            found.append(Upload(key, d.name, d.stat().st_mtime))
            return found

        for u in await self._run(f"LIST-UPLOADS {prefix}", go):
            yield u

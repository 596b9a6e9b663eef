"""The store interface: what the drain needs from an object store, and its one error type.

Two implementations hold data: :class:`ckptgw.store.s3.S3Store` (S3 and S3-compatible stores)
and :class:`ckptgw.store.files.FileStore` (a directory); :class:`ckptgw.store.memory.MemoryStore`
is one in memory for tests. Every call raises :class:`StoreError` and nothing else, already
classified as temporary (worth retrying) or permanent (needs someone to fix something:
credentials, the bucket, the request).

Each call is one request (a listing: one per page, a ``delete_many``: one per 1,000 keys), so
that a retry repeats as little as possible. Retrying and composing calls is not the store's
job: :class:`ckptgw.store.retry.RetryingStore` wraps a store and does both (a copy above
``copy_limit`` becomes a multipart upload of ``copy_part`` calls there, each retried alone).
"""

from __future__ import annotations

import abc
import errno
import functools
import mmap
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from ckptgw.store.crc import crc32
from ckptgw.store.partbuffers import PartBuffers

MIN_PART = 5 << 20  # S3: every part but the last
MAX_PART = 5 << 30
MAX_PARTS = 10_000
MAX_OBJECT = 5 << 40
MAX_COPY = 5 << 30  # S3: the largest CopyObject, and the largest UploadPartCopy
PIECE = 4 << 20  # get_into writes (and reports) a range in pieces of about this size

#: A part's or a PUT's bytes: ``bytes``, or a view of a part buffer
#: (:mod:`ckptgw.store.partbuffers`).
Body = bytes | memoryview
#: ``get_into``'s report: the bytes from the range's start that are in the file now.
Progress = Callable[[int], None]
#: ``get_into``'s report of the object as the response describes it (what a HEAD returns).
Described = Callable[["ObjectInfo"], None]

# Error codes (StoreError.code) that say the store refused who we are: S3's, and our own for a
# client that found no credentials at all.
CREDENTIAL_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "403",
        "NoCredentials",
    }
)


class StoreError(Exception):
    """A store call failed. ``temporary`` says whether the same call may succeed later."""

    def __init__(
        self,
        message: str,
        *,
        temporary: bool,
        code: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.temporary = temporary
        self.code = code
        self.retry_after = retry_after


class NotFound(StoreError):
    def __init__(self, message: str, code: str = "NoSuchKey") -> None:
        super().__init__(message, temporary=False, code=code)


class Stale(StoreError):
    """The object is no longer the version asked for (its ETag changed: someone rewrote it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, temporary=False, code="PreconditionFailed")


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    metadata: dict[str, str] = field(default_factory=dict)  # empty in listings
    mtime: float = 0.0  # last modified, seconds since the epoch
    # The store's CRC32 of the object, base64 ("<b64>-<parts>": of its parts' CRC32s), where a
    # HEAD asked for it and the store keeps one: checks a multipart upload (fsops.contentsum).
    crc32: str | None = None


@dataclass(frozen=True)
class Listing:
    """One level of the key space under a prefix ending in "/" (or the empty prefix)."""

    objects: list[ObjectInfo]  # keys directly under the prefix
    dirs: list[str]  # next-level prefixes, each ending in "/"


@dataclass(frozen=True)
class Upload:
    key: str
    upload_id: str
    initiated: float  # seconds since the epoch


def is_marker(key: str) -> bool:
    """Whether ``key`` names a directory marker: it ends in "/" (see :class:`Store`)."""
    return key.endswith("/")


def marker_error(key: str, what: str) -> StoreError:
    """The permanent error for data sent to a directory marker (markers are always empty)."""
    return StoreError(
        f'{what}: {key!r} is a directory marker (its key ends in "/"), which holds no data',
        temporary=False,
        code="InvalidRequest",
    )


def check_copy(src: str, dst: str, metadata: dict[str, str] | None) -> None:
    """Refuse, with a permanent StoreError, the copies no store makes: an object onto itself
    without new metadata (S3 refuses it too), and a copy between a directory marker and an
    object (it would put data under a marker, or make an object of one)."""
    if src == dst and metadata is None:
        raise StoreError(
            f"COPY {src} -> {dst}: a copy onto itself needs new metadata",
            temporary=False,
            code="InvalidRequest",
        )
    if is_marker(src) != is_marker(dst):
        raise StoreError(
            f"COPY {src} -> {dst}: a directory marker is copied only to a marker",
            temporary=False,
            code="InvalidRequest",
        )


class Store(abc.ABC):
    """Keys are full object keys (the store URL's prefix already applied).

    A key ending in "/" ("run/step_5/") is a directory marker, as S3 tools make them: an
    empty object that stands for a directory (an empty one, or one whose mode, owner and
    xattrs are kept in the marker's metadata). Markers are always empty: ``put`` of data and
    ``create_multipart`` under a marker key are refused (permanent StoreError). A marker is
    an object to ``head``, ``get``, ``delete`` and ``copy`` (to another marker key), and
    ``iter_objects`` lists it, before the keys under it ("a/b/" < "a/b/x"). ``list_dir`` never
    lists a marker among ``objects``: its directory is among the ``dirs`` of the level above,
    and the marker of the prefix itself ("a/b/" in ``list_dir("a/b/")``) is left out.
    Deleting a marker leaves the objects under it.
    """

    url: str
    #: The largest object ``copy`` copies (in one request); None: any size. Bigger objects
    #: are copied part by part with ``copy_part``, which :class:`ckptgw.store.retry.RetryingStore`
    #: does.
    copy_limit: int | None = None

    @abc.abstractmethod
    async def check(self) -> None:
        """Raise StoreError unless the store exists and we may read and write it."""

    @abc.abstractmethod
    async def put(self, key: str, data: bytes, metadata: dict[str, str]) -> str:
        """Store ``data`` under ``key`` in one request; returns the ETag. For a directory
        marker ``data`` must be empty."""

    @abc.abstractmethod
    async def get(
        self, key: str, start: int = 0, end: int | None = None, *, etag: str | None = None
    ) -> bytes:
        """Bytes [start, end) of an object; NotFound if there is none; Stale if ``etag`` is
        given and the object no longer has it."""

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
        """Write bytes [start, end) of an object into the file ``fd`` at the same offsets, as
        they arrive (a store that streams: in pieces of about :data:`PIECE`), calling
        ``progress(n)`` on the caller's thread whenever the first ``n`` bytes of the range
        are in the file. Errors as :meth:`get`; an object that ends before ``end`` is a
        permanent StoreError (code "ShortRead").

        ``described(info)``, if the store can say, is called once on the caller's thread
        before any ``progress``, with what a :meth:`head` of the version being read would
        return (its whole size, ETag and metadata): a GET's response carries it, so a reader
        of a whole object needs no HEAD. This default reads the range whole and says
        nothing."""
        data = await self.get(key, start, end, etag=etag)
        if len(data) != end - start:
            raise short_read(key, start, end, len(data))
        await trio.to_thread.run_sync(os.pwrite, fd, data, start)
        if progress is not None:
            progress(len(data))

    @abc.abstractmethod
    async def head(self, key: str) -> ObjectInfo | None: ...

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Remove an object; a missing one is not an error."""

    @abc.abstractmethod
    async def copy(self, src: str, dst: str, metadata: dict[str, str] | None = None) -> str:
        """Server-side copy of an object up to ``copy_limit``; returns the new object's ETag.
        NotFound if there is no ``src``.

        The copy carries ``src``'s metadata, or, if ``metadata`` is given, exactly that (it
        replaces the user metadata). With ``metadata``, ``dst`` may be ``src``: an in-place
        metadata update, data unchanged, that a reader sees whole (old or new metadata, never
        a mix). Refused (permanent StoreError): ``src`` onto itself without ``metadata``, and
        a copy between a directory marker and an object (:func:`check_copy`)."""

    @abc.abstractmethod
    def iter_objects(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """Objects whose key starts with ``prefix``, in key order."""

    @abc.abstractmethod
    async def list_dir(self, prefix: str) -> Listing:
        """One level under ``prefix`` (S3's delimiter "/" listing), every page of it. No
        directory marker is among ``objects`` (see :class:`Store`)."""

    async def delete_many(self, keys: list[str]) -> None:
        """Remove objects (missing ones are not an error); S3 batches 1,000 per request."""
        for key in keys:
            await self.delete(key)

    @abc.abstractmethod
    async def put_tags(self, key: str, tags: dict[str, str]) -> None:
        """Replace an object's tags (S3 object tagging)."""

    async def get_lifecycle(self) -> list[dict[str, Any]]:
        """The bucket's lifecycle rules (S3's JSON shape); [] when there are none."""
        raise StoreError(f"{self.url}: lifecycle rules need an S3 store", temporary=False)

    async def put_lifecycle(self, rules: list[dict[str, Any]]) -> None:
        raise StoreError(f"{self.url}: lifecycle rules need an S3 store", temporary=False)

    # -- multipart -------------------------------------------------------------------------------

    @abc.abstractmethod
    async def create_multipart(self, key: str, metadata: dict[str, str]) -> str:
        """Start a multipart upload; returns its upload id. Refused for a directory marker."""

    @abc.abstractmethod
    async def upload_part(
        self, key: str, upload_id: str, number: int, data: Body, crc32: int | None = None
    ) -> str:
        """Upload part ``number`` (1-based); returns its ETag. ``crc32``: the part's, if the
        caller computed it (else the store computes what it needs). ``data`` may be a view
        of a part buffer that is reused once this returns: a store keeps no reference."""

    async def upload_part_from(
        self, key: str, upload_id: str, number: int, fd: int, offset: int, length: int
    ) -> tuple[str, int]:
        """Upload bytes [offset, offset + length) of the open file ``fd`` as part ``number``;
        returns its ETag and the CRC32 of the bytes sent, which one read gave for both. A file
        that ends before the part does is a permanent StoreError (code :data:`SHORT_FILE`).

        This default reads on a worker thread, into one of :attr:`part_buffers`, and calls
        :meth:`upload_part`; :class:`ckptgw.store.s3.S3Store` can send the part from a worker
        process instead."""
        buffers = self.part_buffers
        buf = take_buffer(buffers, offset, length)
        try:
            data, crc = await trio.to_thread.run_sync(read_part, fd, offset, length, buf)
            etag = await self.upload_part(key, upload_id, number, data, crc)
        except Exception:  # the request has ended
            buffers.give(buf)
            raise
        except BaseException:  # cancelled or interrupted: it may still be sending from it
            buffers.lost(buf)
            raise
        buffers.give(buf)
        return etag, crc

    def requests_view(self) -> dict[str, Any] | None:
        """What ``ckptgw status`` shows of this store's requests: its endpoint, its deadlines,
        the requests in flight and those stalled (:mod:`ckptgw.store.deadlines`); None for a store
        that makes none over a network (a file store)."""
        return None

    def part_workers_view(self) -> dict[str, object] | None:
        """What ``ckptgw status`` shows of the worker processes that send this store's parts;
        None for a store whose parts all go from the daemon."""
        return None

    @functools.cached_property
    def part_buffers(self) -> PartBuffers:
        """The buffers this store's parts are read into (made at first use)."""
        return PartBuffers()

    @abc.abstractmethod
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
        """Make bytes [start, end) of object ``src`` part ``number`` of upload ``upload_id``
        (to ``dst``), copied inside the store; returns the part's ETag. NotFound if ``src`` or
        the upload is gone; Stale if ``etag`` is given and ``src`` no longer has it."""

    @abc.abstractmethod
    async def list_parts(self, key: str, upload_id: str) -> dict[int, str]:
        """Parts the store has for an upload: number -> ETag. NotFound if the upload is gone."""

    @abc.abstractmethod
    async def complete_multipart(self, key: str, upload_id: str, etags: list[str]) -> str:
        """Assemble parts 1..len(etags) into the object; returns the object's ETag."""

    @abc.abstractmethod
    async def abort_multipart(self, key: str, upload_id: str) -> None:
        """Forget an upload and its parts; an upload already gone is not an error."""

    @abc.abstractmethod
    def iter_uploads(self, prefix: str) -> AsyncIterator[Upload]:
        """Uploads in progress under ``prefix`` (to find orphans)."""


SHORT_FILE = "ShortFile"


READ_ERROR = "ReadError"
# errno values of a read that may succeed later (memory, descriptors, a signal)
_TEMPORARY_ERRNOS = frozenset({errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.EINTR})


def read_part(fd: int, offset: int, length: int, into: mmap.mmap | None = None) -> tuple[Body, int]:
    """Bytes [offset, offset + length) of a file and their CRC32: one read for both (the
    CRC32 releases the GIL), into the start of ``into`` if given (a view of it is returned).
    A file that ends sooner: permanent StoreError, code SHORT_FILE; a read that fails:
    StoreError, code READ_ERROR (temporary for ENOMEM, EMFILE and the like, permanent for EIO
    and the rest), so that a part read here or in a part worker fails the same way."""
    try:
        if into is None:
            data: Body = os.pread(fd, length, offset)
        else:
            if len(into) < length:
                raise ValueError(f"a {len(into)}-byte buffer for a {length}-byte part")
            view = memoryview(into)[:length]
            data = view[: _read_into(fd, view, offset)]
    except OSError as e:
        raise StoreError(
            f"reading [{offset}, {offset + length}) of the cache file: {e.strerror}",
            temporary=e.errno in _TEMPORARY_ERRNOS,
            code=READ_ERROR,
        ) from None
    except MemoryError:
        raise StoreError(
            f"reading [{offset}, {offset + length}) of the cache file: out of memory",
            temporary=True,
            code=READ_ERROR,
        ) from None
    if len(data) != length:
        raise StoreError(
            f"the file ends at {offset + len(data)}, before the part [{offset}, "
            f"{offset + length}) does",
            temporary=False,
            code=SHORT_FILE,
        )
    return data, crc32(data)


def take_buffer(buffers: PartBuffers, offset: int, length: int) -> mmap.mmap:
    """A buffer for the part [offset, offset + length); one that cannot be made is a
    temporary StoreError, as a read short of memory is."""
    try:
        return buffers.take(length)
    except (OSError, MemoryError) as e:
        raise StoreError(
            f"reading [{offset}, {offset + length}) of the cache file: no buffer ({e})",
            temporary=True,
            code=READ_ERROR,
        ) from None


def _read_into(fd: int, view: memoryview, offset: int) -> int:
    """Fill ``view`` from ``offset`` on; fewer bytes only at the end of the file."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got


def short_read(key: str, start: int, end: int, got: int) -> StoreError:
    return StoreError(
        f"GET {key}: got {got} bytes for [{start}, {end}): the object is shorter than listed",
        temporary=False,
        code="ShortRead",
    )


def part_size_for(size: int, preferred: int) -> int:
    """The part size for an object of ``size`` bytes: ``preferred`` unless that would need more
    than 10,000 parts; always within S3's 5 MiB..5 GiB, whole MiB."""
    if size > MAX_OBJECT:
        raise StoreError(f"{size} bytes is more than an object can hold (5 TiB)", temporary=False)
    need = -(-size // MAX_PARTS)
    part = max(preferred, need, MIN_PART)
    part = -(-part // (1 << 20)) * (1 << 20)
    return min(part, MAX_PART)

"""Uploading one entry: the current generation of a dirty entry, to its current key.

A regular file's object holds its content; a symlink's its target; a directory (its marker,
a key ending in "/"), FIFO, socket or device gets an empty object. The metadata says what the
entry is (:mod:`fsops.objectmeta`).

Single PUT up to the multipart threshold; above it, a multipart upload whose parts go in
parallel (bounded by a limiter shared by all uploads, so memory stays at most
``max_parts * part_size``). The upload record and every finished part are journaled.

Each byte of the cache file is read once per upload, and the content checksum computed in
that read (:mod:`fsops.contentsum`): a single PUT's xxh3-128 goes in its metadata; a part's
CRC32 goes with the part (the store checks it) and into the journal, and the object's
checksum is the CRC32 of its parts' CRC32s, which the store keeps (the metadata, fixed at
CreateMultipartUpload, names the part size). ``DrainStats.read`` counts the bytes read. A
part is read, checksummed and sent in one :meth:`Store.upload_part_from`, which the S3 store
may hand to a part worker process (:mod:`ckptgw.store.partpool`): then the daemon never holds the
part's bytes.

A multipart upload restarted with the same generation, key and size resumes (a single PUT
is sent again): a part the journal has and the store still lists is read again (its one read
in this upload) and kept if its CRC32 is the one journaled when it was sent; a part written
since (a dirty file takes writes without a new generation, e.g. after a failed attempt) goes
again under its number.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import trio
import xxhash

from ckptgw.drain.uploads.progress import COMPLETING, SENDING, DrainStats, UploadProgress
from ckptgw.fsops.contentsum import PARTS, part_size_of, parts_checksum
from ckptgw.fsops.inodes import Inode, InodeTable
from ckptgw.fsops.journal import State, UploadRow
from ckptgw.fsops.namespace import needs_no_marker
from ckptgw.fsops.objectmeta import CHECKSUM, encode
from ckptgw.fsops.state import FileStates
from ckptgw.fsops.storekeys import StoreKeys
from ckptgw.store.crc import composite, crc32_b64
from ckptgw.store.interface import (
    SHORT_FILE,
    NotFound,
    Store,
    StoreError,
    part_size_for,
    read_part,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

META_CHECKSUM = CHECKSUM
INLINE_READ = 1 << 20  # files up to this size are read on the event loop when cached
# Seconds a CreateMultipartUpload may hold off a cancel (a change, an unmount) so that its id
# is journaled; past this the answer is given up and the upload left to the orphan sweep.
CREATE_TIMEOUT = 15.0


@dataclass(frozen=True)
class UploadConfig:
    multipart_threshold: int = 16 << 20
    part_size: int = 16 << 20


class Changed(Exception):
    """The file changed (or went) while it was read for the upload."""


def _read_hashed(fd: int, size: int) -> tuple[bytes, str]:
    """A small file's content and its checksum: one read for both."""
    data = _read(fd, size, 0)
    return data, xxhash.xxh3_128_hexdigest(data)


def _read_hashed_cached(fd: int, size: int) -> tuple[bytes, str] | None:
    """:func:`_read_hashed` if the whole file is in the page cache (it was just written, as
    a checkpoint's files are), without waiting for the disk; None if reading it would."""
    buf = bytearray(size)
    try:
        n = os.preadv(fd, [buf], 0, os.RWF_NOWAIT)
    except (BlockingIOError, OSError):  # not cached, or no RWF_NOWAIT on this filesystem
        return None
    if n != size:  # partly cached, or shorter than the file (the thread's read tells)
        return None
    data = bytes(buf)
    return data, xxhash.xxh3_128_hexdigest(data)


def _read(fd: int, size: int, off: int) -> bytes:
    data = os.pread(fd, size, off)
    if len(data) != size:
        raise Changed("the cache file is shorter than the file")
    return data


def _reason(group: BaseExceptionGroup) -> BaseException:
    """What a failed set of parts means for the upload: Changed (or a cache file shorter than
    a part, :data:`SHORT_FILE`: truncated meanwhile), else the first StoreError.

    The other members are then cancelled siblings or more of the same. A group holding
    anything else (a bug) or only cancellations stays as it is."""
    _, other = group.split((Changed, StoreError, trio.Cancelled))
    if other is None:
        short, _ = group.split(lambda e: isinstance(e, StoreError) and e.code == SHORT_FILE)
        if short is not None:
            return Changed("the cache file is shorter than the file")
        for kind in (Changed, StoreError):
            match, _ = group.split(kind)
            if match is not None:
                return _leaves(match)[0]
    return group


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


class Uploader:
    """Uploads files the engine has taken (``uploading``). ``store`` retries temporary errors
    itself (:class:`ckptgw.store.retry.RetryingStore`)."""

    def __init__(
        self,
        table: InodeTable,
        states: FileStates,
        keys: StoreKeys,
        store: Store,
        config: UploadConfig,
        parts_limiter: trio.CapacityLimiter,
        drained: DrainStats | None = None,
    ) -> None:
        self.table = table
        self.journal = table.journal
        self.states = states
        self.keys = keys
        self.store = store
        self.config = config
        self.parts_limiter = parts_limiter
        self.drained = drained if drained is not None else DrainStats()
        # Keys whose multipart upload is being created, for the orphan sweep: the store has
        # the upload before we know its id; once we do, its record is journaled at once.
        self.creating: set[str] = set()
        self.markers_implied = 0  # directories drained without a marker (no request)

    async def _send(
        self, progress: UploadProgress, nbytes: int, call: Callable[[], Awaitable[T]]
    ) -> T:
        """One part or single PUT, timed and counted."""
        t0 = trio.current_time()
        progress.phase = SENDING
        progress.in_flight += nbytes
        try:
            result = await call()
        finally:
            progress.in_flight -= nbytes
        self.drained.part_seconds.observe(trio.current_time() - t0)
        self.drained.bytes += nbytes
        progress.sent += nbytes
        return result

    async def upload(self, ino: Inode, generation: int, key: str, progress: UploadProgress) -> bool:
        """Upload ``generation`` of ``ino`` (taken by the engine: ``uploading``) to ``key``;
        returns whether the file is clean now.

        Raises StoreError (the file stays dirty) or Changed. Cancellation keeps the journal's
        upload record, so the next attempt (or the next mount) resumes it."""
        if not ino.is_reg:
            return await self._entry(ino, generation, key, progress)
        size = ino.size
        progress.size = size
        fd = self.table.cache.open_read(ino.id)
        try:
            record = self.journal.get_upload(ino.id)
            if record is not None and not (
                size > self.config.multipart_threshold  # only a multipart upload resumes
                and record.generation == generation
                and record.key == key
                and record.size == size
                # ... with its parts' CRC32s journaled (an older version's record names an
                # xxh3-128 of the whole file instead)
                and part_size_of(record.checksum)
            ):
                await self.discard(record, ino)
                record = None
            if size <= self.config.multipart_threshold:
                etag, record = await self._single(ino, fd, generation, key, progress)
            else:
                if record is None:
                    record = UploadRow(ino.id, generation, key, None, 0, size, "")
                etag = await self._multipart(ino, fd, record, progress)
        finally:
            os.close(fd)
        clean = self._finish(ino, record, etag)
        self.drained.files += 1
        return clean

    def _metadata(self, ino: Inode, size: int, checksum: str | None) -> dict[str, str]:
        return encode(ino, self.journal.xattrs(ino.id), size=size, checksum=checksum)

    async def _entry(self, ino: Inode, generation: int, key: str, progress: UploadProgress) -> bool:
        """An entry without content in the cache: one PUT of its target (a symlink) or of
        nothing, with what it is in the metadata. A directory that a listing shows as it is
        without its marker gets none (:meth:`_implied`)."""
        if ino.is_dir and self._implied(ino, generation, key):
            return True
        data = ino.target or b""
        progress.size = len(data)
        record = UploadRow(ino.id, generation, key, None, 0, len(data), "")
        meta = self._metadata(ino, len(data), None)
        self._begin(record)
        _check(ino, generation)
        etag = await self._send(progress, len(data), lambda: self.store.put(key, data, meta))
        return self._finish(ino, record, etag)  # drained.files counts regular files only

    def _implied(self, ino: Inode, generation: int, key: str) -> bool:
        """Make a directory taken by the drain clean without a request if it needs no marker
        (:func:`fsops.namespace.needs_no_marker`: at a fleet's save, every node makes the same
        directories, and each node's PUT of one key would count against the store's request
        rate); returns whether it did. Not where the store may hold an object of ours at its
        key: a previous version it replaces (``stored_key``), or a PUT sent before a restart
        (its upload record): a marker put is overwritten, never left without a row that
        deletes or moves it. Decided and committed without an await: no change comes between."""
        if ino.stored_key or self.journal.get_upload(ino.id) is not None:
            return False
        if not needs_no_marker(self.journal, ino):
            return False
        _check(ino, generation)
        with self.journal.transaction():
            if not self.states.marker_implied(ino, generation):
                return False
        log.debug("%s needs no marker: its entries show it", key)
        self.markers_implied += 1
        return True

    async def _single(
        self,
        ino: Inode,
        fd: int,
        generation: int,
        key: str,
        progress: UploadProgress,
    ) -> tuple[str, UploadRow]:
        """One PUT; one read of the file for its body and its xxh3-128."""
        size = ino.size
        # Up to 1 MiB in the page cache is read and hashed here (about 0.1 ms): a thread's
        # round trip cost more than that, per file of a sharded save.
        read = _read_hashed_cached(fd, size) if size <= INLINE_READ else None
        if read is None:
            read = await trio.to_thread.run_sync(_read_hashed, fd, size)
        data, checksum = read
        self.drained.read += size
        _check(ino, generation)
        progress.phase = SENDING
        record = UploadRow(ino.id, generation, key, None, 0, size, checksum)
        meta = self._metadata(ino, size, checksum)
        self._begin(record)
        _check(ino, record.generation)
        etag = await self._send(progress, size, lambda: self.store.put(key, data, meta))
        return etag, record

    async def _multipart(
        self, ino: Inode, fd: int, record: UploadRow, progress: UploadProgress
    ) -> str:
        progress.phase = SENDING  # its checksum comes with the parts: no step of its own
        done: dict[int, tuple[str, int | None]] = {}  # part -> (ETag, CRC32), in the store
        if record.upload_id is not None:
            try:
                listed = await self.store.list_parts(record.key, record.upload_id)
            except NotFound:
                listed = None
            if listed is None:
                self._drop(record)
                record.upload_id = None
            else:
                journaled = self.journal.parts(ino.id)
                done = {n: p for n, p in journaled.items() if listed.get(n) == p[0]}
                log.info("resuming upload of %s: %d parts already there", record.key, len(done))
        if record.upload_id is None:
            record.part_size = part_size_for(record.size, self.config.part_size)
            record.checksum = f"{PARTS}{record.part_size}"
            meta = self._metadata(ino, record.size, record.checksum)
            # Shielded: once the store has made the upload, we must learn its id and journal
            # it, or nothing would ever abort it (a cancel now would lose the answer).
            self.creating.add(record.key)
            try:
                with trio.CancelScope(shield=True) as scope:
                    scope.deadline = trio.current_time() + CREATE_TIMEOUT
                    record.upload_id = await self.store.create_multipart(record.key, meta)
            finally:
                self.creating.discard(record.key)
            if record.upload_id is None:
                raise StoreError(
                    f"creating the upload of {record.key} took too long", temporary=True
                )
        self._begin(record)
        count = -(-record.size // record.part_size)
        crcs: dict[int, int] = {}
        kept_parts: list[int] = []

        def length_of(number: int) -> int:
            return min(record.part_size, record.size - (number - 1) * record.part_size)

        async def send(number: int, token: object) -> None:
            length = length_of(number)
            off = (number - 1) * record.part_size
            try:
                kept = done.pop(number, None)
                if kept is None:  # read, checksummed and sent in one step (maybe elsewhere)
                    etag, crc = await self._send(
                        progress,
                        length,
                        lambda: self.store.upload_part_from(
                            record.key, record.upload_id or "", number, fd, off, length
                        ),
                    )
                    self.drained.read += length
                    _check(ino, record.generation)
                else:  # sent before: kept if these are the bytes sent then
                    data, crc = await trio.to_thread.run_sync(read_part, fd, off, length)
                    self.drained.read += length
                    _check(ino, record.generation)
                    crcs[number] = crc
                    if kept[1] == crc:
                        done[number] = kept
                        kept_parts.append(number)
                        return
                    # written since it was sent, or sent by an older version: again
                    progress.sent -= length
                    progress.resumed -= length
                    etag = await self._send(
                        progress,
                        length,
                        lambda: self.store.upload_part(
                            record.key, record.upload_id or "", number, data, crc
                        ),
                    )
            finally:
                self.parts_limiter.release_on_behalf_of(token)
            crcs[number] = crc
            with self.journal.transaction():
                self.journal.add_part(ino.id, number, etag, crc)
            done[number] = (etag, crc)

        t_parts = trio.current_time()
        progress.sent = progress.resumed = sum(length_of(n) for n in done)
        try:
            async with trio.open_nursery() as nursery:
                for n in range(1, count + 1):  # in file order: the cache file is read in order
                    token = object()
                    await self.parts_limiter.acquire_on_behalf_of(token)
                    nursery.start_soon(send, n, token)
        except BaseExceptionGroup as group:
            raise _reason(group) from None
        log.info(
            "sent %d parts of %s in %.2f s",
            count - len(kept_parts),
            record.key,
            trio.current_time() - t_parts,
        )
        etags = [done[n][0] for n in range(1, count + 1)]
        record.checksum = parts_checksum(
            record.part_size, crc32_b64(composite([crcs[n] for n in range(1, count + 1)]))
        )
        _check(ino, record.generation)
        progress.phase = COMPLETING
        return await self.store.complete_multipart(record.key, record.upload_id or "", etags)

    # -- the journal -------------------------------------------------------------------------------

    def _begin(self, record: UploadRow) -> None:
        with self.journal.transaction():
            self.journal.put_upload(record)

    def _drop(self, record: UploadRow) -> None:
        with self.journal.transaction():
            self.journal.drop_upload(record.inode)

    def _finish(self, ino: Inode, record: UploadRow, etag: str) -> bool:
        """The object is complete at record.key. The file becomes clean if nothing changed
        meanwhile; returns whether it did."""
        with self.journal.transaction():
            self.journal.drop_upload(ino.id)
            key = self.keys.entry_key(ino) if ino.parent is not None else None
            # Renamed while uploading, and another file was moved to the old key since: that
            # key is the other file's now (its move waits for this upload to end, then
            # overwrites what it sent). This file goes again, to its new key.
            taken = key != record.key and self.journal.stored_at(record.key, ino.id) is not None
            clean = (
                key is not None
                and not taken
                and self.states.finish_upload(
                    ino, record.generation, record.size, key, etag, record.checksum or None
                )
            )
            if clean and key != record.key:  # renamed while uploading: complete, then move
                log.info("%s was renamed to %s while it was uploaded: moving it", record.key, key)
                self.journal.add_store_op("move", record.key, key, etag)
                self.keys.events.store_ops_added()
            elif not clean:  # written, unlinked or overtaken meanwhile
                self.states.abandon_upload(ino)
                self.keys.sent_stale(ino, record.key, etag)
        self.keys.note_stored(record.key)
        return clean

    async def discard(self, record: UploadRow, ino: Inode | None = None) -> None:
        """Abort an upload nobody wants any more, and forget it. For ``ino``, a named entry
        (a restart, or a retry after the file was renamed): what the upload's key holds is
        handled as any stale upload's (:meth:`StoreKeys.sent_stale`): a single PUT may have
        landed before its answer was lost, and the older version the upload was to
        overwrite may be there (a rename left it to the upload)."""
        if record.upload_id is not None:
            with contextlib.suppress(StoreError):
                await self.store.abort_multipart(record.key, record.upload_id)
        with self.journal.transaction():
            if self._left_behind(record, ino):
                assert ino is not None
                self.keys.sent_stale(ino, record.key, None)
            self.journal.drop_upload(record.inode)

    def _left_behind(self, record: UploadRow, ino: Inode | None) -> bool:
        """Whether ``record``'s key may hold something of ``ino`` that nothing else tracks:
        it is no longer the entry's key, or a single PUT to it may have landed while the
        file is dirty. Not where an upload of ``ino`` begins now at the same key (its own
        record covers that key)."""
        if ino is None or ino.parent is None:
            return False
        if record.key != self.keys.entry_key(ino):
            return True
        return record.upload_id is None and ino.state is State.DIRTY


def _check(ino: Inode, generation: int) -> None:
    """Raise Changed if the file is no longer the generation being uploaded (or was
    unlinked): the rest of the upload would be wasted."""
    if ino.generation != generation or ino.parent is None:
        raise Changed("changed during the upload")

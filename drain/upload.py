"""Uploading one file: the current generation of a dirty file, to its current key.

Single PUT up to the multipart threshold; above it, a multipart upload whose parts go in
parallel (bounded by a limiter shared by all uploads, so memory stays at most
``max_parts * part_size``). The upload record and every finished part are journaled. A
restart with the same generation, key and size resumes: the journal's parts that the store
still lists are kept, and only the rest are sent.

The content checksum (xxh3-128) is computed before the upload starts, because object metadata
is fixed when the upload is created.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio
import xxhash

from drain.progress import DrainStats, UploadProgress
from drain.retry import RetryPolicy, RetryStats, retrying
from drain.store import NotFound, Store, StoreError, part_size_for
from fsops.inodes import Inode, InodeTable
from fsops.journal import State, UploadRow
from fsops.storekeys import StoreKeys

log = logging.getLogger(__name__)

META_CHECKSUM = "xxh3-128"
HASH_CHUNK = 8 << 20


@dataclass(frozen=True)
class UploadConfig:
    multipart_threshold: int = 16 << 20
    part_size: int = 16 << 20
    retry: RetryPolicy = field(default_factory=RetryPolicy)


class Changed(Exception):
    """The file changed (or went) while it was read for the upload."""


def _hash_file(fd: int, size: int) -> str:
    h = xxhash.xxh3_128()
    pos = 0
    while pos < size:
        chunk = os.pread(fd, min(HASH_CHUNK, size - pos), pos)
        if not chunk:
            raise Changed("the cache file is shorter than the file")
        h.update(chunk)
        pos += len(chunk)
    return h.hexdigest()


def _read(fd: int, size: int, off: int) -> bytes:
    data = os.pread(fd, size, off)
    if len(data) != size:
        raise Changed("the cache file is shorter than the file")
    return data


def _reason(group: BaseExceptionGroup) -> BaseException:
    """What a failed set of parts means for the upload: Changed, else the first StoreError.

    The other members are then cancelled siblings or more of the same. A group holding
    anything else (a bug) or only cancellations stays as it is."""
    _, other = group.split((Changed, StoreError, trio.Cancelled))
    if other is None:
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
    def __init__(
        self,
        table: InodeTable,
        keys: StoreKeys,
        store: Store,
        config: UploadConfig,
        parts_limiter: trio.CapacityLimiter,
        stats: RetryStats,
        drained: DrainStats | None = None,
    ) -> None:
        self.table = table
        self.journal = table.journal
        self.keys = keys
        self.store = store
        self.config = config
        self.parts_limiter = parts_limiter
        self.stats = stats
        self.drained = drained if drained is not None else DrainStats()

    async def _send(
        self, progress: UploadProgress, nbytes: int, what: str, call: Callable[[], Awaitable[str]]
    ) -> str:
        """One part or single PUT, retried, timed and counted."""
        t0 = trio.current_time()
        result = await retrying(what, call, self.config.retry, self.stats)
        self.drained.part_seconds.observe(trio.current_time() - t0)
        self.drained.bytes += nbytes
        progress.sent += nbytes
        return result

    async def _retry(self, what: str, call):  # type: ignore[no-untyped-def]
        return await retrying(what, call, self.config.retry, self.stats)

    async def upload(self, ino: Inode, progress: UploadProgress | None = None) -> None:
        """Upload ``ino`` and mark it clean if it did not change meanwhile.

        Raises StoreError (the file stays dirty) or Changed. Cancellation keeps the journal's
        upload record, so the next attempt (or the next mount) resumes it."""
        gen, size = ino.generation, ino.size
        key = self.keys.key_of(ino.id)
        if progress is None:
            progress = UploadProgress(ino.id, key)
        progress.size = size
        fd = self.table.cache.open(ino.id)
        try:
            record = self.journal.get_upload(ino.id)
            resumable = (
                record is not None
                and record.generation == gen
                and record.key == key
                and record.size == size
            )
            if record is not None and not resumable:
                await self.discard(record)
                record = None
            if record is None:
                t0 = trio.current_time()
                checksum = await trio.to_thread.run_sync(_hash_file, fd, size)
                log.info(
                    "uploading %s: %d bytes, checksummed in %.2f s",
                    key,
                    size,
                    trio.current_time() - t0,
                )
                if ino.generation != gen:
                    raise Changed("written while being hashed")
                record = UploadRow(ino.id, gen, key, None, 0, size, checksum)
            meta = {
                META_CHECKSUM: record.checksum,
                "size": str(size),
                "mtime-ns": str(ino.mtime_ns),
                "mode": f"{ino.mode & 0o7777:o}",
            }
            if size <= self.config.multipart_threshold:
                etag = await self._single(ino, fd, record, meta, progress)
            else:
                etag = await self._multipart(ino, fd, record, meta, progress)
        finally:
            os.close(fd)
        self._finish(ino, record, etag)
        self.drained.files += 1

    async def _single(
        self,
        ino: Inode,
        fd: int,
        record: UploadRow,
        meta: dict[str, str],
        progress: UploadProgress,
    ) -> str:
        self._begin(ino, record)
        data = await trio.to_thread.run_sync(_read, fd, record.size, 0)
        if ino.generation != record.generation:
            raise Changed("written during the upload")
        result: str = await self._send(
            progress,
            len(data),
            f"upload {record.key}",
            lambda: self.store.put(record.key, data, meta),
        )
        return result

    async def _multipart(
        self,
        ino: Inode,
        fd: int,
        record: UploadRow,
        meta: dict[str, str],
        progress: UploadProgress,
    ) -> str:
        done: dict[int, str] = {}
        if record.upload_id is not None:
            try:
                listed = await self._retry(
                    f"list parts of {record.key}",
                    lambda: self.store.list_parts(record.key, record.upload_id or ""),
                )
            except NotFound:
                listed = None
            if listed is None:
                self._drop(record)
                record.upload_id = None
            else:
                journaled = self.journal.parts(ino.id)
                done = {n: e for n, e in journaled.items() if listed.get(n) == e}
                log.info("resuming upload of %s: %d parts already there", record.key, len(done))
        if record.upload_id is None:
            record.part_size = part_size_for(record.size, self.config.part_size)
            record.upload_id = await self._retry(
                f"create upload of {record.key}",
                lambda: self.store.create_multipart(record.key, meta),
            )
        self._begin(ino, record)
        count = -(-record.size // record.part_size)

        async def send(number: int, token: object) -> None:
            try:
                off = (number - 1) * record.part_size
                length = min(record.part_size, record.size - off)
                data = await trio.to_thread.run_sync(_read, fd, length, off)
                if ino.generation != record.generation:
                    raise Changed("written during the upload")
                etag: str = await self._send(
                    progress,
                    length,
                    f"part {number} of {record.key}",
                    lambda: self.store.upload_part(
                        record.key, record.upload_id or "", number, data
                    ),
                )
            finally:
                self.parts_limiter.release_on_behalf_of(token)
            with self.journal.transaction():
                self.journal.add_part(ino.id, number, etag)
            done[number] = etag

        skipped, t_parts = len(done), trio.current_time()
        progress.sent = progress.resumed = sum(
            min(record.part_size, record.size - (n - 1) * record.part_size) for n in done
        )
        try:
            async with trio.open_nursery() as nursery:
                for n in range(1, count + 1):  # in file order: the cache file is read in order
                    if n not in done:
                        token = object()
                        await self.parts_limiter.acquire_on_behalf_of(token)
                        nursery.start_soon(send, n, token)
        except BaseExceptionGroup as group:
            raise _reason(group) from None
        log.info(
            "sent %d parts of %s in %.2f s",
            count - skipped,
            record.key,
            trio.current_time() - t_parts,
        )
        etags = [done[n] for n in range(1, count + 1)]
        etag: str = await self._retry(
            f"complete {record.key}",
            lambda: self.store.complete_multipart(record.key, record.upload_id or "", etags),
        )
        return etag

    # -- journal transitions -----------------------------------------------------------------------

    def _begin(self, ino: Inode, record: UploadRow) -> None:
        with self.journal.transaction():
            self.journal.put_upload(record)
            if ino.state is State.DIRTY and ino.generation == record.generation:
                ino.state = State.UPLOADING
                self.table.persist(ino)

    def _drop(self, record: UploadRow) -> None:
        with self.journal.transaction():
            self.journal.drop_upload(record.inode)

    def _finish(self, ino: Inode, record: UploadRow, etag: str) -> None:
        """The object is complete at record.key. Mark clean if nothing changed meanwhile."""
        current = ino.parent is not None and ino.generation == record.generation
        with self.journal.transaction():
            self.journal.drop_upload(ino.id)
            if not current:
                # Written or unlinked while uploading: the object is stale or unwanted.
                if ino.parent is None or self.keys.key_of(ino.id) != record.key:
                    self.journal.add_store_op("delete", record.key)
                elif ino.stored_key is None:
                    ino.stored_key, ino.stored_etag = record.key, etag
                    self.table.persist(ino)
                return
            key = self.keys.key_of(ino.id)
            if key != record.key:  # renamed while uploading: complete, then move
                self.journal.add_store_op("move", record.key, key, etag)
            ino.stored_key, ino.stored_etag = key, etag
            ino.checksum = record.checksum
            ino.state = State.CLEAN
            self.table.persist(ino)
        self.keys.note_stored(record.key)
        self.keys.wake()
        self.table.on_clean()  # evictable now: a writer waiting for room may go on

    async def discard(self, record: UploadRow) -> None:
        """Abort an upload nobody wants any more, and forget it."""
        if record.upload_id is not None:
            with contextlib.suppress(StoreError):
                await self._retry(
                    f"abort upload of {record.key}",
                    lambda: self.store.abort_multipart(record.key, record.upload_id or ""),
                )
        self._drop(record)

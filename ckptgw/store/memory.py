"""A store in memory, for tests and benches: it counts calls per method and fails them on
request, so that retries, listings that break off and copies in parts can be checked without
a server (and, under trio's mock clock, without waiting)."""

from __future__ import annotations

import collections
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from ckptgw.store.interface import (
    Body,
    Listing,
    NotFound,
    ObjectInfo,
    Stale,
    Store,
    StoreError,
    Upload,
    check_copy,
)

#: Awaited before a call goes on (e.g. to hold it, or to change the store meanwhile).
Hook = Callable[[], Awaitable[None]]
#: What :meth:`MemoryStore.fail` queues for a call: an error to raise, or a hook to await first.
Fault = StoreError | Hook


class MemoryStore(Store):
    """A store in a dict that counts calls per method and fails them on request: ``fail``
    queues faults (an error to raise, or a hook to await first) for a method's next calls,
    ``cut`` makes a listing raise after it has yielded some items."""

    def __init__(self, copy_limit: int | None = None) -> None:
        self.url = "mem://test/"
        self.copy_limit = copy_limit
        self.objects: dict[str, tuple[bytes, dict[str, str], str]] = {}  # data, metadata, ETag
        self.uploads: dict[str, tuple[str, dict[str, str], dict[int, tuple[bytes, str]]]] = {}
        self.calls: collections.Counter[str] = collections.Counter()
        self.faults: dict[str, list[Fault]] = collections.defaultdict(list)
        self.cuts: dict[str, list[tuple[int, StoreError]]] = collections.defaultdict(list)
        self._serial = itertools.count(1)

    def fail(self, method: str, *faults: Fault) -> None:
        self.faults[method].extend(faults)

    def cut(self, method: str, after: int, error: StoreError) -> None:
        self.cuts[method].append((after, error))

    async def _enter(self, method: str) -> None:
        self.calls[method] += 1
        await trio.lowlevel.checkpoint()
        if self.faults[method]:
            fault = self.faults[method].pop(0)
            if isinstance(fault, StoreError):
                raise fault
            await fault()

    def _etag(self) -> str:
        return f"etag-{next(self._serial)}"

    def _upload(self, upload_id: str) -> tuple[str, dict[str, str], dict[int, tuple[bytes, str]]]:
        if upload_id not in self.uploads:
            raise NotFound(f"upload {upload_id}: not found", "NoSuchUpload")
        return self.uploads[upload_id]

    async def check(self) -> None:
        await self._enter("check")

    async def put(self, key: str, data: bytes, metadata: dict[str, str]) -> str:
        await self._enter("put")
        etag = self._etag()
        self.objects[key] = (data, dict(metadata), etag)
        return etag

    async def get(
        self, key: str, start: int = 0, end: int | None = None, *, etag: str | None = None
    ) -> bytes:
        await self._enter("get")
        if key not in self.objects:
            raise NotFound(f"GET {key}: not found")
        data, _, current = self.objects[key]
        if etag is not None and etag != current:
            raise Stale(f"GET {key}: changed")
        return data[start:end]

    async def head(self, key: str) -> ObjectInfo | None:
        await self._enter("head")
        if key not in self.objects:
            return None
        data, metadata, etag = self.objects[key]
        return ObjectInfo(key, len(data), etag, dict(metadata))

    async def delete(self, key: str) -> None:
        await self._enter("delete")
        self.objects.pop(key, None)

    async def delete_many(self, keys: list[str]) -> None:
        await self._enter("delete_many")
        for key in keys:
            self.objects.pop(key, None)

    async def copy(self, src: str, dst: str, metadata: dict[str, str] | None = None) -> str:
        await self._enter("copy")
        check_copy(src, dst, metadata)
        if src not in self.objects:
            raise NotFound(f"COPY {src}: not found")
        data, old, _ = self.objects[src]
        assert self.copy_limit is None or len(data) <= self.copy_limit, "too big for one copy"
        etag = self._etag()
        self.objects[dst] = (data, old if metadata is None else dict(metadata), etag)
        return etag

    async def iter_objects(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        self.calls["iter_objects"] += 1
        cut = self.cuts["iter_objects"].pop(0) if self.cuts["iter_objects"] else None
        for n, key in enumerate(sorted(k for k in self.objects if k.startswith(prefix))):
            await trio.lowlevel.checkpoint()
            if cut is not None and n == cut[0]:
                raise cut[1]
            if key in self.objects:
                data, _, etag = self.objects[key]
                yield ObjectInfo(key, len(data), etag)

    async def list_dir(self, prefix: str) -> Listing:
        await self._enter("list_dir")
        objects = [ObjectInfo(k, len(d), e) for k, (d, _, e) in sorted(self.objects.items())]
        return Listing([o for o in objects if o.key.startswith(prefix)], [])

    async def put_tags(self, key: str, tags: dict[str, str]) -> None:
        await self._enter("put_tags")

    async def get_lifecycle(self) -> list[dict[str, Any]]:
        await self._enter("get_lifecycle")
        return []

    async def put_lifecycle(self, rules: list[dict[str, Any]]) -> None:
        await self._enter("put_lifecycle")

    async def create_multipart(self, key: str, metadata: dict[str, str]) -> str:
        await self._enter("create_multipart")
        upload_id = f"up{next(self._serial)}"
        self.uploads[upload_id] = (key, dict(metadata), {})
        return upload_id

    async def upload_part(
        self, key: str, upload_id: str, number: int, data: Body, crc32: int | None = None
    ) -> str:
        await self._enter("upload_part")
        etag = self._etag()
        self._upload(upload_id)[2][number] = (bytes(data), etag)  # data's buffer is reused
        return etag

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
        await self._enter("copy_part")
        parts = self._upload(upload_id)[2]
        if src not in self.objects:
            raise NotFound(f"COPY part {number} {src}: not found")
        data, _, current = self.objects[src]
        if etag is not None and etag != current:
            raise Stale(f"COPY part {number} {src}: changed")
        part_etag = self._etag()
        parts[number] = (data[start:end], part_etag)
        return part_etag

    async def list_parts(self, key: str, upload_id: str) -> dict[int, str]:
        await self._enter("list_parts")
        return {n: e for n, (_, e) in self._upload(upload_id)[2].items()}

    async def complete_multipart(self, key: str, upload_id: str, etags: list[str]) -> str:
        await self._enter("complete_multipart")
        _, metadata, parts = self._upload(upload_id)
        if [parts[n][1] for n in range(1, len(etags) + 1)] != etags:
            raise StoreError(f"COMPLETE {key}: wrong parts", temporary=False, code="InvalidPart")
        etag = self._etag()
        self.objects[key] = (
            b"".join(parts[n][0] for n in range(1, len(etags) + 1)),
            metadata,
            etag,
        )
        del self.uploads[upload_id]
        return etag

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        await self._enter("abort_multipart")
        self.uploads.pop(upload_id, None)

    async def iter_uploads(self, prefix: str) -> AsyncIterator[Upload]:
        self.calls["iter_uploads"] += 1
        cut = self.cuts["iter_uploads"].pop(0) if self.cuts["iter_uploads"] else None
        for n, (upload_id, (key, _, _)) in enumerate(sorted(self.uploads.items())):
            await trio.lowlevel.checkpoint()
            if cut is not None and n == cut[0]:
                raise cut[1]
            if key.startswith(prefix):
                yield Upload(key, upload_id, 0.0)

"""S3 and S3-compatible stores on aiobotocore (its aiohttp backend).

The client runs on an asyncio loop of its own (:mod:`ckptgw.store.loopthread`): aiohttp needs
asyncio, and of the HTTP layers aiobotocore can use it costs the least CPU per request (a C
header parser, bodies read from asyncio's protocol buffers; ARCHITECTURE.md, "The S3 client";
the measurements are in docs/benchmarks.md).

* Request bodies stream in 1 MiB chunks (:class:`ckptgw.store.s3http.ChunkedBody`).
* A PUT or part asks ``Expect: 100-continue`` (our botocore handler, in place of botocore's),
  so a request the store refuses (credentials, a bucket policy) costs no upload. aiohttp waits
  for the 100 without limit, and some proxies, load balancers and S3-compatible servers never
  send it: a request left unanswered for ``Deadlines.continue_wait`` is sent again at once
  without it, and the store asks that endpoint no more (one WARNING; ``ckptgw status`` says
  so). That is the same request in the form the endpoint speaks, at most once per call, not
  a retry of a failure.
* Every request is held to :class:`ckptgw.store.deadlines.Deadlines` by the store's
  :class:`ckptgw.store.deadlines.Watchdog` on the asyncio loop; an attempt past one fails with
  a temporary StoreError (``Stalled``, ``Timeout``), and one idle past
  ``Deadlines.stall_warning`` is logged once and listed by :meth:`S3Store.requests_view`.
* Retries happen in one place, :mod:`ckptgw.store.retry`: botocore's are off (one attempt per
  call), and so is aiohttp's own resend on a closed kept-alive connection
  (:class:`ckptgw.store.s3http.Session`), which would be neither counted nor logged.
* Every PUT and part carries its CRC32 (``x-amz-checksum-crc32``), so the store checks the
  bytes it received (a mismatch is ``BadDigest``, retried). A multipart upload names
  ``ChecksumAlgorithm=CRC32``, as boto3 does: the object's checksum is then the CRC32 of its
  parts' CRC32s (S3's COMPOSITE type), and the store computes no full-object checksum at
  CompleteMultipartUpload (which costs a server such as moto a pass over the whole object).
  The CRC is computed on a worker thread for a body over ``INLINE_CRC``.
* Every exception leaves this module as a classified :class:`StoreError`
  (:func:`ckptgw.store.s3errors.translate`).
* Credentials: the standard chain (environment, profile, instance metadata); ``AWS_CA_BUNDLE``
  is honoured by botocore, the endpoint URL comes from the config or ``AWS_ENDPOINT_URL``.
* Parts sent with :meth:`S3Store.upload_part_from` go from worker processes when a
  :class:`PartSender` is handed in (:func:`ckptgw.store.open.open_store` does).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import email.utils
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

import trio
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.handlers import add_expect_header

from ckptgw.store.crc import crc32, crc32_b64
from ckptgw.store.deadlines import (
    CHECK_ANSWER,
    NO_CONTINUE,
    RECEIVING,
    SENDING,
    Deadlines,
    OnStall,
    RequestWatch,
    Watchdog,
    limits,
)
from ckptgw.store.interface import (
    MAX_COPY,
    PIECE,
    Body,
    Described,
    Listing,
    NotFound,
    ObjectInfo,
    Progress,
    Store,
    StoreError,
    Upload,
    check_copy,
    is_marker,
    marker_error,
    short_read,
)
from ckptgw.store.loopthread import LoopThread
from ckptgw.store.s3errors import TEMPORARY_CODES, translate
from ckptgw.store.s3http import ChunkedBody, Session, sending
from ckptgw.store.url import StoreURL, without_userinfo

log = logging.getLogger(__name__)

INLINE_CRC = 1 << 20  # bodies up to this size have their CRC32 computed on the caller's thread
MAX_LISTED = 100  # requests in flight that status lists (the longest without progress)


def _pwritev_all(fd: int, buffers: list[bytes], offset: int) -> int:
    """Write every buffer at ``offset`` on; returns the bytes written."""
    total = sum(len(b) for b in buffers)
    done = 0
    while done < total:
        n = os.pwritev(fd, buffers, offset + done)
        done += n
        if done < total:  # a short write: drop what went out and write the rest
            while n >= len(buffers[0]):
                n -= len(buffers.pop(0))
            buffers[0] = buffers[0][n:]
    return total


async def crc32_value(data: Body) -> int:
    if len(data) <= INLINE_CRC:
        return crc32(data)
    return await trio.to_thread.run_sync(crc32, data)  # releases the GIL: 1.5 ms / 16 MiB


async def crc32_of(data: bytes) -> str:
    """The base64 of the big-endian CRC32 of ``data``, as ``x-amz-checksum-crc32`` wants it."""
    return crc32_b64(await crc32_value(data))


def _listed(o: dict[str, Any]) -> ObjectInfo:
    return ObjectInfo(
        str(o["Key"]), int(o["Size"]), str(o["ETag"]), mtime=_timestamp(o.get("LastModified"))
    )


def _info(key: str, r: dict[str, Any], size: int) -> ObjectInfo:
    """What a HEAD's (or a GET's) response says of the object."""
    crc = r.get("ChecksumCRC32")
    return ObjectInfo(
        key,
        size,
        str(r["ETag"]),
        dict(r.get("Metadata", {})),
        _timestamp(r.get("LastModified")),
        str(crc) if crc else None,
    )


def _whole_size(r: dict[str, Any]) -> int:
    """The object's size from a ranged GET's ``Content-Range: bytes a-b/SIZE`` (a store that
    sent the whole object instead: its length)."""
    try:
        return int(str(r["ContentRange"]).rsplit("/", 1)[1])
    except (KeyError, IndexError, ValueError):
        return int(r["ContentLength"])


def _timestamp(value: object) -> float:
    return value.timestamp() if isinstance(value, datetime.datetime) else 0.0


T = TypeVar("T")


def stall_text(watch: RequestWatch, endpoint: str, deadlines: Deadlines) -> str:
    """A stalled request for the log: what, where, since when, and what happens next."""
    _, limit = limits(watch, deadlines)
    idle = watch.idle(time.monotonic())
    if watch.phase == SENDING:
        moved = f", {_mib(watch.sent)} of {_mib(watch.size)} sent"
    elif watch.phase == RECEIVING:
        moved = f", {_mib(watch.received)} received"
    else:
        moved = ""
    return (
        f"{watch.what}: stalled at {endpoint}: no progress for {idle:.0f} s ({watch.phase}"
        f"{moved}); cancelled and sent again if it does not move within {limit:g} s"
    )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class PartSender(Protocol):
    """Who sends this store's parts from other processes (:class:`ckptgw.store.partpool.PartPool`,
    handed to the store by :func:`ckptgw.store.open.open_store`)."""

    usable: bool  # False once it gave up: parts go from this process again
    no_continue: str | None  # why its workers no longer ask Expect: 100-continue
    stalls: int  # parts that stalled in its workers

    async def upload_part(
        self,
        key: str,
        upload_id: str,
        number: int,
        fd: int,
        offset: int,
        length: int,
        *,
        checksum: bool,
        expect: bool = True,
    ) -> tuple[str, int]: ...

    def in_flight(self) -> list[dict[str, Any]]: ...

    def view(self) -> dict[str, object]: ...


class S3Store(Store):
    copy_limit = MAX_COPY
    #: Sends the parts of :meth:`upload_part_from` from worker processes; None: this process
    #: sends them.
    part_sender: PartSender | None = None

    def __init__(
        self,
        url: StoreURL,
        client: Any,
        loop: LoopThread,
        deadlines: Deadlines | None = None,
        pool_size: int = 32,
        on_stall: OnStall | None = None,
    ) -> None:
        self.url = str(url)
        self.bucket = url.bucket
        self._client = client
        self._loop = loop
        # The endpoint, as status, the log and the metrics name it: never a user or password.
        self.endpoint = without_userinfo(str(client.meta.endpoint_url))
        self.watchdog = Watchdog(
            deadlines or Deadlines(), self.endpoint, pool_size, on_stall or self._log_stall
        )
        # Whether PUTs and parts ask Expect: 100-continue; why not, once the endpoint left
        # one unanswered (None while it is asked).
        self.expect_continue = True
        self.no_continue: str | None = None
        # Uploads made with CRC32 checksums: upload id -> part number -> its CRC32, for the
        # complete, which must repeat them. Filled by upload_part, copy_part and list_parts
        # (a resumed upload); an upload whose checksums are unknown here sends none.
        self._crcs: dict[str, dict[int, str]] = {}

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        url: StoreURL,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_connections: int = 32,
        deadlines: Deadlines | None = None,
        on_stall: OnStall | None = None,
    ) -> AsyncIterator[S3Store]:
        """``on_stall``: told of each request that becomes stalled or moves again (on the
        asyncio thread); by default the first time is logged. Parts go from this process
        unless a :attr:`part_sender` is handed in (:func:`ckptgw.store.open.open_store`)."""
        deadlines = deadlines or Deadlines()
        config = AioConfig(
            # No SHA-256 of every body on the trio thread: integrity comes from TLS, the CRC32
            # of every PUT and part (which the store checks) and the content checksum, checked
            # when the object is read back (fsops.contentsum).
            s3={
                "addressing_style": "path" if endpoint_url else "auto",
                "payload_signing_enabled": False,
            },
            retries={"total_max_attempts": 1, "mode": "standard"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            connect_timeout=deadlines.connect_timeout,
            # a backstop only: the watchdog (ckptgw.store.deadlines) holds each request to its
            # phase's deadline first
            read_timeout=deadlines.read_timeout,
            max_pool_connections=max_connections,
            http_session_cls=Session,
        )
        loop = LoopThread()
        try:
            client_cm = get_session().create_client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=config
            )
            try:
                client = await loop.run(client_cm.__aenter__)
            except Exception as e:
                raise translate(e, f"connecting to {url}") from None
            try:
                store = cls(url, client, loop, deadlines, max_connections, on_stall)
                events = client.meta.events
                events.unregister("before-call.s3", add_expect_header)
                events.register("before-call.s3", store._ask_continue)
                events.register("before-send.s3", sending)
                yield store
            finally:
                with trio.CancelScope(shield=True):
                    await loop.run(lambda: client_cm.__aexit__(None, None, None))
        finally:
            loop.close()

    # -- deadlines and Expect: 100-continue --------------------------------------------------------

    def _ask_continue(self, model: Any, params: dict[str, Any], **kwargs: Any) -> None:
        """botocore's ``before-call`` (in place of its ``add_expect_header``): a PUT or part
        with a body asks Expect: 100-continue while this endpoint answers it."""
        body = params.get("body")
        if (
            self.expect_continue
            and model.http.get("method") in ("PUT", "POST")
            and isinstance(body, ChunkedBody)
            and len(body)
        ):
            params["headers"]["Expect"] = "100-continue"

    def stop_expect(self, why: str | None) -> None:
        """Ask this endpoint for no more 100 Continues; ``why`` is logged (once), None when
        someone else said it already (a part worker told by the daemon)."""
        if not self.expect_continue:
            return
        self.expect_continue = False
        self.no_continue = why or f"{self.endpoint} does not answer Expect: 100-continue"
        if why is not None:
            log.warning(
                "%s; PUTs and parts go without Expect: 100-continue from now on (a request "
                "the store refuses then costs its body)",
                why,
            )

    def _log_stall(self, watch: RequestWatch, stalled: bool) -> None:
        if stalled and not watch.warned:
            log.warning("%s", stall_text(watch, self.endpoint, self.watchdog.deadlines))

    def in_flight(self) -> list[dict[str, Any]]:
        """The requests in flight here and in the part workers, the longest without progress
        first; each says whether it is ``stalled``."""
        views = self.watchdog.views(time.monotonic())
        if self.part_sender is not None:
            views += self.part_sender.in_flight()
        return sorted(views, key=lambda v: -v["idle"])

    def requests_view(self) -> dict[str, Any]:
        """What ``ckptgw status`` shows of the endpoint and its requests."""
        dog = self.watchdog
        d = dog.deadlines
        requests = self.in_flight()
        pool = self.part_sender
        return {
            "endpoint": self.endpoint,
            "expect_continue": self.expect_continue,
            "no_continue": self.no_continue,
            "deadlines": {
                "connect": d.connect_timeout,
                "first_byte": d.first_byte_timeout,
                "stall": d.stall_timeout,
                "warning": d.stall_warning,
            },
            "in_flight": len(requests),
            "stalled": sum(v["stalled"] for v in requests),
            "requests": requests[:MAX_LISTED],
            "stalls": dog.stalls + (pool.stalls if pool is not None else 0),
            "cancelled": dog.cancelled,
        }

    def part_workers_view(self) -> dict[str, object] | None:
        return None if self.part_sender is None else self.part_sender.view()

    # -- calls -------------------------------------------------------------------------------------

    async def _run(
        self,
        what: str,
        make: Callable[[RequestWatch], Awaitable[T]],
        *,
        key: str = "",
        size: int = 0,
        slow: bool = False,
        answer: float | None = None,
    ) -> T:
        """One request, held to the deadlines. Sent with Expect: 100-continue and left
        without one, it goes again at once without it (see the module's docstring)."""
        dog = self.watchdog
        watch = dog.watch(what, key, size=size, slow=slow, answer=answer, now=time.monotonic())
        dog.add(watch)
        try:
            try:
                return await self._attempt(what, make, watch)
            except StoreError as e:
                if e.code != NO_CONTINUE:
                    raise
                self.stop_expect(str(e))
                watch.restart(time.monotonic())
                return await self._attempt(what, make, watch)
        finally:
            dog.remove(watch)

    async def _attempt(
        self, what: str, make: Callable[[RequestWatch], Awaitable[T]], watch: RequestWatch
    ) -> T:
        try:
            return await self._loop.run(lambda: self.watchdog.watched(watch, lambda: make(watch)))
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except concurrent.futures.CancelledError:
            raise StoreError(f"{what}: cancelled", temporary=True, code="Cancelled") from None
        except Exception as e:
            raise translate(e, what) from None

    async def _call(
        self,
        what: str,
        op: str,
        *,
        body: Body | None = None,
        slow: bool = False,
        answer: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """One botocore call; ``body``: the request's body (a fresh :class:`ChunkedBody` of
        it per attempt); ``slow``: the store works on a whole object before it answers."""

        def make(watch: RequestWatch) -> Awaitable[Any]:
            if body is not None:
                kwargs["Body"] = ChunkedBody(body, watch)
            call: Callable[..., Awaitable[Any]] = getattr(self._client, op)
            return call(Bucket=self.bucket, **kwargs)

        return await self._run(
            what,
            make,
            key=str(kwargs.get("Key", "")),
            size=0 if body is None else len(body),
            slow=slow,
            answer=answer,
        )

    async def check(self) -> None:
        what = f"checking bucket {self.bucket}"
        answer = min(self.watchdog.deadlines.first_byte_timeout, CHECK_ANSWER)
        try:
            await self._call(what, "head_bucket", answer=answer)
        except NotFound:  # HEAD has no body: a bare 404 is all S3 says
            raise StoreError(
                f"{what}: the bucket does not exist", temporary=False, code="NoSuchBucket"
            ) from None

    async def server_date(self) -> float | None:
        """The store's clock: the Date header of a HEAD of the bucket, in seconds since the
        epoch; None if the server sent none. ``ckptgw doctor`` compares it with ours (S3
        refuses requests signed more than 15 minutes off)."""
        r = await self._call(f"reading the clock of bucket {self.bucket}", "head_bucket")
        date = (r.get("ResponseMetadata", {}).get("HTTPHeaders") or {}).get("date")
        try:
            return email.utils.parsedate_to_datetime(str(date)).timestamp()
        except (TypeError, ValueError):
            return None

    async def put(self, key: str, data: bytes, metadata: dict[str, str]) -> str:
        if data and is_marker(key):  # S3 would take it; refused as FileStore must
            raise marker_error(key, f"PUT {key}")
        r = await self._call(
            f"PUT {key}",
            "put_object",
            body=data,
            Key=key,
            ContentLength=len(data),
            ChecksumCRC32=await crc32_of(data),
            Metadata=metadata,
        )
        return str(r["ETag"])

    async def get(
        self, key: str, start: int = 0, end: int | None = None, *, etag: str | None = None
    ) -> bytes:
        kwargs: dict[str, Any] = {"Key": key}
        if start or end is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        if etag is not None:
            kwargs["IfMatch"] = etag

        async def fetch(watch: RequestWatch) -> bytes:
            r = await self._client.get_object(Bucket=self.bucket, **kwargs)
            watch.to(RECEIVING, time.monotonic())
            chunks: list[bytes] = []
            got = 0
            async with r["Body"] as body:
                async for chunk in body.raw_stream.content.iter_any():
                    chunks.append(chunk)
                    got += len(chunk)
                    watch.moved(time.monotonic(), received=len(chunk))
            if got != int(r["ContentLength"]):  # aiohttp raises first, as a rule
                raise StoreError(
                    f"GET {key}: {got} of {r['ContentLength']} bytes arrived",
                    temporary=True,
                    code="Transport",
                )
            return b"".join(chunks)

        return await self._run(f"GET {key}", fetch, key=key)

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
        """The body is written as it arrives, on the client's thread: aiohttp's chunks are
        gathered into pieces of :data:`PIECE` bytes and each piece is one ``pwritev`` (no
        joined copy); ``progress`` is handed to trio after each. At most one piece per GET is
        in memory, whatever the range's size. ``described`` gets the response's headers as a
        HEAD would give them (the whole size from Content-Range)."""
        if end <= start:
            return
        kwargs: dict[str, Any] = {"Key": key, "Range": f"bytes={start}-{end - 1}"}
        if etag is not None:
            kwargs["IfMatch"] = etag
        token = trio.lowlevel.current_trio_token()

        def report(n: int) -> None:
            if progress is not None:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(progress, n)

        async def fetch(watch: RequestWatch) -> None:
            r = await self._client.get_object(Bucket=self.bucket, **kwargs)
            watch.to(RECEIVING, time.monotonic())
            if described is not None:
                info = _info(key, r, _whole_size(r))
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(described, info)
            written = 0
            pending: list[bytes] = []
            held = 0
            async with r["Body"] as body:
                async for chunk in body.raw_stream.content.iter_any():
                    if written + held + len(chunk) > end - start:
                        raise short_read(key, start, end, written + held + len(chunk))
                    pending.append(chunk)
                    held += len(chunk)
                    watch.moved(time.monotonic(), received=len(chunk))
                    if held >= PIECE or len(pending) >= 512:  # IOV_MAX is 1024
                        written += _pwritev_all(fd, pending, start + written)
                        pending, held = [], 0
                        report(written)
            if pending:
                written += _pwritev_all(fd, pending, start + written)
                report(written)
            if written != end - start:
                raise short_read(key, start, end, written)

        await self._run(f"GET {key} [{start}, {end})", fetch, key=key)

    async def head(self, key: str) -> ObjectInfo | None:
        try:
            # ChecksumMode: the store's CRC32 of the object, which checks a multipart upload's
            # content (no body, so botocore validates nothing itself).
            r = await self._call(f"HEAD {key}", "head_object", Key=key, ChecksumMode="ENABLED")
        except NotFound:
            return None
        return _info(key, r, int(r["ContentLength"]))

    async def delete(self, key: str) -> None:
        await self._call(f"DELETE {key}", "delete_object", Key=key)

    async def delete_many(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            what = f"DELETE {len(batch)} objects from {batch[0]}"
            r = await self._call(
                what,
                "delete_objects",
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
            errors = [e for e in r.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                e = errors[0]
                code = str(e.get("Code", ""))
                raise StoreError(
                    f"{what}: {len(errors)} failed, e.g. {e.get('Key')}: {code}",
                    temporary=code in TEMPORARY_CODES or code == "InternalError",
                    code=code,
                )

    async def put_tags(self, key: str, tags: dict[str, str]) -> None:
        tagset = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
        await self._call(f"TAG {key}", "put_object_tagging", Key=key, Tagging={"TagSet": tagset})

    async def get_lifecycle(self) -> list[dict[str, Any]]:
        try:
            r = await self._call("GET lifecycle", "get_bucket_lifecycle_configuration")
        except StoreError as e:
            if e.code == "NoSuchLifecycleConfiguration":
                return []
            raise
        return list(r.get("Rules", []))

    async def put_lifecycle(self, rules: list[dict[str, Any]]) -> None:
        if not rules:
            await self._call("DELETE lifecycle", "delete_bucket_lifecycle")
            return
        await self._call(
            "PUT lifecycle",
            "put_bucket_lifecycle_configuration",
            LifecycleConfiguration={"Rules": rules},
        )

    async def copy(self, src: str, dst: str, metadata: dict[str, str] | None = None) -> str:
        """One CopyObject (S3 refuses it above ``copy_limit``, 5 GiB: bigger objects are
        copied by :meth:`ckptgw.store.retry.RetryingStore.copy`, part by part with ``copy_part``).

        With ``metadata``, MetadataDirective REPLACE (the only self-copy S3 allows). Either
        way the tags are copied, the storage class is not (the copy is STANDARD), and the
        copy is a new object: a new LastModified, and a new ETag if ``src`` was a multipart
        upload (else usually the same: the ETag of a single-part upload is the data's MD5,
        unless it is encrypted with SSE-KMS or SSE-C).

        The copy names CRC32 as well: the store computes the copy's own full-object CRC32.
        (moto, without it, gives the copy the source's COMPOSITE value as if it were the
        content's, which a client that validates checksums on GET rejects.)"""
        check_copy(src, dst, metadata)
        directive: dict[str, Any] = (
            {"MetadataDirective": "COPY"}
            if metadata is None
            else {"MetadataDirective": "REPLACE", "Metadata": metadata}
        )
        r = await self._call(
            f"COPY {src} -> {dst}",
            "copy_object",
            Key=dst,
            CopySource={"Bucket": self.bucket, "Key": src},
            ChecksumAlgorithm="CRC32",
            slow=True,
            **directive,
        )
        return str(r["CopyObjectResult"]["ETag"])

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
        kwargs: dict[str, Any] = {
            "Key": dst,
            "UploadId": upload_id,
            "PartNumber": number,
            "CopySource": {"Bucket": self.bucket, "Key": src},
            "CopySourceRange": f"bytes={start}-{end - 1}",
        }
        if etag is not None:
            kwargs["CopySourceIfMatch"] = etag
        r = await self._call(
            f"COPY part {number} {src} -> {dst}", "upload_part_copy", slow=True, **kwargs
        )
        result = r["CopyPartResult"]
        crcs = self._crcs.get(upload_id)
        if crcs is not None and result.get("ChecksumCRC32"):  # the store computed it
            crcs[number] = str(result["ChecksumCRC32"])
        return str(result["ETag"])

    async def iter_objects(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            r = await self._call(f"LIST {prefix}", "list_objects_v2", **kwargs)
            for o in r.get("Contents", []):
                yield _listed(o)
            if not r.get("IsTruncated"):
                return
            token = r["NextContinuationToken"]

    async def list_dir(self, prefix: str) -> Listing:
        objects: list[ObjectInfo] = []
        dirs: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": prefix, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            r = await self._call(f"LIST {prefix}", "list_objects_v2", **kwargs)
            # The prefix's own directory marker ("a/b/" of "a/b/") is not one of its objects.
            objects += [_listed(o) for o in r.get("Contents", []) if o["Key"] != prefix]
            dirs += [str(p["Prefix"]) for p in r.get("CommonPrefixes", [])]
            if not r.get("IsTruncated"):
                return Listing(objects, dirs)
            token = r["NextContinuationToken"]

    async def create_multipart(self, key: str, metadata: dict[str, str]) -> str:
        if is_marker(key):
            raise marker_error(key, f"CREATE-MULTIPART {key}")
        r = await self._call(
            f"CREATE-MULTIPART {key}",
            "create_multipart_upload",
            Key=key,
            Metadata=metadata,
            ChecksumAlgorithm="CRC32",
        )
        upload_id = str(r["UploadId"])
        self._crcs[upload_id] = {}
        return upload_id

    async def upload_part(
        self, key: str, upload_id: str, number: int, data: Body, crc32: int | None = None
    ) -> str:
        crcs = self._crcs.get(upload_id)
        if crcs is None:  # made without CRC32 checksums: its parts carry none
            return await self.send_part(key, upload_id, number, data, None)
        if crc32 is None:
            crc32 = await crc32_value(data)
        etag = await self.send_part(key, upload_id, number, data, crc32)
        crcs[number] = crc32_b64(crc32)
        return etag

    async def upload_part_from(
        self, key: str, upload_id: str, number: int, fd: int, offset: int, length: int
    ) -> tuple[str, int]:
        pool = self.part_sender
        if pool is None or not pool.usable:
            return await super().upload_part_from(key, upload_id, number, fd, offset, length)
        crcs = self._crcs.get(upload_id)
        try:
            etag, crc = await pool.upload_part(
                key,
                upload_id,
                number,
                fd,
                offset,
                length,
                checksum=crcs is not None,
                expect=self.expect_continue,
            )
        finally:
            if pool.no_continue is not None and self.expect_continue:  # a worker found out
                self.stop_expect(pool.no_continue or None)
        if crcs is not None:
            crcs[number] = crc32_b64(crc)
        return etag, crc

    async def send_part(
        self, key: str, upload_id: str, number: int, data: Body, crc32: int | None
    ) -> str:
        """One UploadPart request, carrying ``crc32`` if given; returns the ETag. What
        :meth:`upload_part` sends, without its bookkeeping (a part worker's request)."""
        kwargs: dict[str, Any] = {}
        if crc32 is not None:
            kwargs["ChecksumCRC32"] = crc32_b64(crc32)
        r = await self._call(
            f"PART {number} of {key}",
            "upload_part",
            body=data,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            ContentLength=len(data),
            **kwargs,
        )
        return str(r["ETag"])

    async def list_parts(self, key: str, upload_id: str) -> dict[int, str]:
        parts: dict[int, str] = {}
        crcs: dict[int, str] = {}
        marker = 0
        while True:
            r = await self._call(
                f"LIST-PARTS {key}",
                "list_parts",
                Key=key,
                UploadId=upload_id,
                PartNumberMarker=marker,
            )
            for p in r.get("Parts", []):
                parts[int(p["PartNumber"])] = str(p["ETag"])
                if p.get("ChecksumCRC32"):
                    crcs[int(p["PartNumber"])] = str(p["ChecksumCRC32"])
            if r.get("ChecksumAlgorithm") == "CRC32":  # an upload resumed after a restart
                self._crcs.setdefault(upload_id, {}).update(crcs)
            if not r.get("IsTruncated"):
                return parts
            marker = int(r["NextPartNumberMarker"])

    async def complete_multipart(self, key: str, upload_id: str, etags: list[str]) -> str:
        crcs = self._crcs.get(upload_id, {})
        if upload_id in self._crcs and len(crcs) < len(etags):  # e.g. parts copied
            await self.list_parts(key, upload_id)
        parts: list[dict[str, Any]] = [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]
        for part in parts:
            if part["PartNumber"] in crcs:
                part["ChecksumCRC32"] = crcs[part["PartNumber"]]
        r = await self._call(
            f"COMPLETE {key}",
            "complete_multipart_upload",
            slow=True,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},
        )
        self._crcs.pop(upload_id, None)
        return str(r["ETag"])

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        with contextlib.suppress(NotFound):
            await self._call(f"ABORT {key}", "abort_multipart_upload", Key=key, UploadId=upload_id)
        self._crcs.pop(upload_id, None)

    async def iter_uploads(self, prefix: str) -> AsyncIterator[Upload]:
        key_marker, id_marker = "", ""
        while True:
            kwargs: dict[str, Any] = {"Prefix": prefix}
            if key_marker:
                kwargs |= {"KeyMarker": key_marker, "UploadIdMarker": id_marker}
            r = await self._call(f"LIST-UPLOADS {prefix}", "list_multipart_uploads", **kwargs)
            for u in r.get("Uploads", []):
                yield Upload(str(u["Key"]), str(u["UploadId"]), u["Initiated"].timestamp())
            if not r.get("IsTruncated"):
                return
            key_marker, id_marker = r["NextKeyMarker"], r["NextUploadIdMarker"]

"""The HTTP layer under :class:`ckptgw.store.s3.S3Store`: request bodies aiohttp streams in big
chunks, the phases of a request as botocore and aiohttp go through them (for the deadlines of
:mod:`ckptgw.store.deadlines`), and aiobotocore's aiohttp session with its own resend off.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
from aiobotocore.httpsession import AIOHTTPSession

from ckptgw.store.deadlines import ANSWER, CONNECTING, CONTINUE, CURRENT, SENDING, RequestWatch
from ckptgw.store.interface import Body

CHUNK = 1 << 20


class ChunkedBody:
    """A request body botocore can read, seek and measure, and aiohttp streams in big
    chunks (its async iteration), which tells the request's watch how far it got."""

    def __init__(self, data: Body, watch: RequestWatch | None = None) -> None:
        self._data = memoryview(data)
        self._pos = 0
        self._watch = watch

    def __len__(self) -> int:
        return len(self._data)

    def read(self, n: int | None = -1) -> bytes:
        end = len(self._data) if n is None or n < 0 else min(len(self._data), self._pos + n)
        chunk = bytes(self._data[self._pos : end])
        self._pos = end
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, len(self._data))[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __iter__(self) -> Iterator[bytes]:
        while self._pos < len(self._data):
            yield self.read(CHUNK)

    async def __aiter__(self) -> AsyncIterator[memoryview]:
        """What aiohttp sends: views of the body, not copies of it. It asks for the first
        once the 100 Continue came (or at once, without Expect), and for each next one once
        the last is written out (its buffer drained): each is progress."""
        watch = self._watch
        if watch is not None:
            watch.to(SENDING, time.monotonic())
        while self._pos < len(self._data):
            end = min(len(self._data), self._pos + CHUNK)
            chunk = self._data[self._pos : end]
            self._pos = end
            yield chunk
            if watch is not None:  # asked for more: that one is written out
                watch.moved(time.monotonic(), sent=len(chunk))
        if watch is not None:
            watch.to(ANSWER, time.monotonic())


def sending(request: Any, **kwargs: Any) -> None:
    """botocore's ``before-send``: the request is signed and goes now (a connection, its
    head, then its body). Returns None: anything else would be taken as its response."""
    watch = CURRENT.get()
    if watch is not None:
        if request.headers.get("Expect") in (b"100-continue", "100-continue"):  # bytes here
            watch.expect = True
            # The wait for the 100 counts from when the head goes, on a connection: told by
            # the session's trace (_head_sent), where it has one; a slow connect is not an
            # unanswered Expect.
            phase = CONNECTING if Session.traced else CONTINUE
        else:
            phase = CONNECTING if watch.size else ANSWER
        watch.to(phase, time.monotonic())


async def _head_sent(session: object, ctx: object, params: object) -> None:
    """aiohttp's trace: the request's head is written, on a connection it has now."""
    watch = CURRENT.get()
    if watch is not None and watch.expect and watch.phase == CONNECTING:
        watch.to(CONTINUE, time.monotonic())


class Session(AIOHTTPSession):  # type: ignore[misc]  # aiobotocore has no types
    """aiobotocore's aiohttp session, with two changes to each aiohttp session it opens:

    * aiohttp sends an idempotent request (GET, HEAD, PUT, DELETE) again by itself when the
      kept-alive connection it was sent on turns out closed (RFC 9112 lets a client); such a
      retry (a lost answer to a DELETE, say) would be neither counted nor logged. It is
      turned off, so the error reaches :mod:`ckptgw.store.retry`, which retries it like any other.
    * a trace says when a request's head is written, on a connection (:func:`_head_sent`).

    Both are aiohttp session attributes without a public setter after construction (the
    session is made by aiobotocore); where they are missing, aiohttp's own behaviour stays
    and :data:`traced` stays False."""

    traced = False  # a session has the head-sent trace: the 100-continue wait starts there
    _trace = aiohttp.TraceConfig()
    _trace.on_request_headers_sent.append(_head_sent)
    _trace.freeze()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tuned: set[int] = set()  # the aiohttp sessions changed (they live as long)

    async def _get_session(self, proxy_url: Any) -> Any:
        session = await super()._get_session(proxy_url)
        if id(session) in self._tuned:
            return session
        self._tuned.add(id(session))
        if hasattr(session, "_retry_connection"):
            session._retry_connection = False
        configs = getattr(session, "_trace_configs", None)
        if isinstance(configs, list):
            configs.append(self._trace)
            Session.traced = True
        return session

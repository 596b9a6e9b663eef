"""A part worker: a process that reads multipart parts from cache files and sends them.

The daemon's :class:`ckptgw.store.partpool.PartPool` starts these (``python -m
ckptgw.store.partworker FD PARENT``) so that the bytes of uploads are read, checksummed and
sent by more than one interpreter. A worker runs its own :class:`ckptgw.store.s3.S3Store`; it
schedules nothing and journals nothing.

The protocol is :mod:`ckptgw.store.partwire`'s.

Credentials come only from the inherited environment and profile (the standard chain), never
from the command line or the socket. A worker ends when the daemon's end of the socket
closes, and is killed if the daemon dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from ckptgw.store.deadlines import Deadlines, RequestWatch
from ckptgw.store.interface import StoreError, read_part, take_buffer
from ckptgw.store.partbuffers import PartBuffers
from ckptgw.store.partwire import Message, error_message, receive, send
from ckptgw.store.url import parse_store_url

if TYPE_CHECKING:
    from ckptgw.store.s3 import S3Store

PR_SET_PDEATHSIG = 1


async def serve(raw: socket.socket) -> None:
    """Answer the daemon's requests until it closes its end."""
    from ckptgw.store.s3 import S3Store  # after the socket is known good: botocore is slow

    sock = trio.socket.from_stdlib_socket(raw)
    opening, fds = await receive(sock)
    for fd in fds:
        os.close(fd)
    if opening is None or opening.get("op") != "open":
        return
    sending = trio.Lock()

    async def answer(msg: Message) -> None:
        async with sending:
            with contextlib.suppress(OSError):  # the daemon is gone: the read loop ends too
                await send(sock, msg)

    stalls = _StallReports(trio.lowlevel.current_trio_token())
    try:
        async with S3Store.open(
            parse_store_url(opening["url"]),
            opening["endpoint_url"],
            deadlines=Deadlines.from_message(opening.get("deadlines") or {}),
            max_connections=int(opening["max_connections"]),
            on_stall=stalls.on_stall,
        ) as store:
            stalls.store = store
            await answer({"ready": True})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stalls.forward, answer)
                await _serve_parts(sock, store, answer, stalls)
                nursery.cancel_scope.cancel()
    except Exception as e:  # the daemon logs why (its stderr may be /dev/null)
        await answer({"fatal": f"{type(e).__name__}: {e}"})
        raise


class _StallReports:
    """Stalled requests of this worker's parts, told to the daemon (which logs them and
    lists them in status: a worker has no log of its own)."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token
        self.store: S3Store | None = None
        self.parts: dict[str, int] = {}  # a part's request label -> its request id
        self._send, self._receive = trio.open_memory_channel[Message](1000)

    def on_stall(self, watch: RequestWatch, stalled: bool) -> None:
        """On the client's asyncio thread: rare (twice per stall at most), so one wake-up
        of trio each."""
        from ckptgw.store.s3 import stall_text

        view: Message | None = None
        if stalled and self.store is not None:
            now = time.monotonic()
            text = stall_text(watch, self.store.endpoint, self.store.watchdog.deadlines)
            view = watch.view(now) | {"text": text}
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(self._queue, watch.what, view)

    def _queue(self, what: str, view: Message | None) -> None:
        rid = self.parts.get(what)
        if rid is not None:
            with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
                self._send.send_nowait({"id": rid, "stalled": view})

    async def forward(self, answer: Callable[[Message], Awaitable[None]]) -> None:
        async for msg in self._receive:
            await answer(msg)


async def _serve_parts(
    sock: trio.socket.SocketType,
    store: S3Store,
    answer: Callable[[Message], Awaitable[None]],
    stalls: _StallReports,
) -> None:
    # A part's cancel scope exists from the moment its request is read, so a cancel read
    # right after it (before its task has run) still reaches it.
    scopes: dict[int, trio.CancelScope] = {}
    buffers = PartBuffers()

    async def part(msg: Message, fd: int, scope: trio.CancelScope) -> None:
        rid = int(msg["id"])
        reply: Message = {"cancelled": True}
        buf = None
        what = f"PART {msg.get('number')} of {msg.get('key')}"  # S3Store.send_part's label
        stalls.parts[what] = rid
        if msg.get("expect") is False:
            store.stop_expect(None)  # the daemon found it out: said there already
        with scope:
            try:
                try:
                    offset, length = int(msg["offset"]), int(msg["length"])
                    buf = take_buffer(buffers, offset, length)
                    data, crc = await trio.to_thread.run_sync(read_part, fd, offset, length, buf)
                finally:
                    os.close(fd)
                etag = await store.send_part(
                    msg["key"],
                    msg["upload_id"],
                    int(msg["number"]),
                    data,
                    crc if msg["checksum"] else None,
                )
                reply = {"etag": etag, "crc": crc}
            except StoreError as e:
                reply = error_message(e)
            except (MemoryError, RuntimeError) as e:  # out of memory, or of threads: later
                reply = error_message(_unexpected(msg, e, temporary=True))
            except Exception as e:  # a bug: said as a permanent error, the worker goes on
                reply = error_message(_unexpected(msg, e, temporary=False))
        if buf is not None:  # cancelled: the request may still send from it (PartBuffers)
            (buffers.lost if scope.cancelled_caught else buffers.give)(buf)
        del scopes[rid]
        if stalls.parts.get(what) == rid:
            del stalls.parts[what]
        expect = {"expect": store.expect_continue, "no_continue": store.no_continue}
        await answer({"id": rid} | reply | expect)

    async with trio.open_nursery() as nursery:
        while True:
            msg, fds = await receive(sock)
            if msg is None:
                break
            if msg.get("op") == "cancel":
                scope = scopes.get(int(msg["id"]))
                if scope is not None:
                    scope.cancel()
            elif msg.get("op") == "part" and len(fds) == 1:
                scopes[int(msg["id"])] = scope = trio.CancelScope()
                nursery.start_soon(part, msg, fds[0], scope)
            else:  # not ours to guess: answer it as a bug, keep serving
                for fd in fds:
                    os.close(fd)
                if "id" in msg:
                    bad = StoreError(f"part worker: bad request {msg.get('op')!r}", temporary=False)
                    await answer({"id": msg["id"]} | error_message(bad))
        nursery.cancel_scope.cancel()


def _unexpected(msg: Message, e: BaseException, *, temporary: bool) -> StoreError:
    what = f"PART {msg.get('number')} of {msg.get('key')}"
    return StoreError(f"{what}: {type(e).__name__}: {e}", temporary=temporary, code="PartWorker")


def _die_with(parent: int) -> None:
    """Be killed when the daemon dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(
            "usage: python -m ckptgw.store.partworker FD PARENT_PID (started by the daemon)",
            file=sys.stderr,
        )
        return 2
    fd, parent = int(args[0]), int(args[1])
    _die_with(parent)
    raw = socket.socket(fileno=fd)
    try:
        trio.run(serve, raw)
    except KeyboardInterrupt:
        return 1
    finally:
        raw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

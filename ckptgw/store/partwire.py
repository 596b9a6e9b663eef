"""What the daemon and its part workers say to each other (:mod:`ckptgw.store.partpool`,
:mod:`ckptgw.store.partworker`).

The protocol, one JSON object per ``SOCK_SEQPACKET`` message on the socket ``FD``:

* daemon -> worker: first ``{"op": "open", "url", "endpoint_url", "deadlines",
  "max_connections"}`` (``deadlines``: :class:`ckptgw.store.deadlines.Deadlines`, the daemon's);
  then ``{"op": "part", "id", "key", "upload_id", "number", "offset", "length", "checksum",
  "expect"}`` with the cache file's descriptor (``SCM_RIGHTS``: the worker reads the file the
  daemon opened, no path and no second permission check), and ``{"op": "cancel", "id"}``.
  ``expect`` false: the endpoint does not answer Expect: 100-continue, ask it no more.
* worker -> daemon: ``{"ready": true}`` once its store is open; for each part one answer
  with its ``id``: ``{"etag", "crc"}``, ``{"error", "temporary", "code", "retry_after",
  "not_found"}`` (a classified :class:`StoreError`) or ``{"cancelled": true}``, each with
  ``"expect"`` (whether the worker still asks Expect: 100-continue) and ``"no_continue"``
  (why not); ``{"id", "stalled": {...}}`` when a part's request stalls (its
  :meth:`RequestWatch.view` and ``text``, the line to log) and ``{"id", "stalled": null}``
  when it moves again; and ``{"fatal": "..."}`` just before it exits on an error (the daemon
  logs it: a worker's stderr may be /dev/null).
"""

from __future__ import annotations

import array
import json
import os
import socket
from typing import Any

import trio

from ckptgw.store.interface import NotFound, StoreError

MAX_MESSAGE = 64 << 10
Message = dict[str, Any]


def encode(msg: Message) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


async def send(sock: trio.socket.SocketType, msg: Message, fd: int | None = None) -> None:
    """One message, with ``fd`` passed along if given."""
    ancillary = []
    if fd is not None:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]
    await sock.sendmsg([encode(msg)], ancillary)


async def receive(sock: trio.socket.SocketType) -> tuple[Message | None, list[int]]:
    """The next message and the descriptors that came with it; (None, []) at end of file."""
    data, ancillary, _, _ = await sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4 * 4))
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
            fds.extend(got)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


def error_message(e: StoreError) -> Message:
    return {
        "error": str(e),
        "temporary": e.temporary,
        "code": e.code,
        "retry_after": e.retry_after,
        "not_found": isinstance(e, NotFound),
    }


def error_of(msg: Message) -> StoreError:
    """The StoreError an answer describes (its class and classification kept)."""
    if msg.get("not_found"):
        return NotFound(str(msg["error"]), str(msg.get("code") or "NoSuchKey"))
    return StoreError(
        str(msg["error"]),
        temporary=bool(msg.get("temporary")),
        code=str(msg.get("code") or ""),
        retry_after=msg.get("retry_after"),
    )

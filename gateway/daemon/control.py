"""The daemon's side of the control socket, which every ``ckptgw`` command but ``mount`` uses to
talk to a running gateway (``status``, ``flush``, ``wait``, ``umount``, ``pin``, ``lifecycle``),
as does :func:`gateway.client.wait_durable` from training code.

A Unix stream socket, ``control.sock`` in the cache directory, mode 0600 (bound through
``/proc/self/fd`` of the directory when its path is too long for a socket address, see
:func:`gateway.protocol.socket_address`). A socket left by a dead daemon is replaced; the
cache dir's lock says it is ours. One request per connection, one JSON object per line each
way (a request is at most 1 MiB)::

    -> {"version": 1, "op": "status"}
    <- {"version": 1, "ok": true, "result": {...}}
    <- {"version": 1, "ok": false, "error": "one line"}

This module only frames, checks the version and dispatches; the operations are the handlers the
daemon passes in (``gateway.daemon.main.control_handlers``): ``status``; ``pending`` and ``flush``
with ``paths`` (relative to the mount's root; none means all of it), and ``pending`` with
``wait`` (seconds, at most 60: answered once nothing is pending or when the wait is up, with
``waited``; a daemon without it answers at once); ``pin`` with ``path`` and ``pin`` (false:
unpin); ``lifecycle_plan`` and ``lifecycle_apply`` with ``run``; ``lifecycle_rules`` with
``apply``; ``config`` (what the daemon runs with, for ``ckptgw doctor``) and ``probe_store``
(doctor's store checks, made by the daemon). A request whose ``version`` is missing or newer
than the daemon's is refused with an error that says to restart the gateway, so old daemons and
new clients fail clearly. A :class:`RequestError` (or ``ValueError``) from a handler goes back
as its message; anything else is logged and answered as an internal error. Handlers are async
(lifecycle ones talk to the store); the 10 s time limit covers reading the request, not them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from ckptgw.gateway.protocol import PROTOCOL_VERSION, socket_address

log = logging.getLogger(__name__)

MAX_REQUEST = 1 << 20
REQUEST_TIMEOUT = 10.0

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class RequestError(Exception):
    """A request the daemon refuses; its message goes back to the client as is."""


def socket_path(cache_dir: Path) -> Path:
    return cache_dir / "control.sock"


class ControlServer:
    def __init__(self, path: Path, handlers: dict[str, Handler]) -> None:
        self.path = path
        self.handlers = handlers

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # left by a daemon that died; the cache dir lock says it is ours
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with socket_address(self.path) as address:
                await sock.bind(address)
            os.chmod(self.path, 0o600)
            sock.listen(32)
        except BaseException:
            sock.close()
            raise
        listener = trio.SocketListener(sock)
        try:
            task_status.started()
            await trio.serve_listeners(self._serve, [listener])
        finally:
            with contextlib.suppress(OSError):
                self.path.unlink()

    async def _serve(self, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                with trio.fail_after(REQUEST_TIMEOUT):
                    line = await _read_line(stream)
                reply = await self._answer(line)
            except RequestError as e:
                reply = {"version": PROTOCOL_VERSION, "ok": False, "error": str(e)}
            except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError):
                return
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(json.dumps(reply).encode() + b"\n")

    async def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise RequestError("a request is a JSON object")
            version = request.get("version")
            if not isinstance(version, int) or version > PROTOCOL_VERSION:
                raise RequestError(
                    f"protocol version {version!r} is not supported (the daemon speaks "
                    f"{PROTOCOL_VERSION}); restart the gateway with this version of ckptgw"
                )
            handler = self.handlers.get(str(request.get("op")))
            if handler is None:
                raise RequestError(f"unknown operation {request.get('op')!r}")
            result = await handler(request)
            return {"version": PROTOCOL_VERSION, "ok": True, "result": result}
        except (ValueError, RequestError) as e:
            return {"version": PROTOCOL_VERSION, "ok": False, "error": str(e)}
        except Exception as e:
            log.exception("control request failed")
            return {"version": PROTOCOL_VERSION, "ok": False, "error": f"internal error: {e!r}"}


async def _read_line(stream: trio.SocketStream) -> bytes:
    buf = bytearray()
    while b"\n" not in buf:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REQUEST:
            raise RequestError("request too large")
    return bytes(buf.split(b"\n", 1)[0])

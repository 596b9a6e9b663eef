"""What the CLI, the client library and the daemon agree on: the control socket's protocol
version, the readiness pipe between ``ckptgw mount`` and the daemon it starts, and how both
ends reach a socket whose path is too long for a socket address.

It imports nothing heavy, so the CLI (``ckptgw status`` is the Kubernetes readiness and
liveness probe) starts without loading the filesystem, trio or the S3 client; the socket's
server is in :mod:`gateway.daemon.control`, the client in :mod:`gateway.client`."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

# The control socket's request/reply version (gateway/daemon/control.py serves it).
PROTOCOL_VERSION = 1
# ``ckptgw mount`` (and ``serve nfs``) passes the process it starts a pipe's fd in this
# variable; that one writes one line to it: ``ok``, ``ok warning: ...`` (mounted, with one
# warning) or ``error: ...``, after any number of ``wait: ...`` lines (what it waits for,
# which the CLI prints as they come).
READY_FD_ENV = "CKPTGW_READY_FD"

# The longest a ``pending`` request may ``wait`` in the daemon before it answers, in seconds.
MAX_WAIT = 60.0

_SUN_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux


@contextlib.contextmanager
def socket_address(path: str | os.PathLike[str]) -> Iterator[str]:
    """A name for the Unix socket ``path`` that fits in a socket address: the path itself, or,
    when it is too long (a deep cache dir), the same file reached through ``/proc/self/fd`` of
    its directory. The socket stays in the cache dir (0700) either way."""
    p = Path(path)
    if len(os.fsencode(p)) <= _SUN_PATH_MAX:
        yield str(p)
        return
    fd = os.open(p.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{p.name}"
    finally:
        os.close(fd)


class Readiness:
    """Tells whoever started us (``ckptgw mount``, ``serve nfs``, systemd) that we are ready,
    or why we are not."""

    def __init__(self) -> None:
        fd = os.environ.pop(READY_FD_ENV, None)
        self._fd = int(fd) if fd else None

    def _send(self, line: str) -> None:
        if self._fd is not None:
            try:
                os.write(self._fd, (line.rstrip("\n") + "\n").encode())
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def progress(self, line: str) -> None:
        """What we are waiting for, before ``ok`` or ``failed`` (e.g. a store that does not
        answer): the CLI prints it."""
        if self._fd is not None:
            with contextlib.suppress(OSError):  # whoever waited is gone: ok() says the same
                os.write(self._fd, f"wait: {line.strip()}\n".encode())

    def ok(self, warning: str | None = None) -> None:
        self._send("ok" if warning is None else f"ok warning: {warning}")
        notify = os.environ.get("NOTIFY_SOCKET")
        if notify:
            addr = "\0" + notify[1:] if notify.startswith("@") else notify
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(b"READY=1", addr)

    def failed(self, message: str) -> None:
        self._send(f"error: {message}")


def wait_seconds(value: object) -> float | None:
    """A ``pending`` request's ``wait`` as seconds (a number >= 0), or None if it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return None
    return float(value)

"""Talking to running gateways from the CLI and from training code.

    from ckptgw.gateway.client import wait_durable
    torch.save(state, "/mnt/ckpt/step_100/model.pt")
    wait_durable("/mnt/ckpt/step_100", timeout=600)   # in the store (status says whether
                                                      # that is on this node: store_local)

Every failure is a :class:`~gateway.errors.UserError` with one line that says what to do.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgw.gateway import registry
from ckptgw.gateway.errors import UserError
from ckptgw.gateway.mountpoint import FSTYPE, is_stale, mounted_fstype
from ckptgw.gateway.protocol import MAX_WAIT, PROTOCOL_VERSION, socket_address, wait_seconds
from ckptgw.gateway.render import entries as entries  # re-exported: the CLI words counts
from ckptgw.gateway.render import files as files
from ckptgw.gateway.render import size

CONNECT_TIMEOUT = 30.0
LONG_POLL = 10.0  # seconds a wait without a progress bar lets each ``pending`` request wait
BAR_POLL = 1.0  # and with one drawn (it answers at once when nothing is left either way)


class NotRunning(UserError):
    """No daemon answers for a mount."""


class NotDurable(UserError, TimeoutError):
    """The wait timed out; ``pending`` lists what is not durable yet."""

    def __init__(self, message: str, pending: dict[str, Any]) -> None:
        super().__init__(message)
        self.pending = pending


@dataclass(frozen=True)
class Mount:
    mountpoint: Path
    entry: registry.Entry

    def request(
        self, op: str, *, answer_within: float | None = None, **args: Any
    ) -> dict[str, Any]:
        """One request to the daemon; its result, or UserError. ``answer_within``: the
        seconds the daemon may take (default: CONNECT_TIMEOUT, plus a ``pending``'s wait)."""
        path = self.entry.control
        if not path:
            raise NotRunning(f"the gateway for {self.mountpoint} has no control socket")
        # A ``pending`` may wait in the daemon first (a bad wait: none, the daemon refuses it).
        timeout = answer_within or (
            CONNECT_TIMEOUT + min(wait_seconds(args.get("wait", 0)) or 0.0, MAX_WAIT)
        )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            try:
                with socket_address(path) as address:
                    s.connect(address)
                s.sendall(json.dumps({"version": PROTOCOL_VERSION, "op": op, **args}).encode())
                s.sendall(b"\n")
                data = b""
                while not data.endswith(b"\n"):
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        break
                    data += chunk
            except (FileNotFoundError, ConnectionRefusedError):
                raise NotRunning(
                    f"the gateway for {self.mountpoint} is not running (nothing listens on {path})"
                ) from None
            except TimeoutError:
                raise UserError(
                    f"the gateway for {self.mountpoint} did not answer in {timeout:.0f} s"
                ) from None
            except PermissionError:
                raise UserError(
                    f"no permission to talk to the gateway for {self.mountpoint} "
                    "(run as the user that mounted it)"
                ) from None
            except OSError as e:
                raise UserError(f"the gateway for {self.mountpoint}: {e.strerror}") from None
        try:
            reply = json.loads(data)
        except ValueError:
            raise NotRunning(f"the gateway for {self.mountpoint} went away") from None
        if not reply.get("ok"):
            raise UserError(str(reply.get("error", "the gateway refused the request")))
        result: dict[str, Any] = reply["result"]
        return result

    def relative(self, path: Path) -> str:
        rel = path.relative_to(self.mountpoint).as_posix()
        return "" if rel == "." else rel


def mounts() -> list[Mount]:
    """Every gateway running on this machine (registered, process alive), by mountpoint."""
    out = []
    d = registry.runtime_dir()
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            entry = registry.Entry(**json.loads(f.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if registry.alive(entry.pid):
            out.append(Mount(Path(entry.mountpoint), entry))
    return sorted(out, key=lambda m: str(m.mountpoint))


def mount_of(path: str | os.PathLike[str]) -> tuple[Mount, Path]:
    """The gateway a path lives on, and the path made absolute (not resolved: a resolve would
    ask the mount itself)."""
    p = Path(os.path.abspath(path))
    for candidate in (p, *p.parents):
        entry = registry.find(candidate)
        if entry is not None:
            return Mount(candidate, entry), p
        if mounted_fstype(candidate) == FSTYPE:
            if is_stale(candidate):
                raise NotRunning(f"the gateway for {candidate} is not running (the mount is stale)")
            raise NotRunning(
                f"no gateway for {candidate} is registered in {registry.runtime_dir()}: run this "
                "as the user that mounted it, with the same CKPTGW_RUNTIME_DIR"
            )
    raise UserError(f"{p} is not on a ckptgw mount")


def mount_at(mountpoint: str | os.PathLike[str]) -> Mount:
    mount, p = mount_of(mountpoint)
    if mount.mountpoint != p:
        raise UserError(f"{p} is not a ckptgw mountpoint (it is inside {mount.mountpoint})")
    return mount


Progress = Callable[[dict[str, Any]], None]


def describe(pending: dict[str, Any]) -> str:
    """What a ``pending`` answer holds, in one line: "2 files, 5.0 MiB (/mnt/a, /mnt/b)"."""
    shown = ", ".join(str(f["path"]) for f in pending["files"][:3])
    more = pending["count"] - min(3, pending["count"])
    return (
        f"{entries(pending)}, {size(pending['bytes'])} "
        f"({shown}{f' and {more} more' if more else ''})"
    )


def wait_until_durable(
    mount: Mount,
    paths: list[str],
    timeout: float | None,
    *,
    flush: bool = True,
    progress: Progress | None = None,
    poll: float = 0.2,
) -> dict[str, Any]:
    """Block until nothing at or below ``paths`` (all of the mount if empty) is only local.
    Returns the last ``pending`` answer; raises NotDurable at the timeout.

    Each ``pending`` request waits in the daemon until nothing is pending, or for
    ``BAR_POLL`` seconds when there is a progress bar to draw (``LONG_POLL`` when not): the
    answer comes the moment the last entry is durable, and the daemon asks itself again only
    when something changed (or once a second). A daemon of an older version answers at once:
    it is asked again every ``poll`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = mount.request("flush" if flush else "pending", paths=paths)
    while True:
        if progress is not None:
            progress(pending)
        if pending["count"] == 0:
            return pending
        if deadline is not None and time.monotonic() >= deadline:
            raise NotDurable(
                f"not durable after {timeout:g} s: {describe(pending)}",
                pending,
            )
        drawn = progress is not None and getattr(progress, "enabled", True)
        wait = BAR_POLL if drawn else LONG_POLL
        if deadline is not None:
            wait = max(0.0, min(wait, deadline - time.monotonic()))
        t0 = time.monotonic()
        pending = mount.request("pending", paths=paths, wait=wait)
        if "waited" not in pending:  # a daemon of an older version answers at once
            time.sleep(max(0.0, min(wait, poll) - (time.monotonic() - t0)))


def wait_durable(path: str | os.PathLike[str], timeout: float | None = None) -> None:
    """Block until the file or directory at ``path`` (on a ckptgw mount) is in the store.

    Drains it ahead of everything else. Raises :class:`NotDurable` (a ``TimeoutError``) when
    ``timeout`` seconds pass first, and :class:`~gateway.errors.UserError` when the path is not
    on a running gateway."""
    mount, p = mount_of(path)
    wait_until_durable(mount, [mount.relative(p)], timeout)


def flush(path: str | os.PathLike[str]) -> None:
    """Start draining the file or directory at ``path`` now; does not wait."""
    mount, p = mount_of(path)
    mount.request("flush", paths=[mount.relative(p)])

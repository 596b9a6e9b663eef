"""Mountpoints: what is mounted where, stale ckptgw mounts, and unmounting with fusermount3."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from pathlib import Path

from ckptgw.gateway.errors import UserError

log = logging.getLogger(__name__)

FSTYPE = "fuse.ckptgw"


def unescape(field: str) -> str:
    """A field of /proc/self/mounts or mountinfo, whose space, tab, newline and backslash are
    escaped as octal."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounted_fstype(path: Path) -> str | None:
    """The filesystem type mounted exactly at ``path``, or None."""
    target = str(path)
    found = None
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and unescape(parts[1]) == target:
                found = parts[2]  # the last one listed is the one on top
    return found


def existing_parent(path: Path) -> Path:
    """``path`` or its nearest existing parent (a cache dir or store not created yet)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def fusermount() -> str:
    exe = shutil.which("fusermount3")
    if exe is None:
        raise UserError("fusermount3 not found: install the fuse3 package (apt-get install fuse3)")
    return exe


def unmount(path: Path, *, lazy: bool = False) -> None:
    cmd = [fusermount(), "-u", *(["-z"] if lazy else []), str(path)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        detail = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        if "busy" in detail.lower():
            raise UserError(f"{path} is busy: files or directories on it are still in use")
        raise UserError(f"cannot unmount {path}: {detail}")


def is_stale(path: Path) -> bool:
    """True if ``path`` is a FUSE mount whose daemon is gone. ``stat`` may still succeed from
    the kernel's attribute cache, so ask for something only the daemon can answer."""
    try:
        os.listdir(path)
    except OSError as e:
        return e.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def prepare_mountpoint(path: Path) -> None:
    """Check that ``path`` can be mounted on; clear a stale mount a crashed ckptgw left."""
    fstype = mounted_fstype(path)
    if fstype is not None and fstype.startswith("fuse") and is_stale(path):
        if fstype != FSTYPE:
            raise UserError(
                f"mountpoint {path} is a dead mount of {fstype}; "
                f"unmount it first (fusermount3 -u {path})"
            )
        log.warning("clearing the stale mount left at %s by a ckptgw that died", path)
        unmount(path, lazy=True)
        fstype = mounted_fstype(path)
    try:
        os.stat(path)
    except FileNotFoundError:
        raise UserError(f"mountpoint {path} does not exist") from None
    except OSError as e:
        raise UserError(f"mountpoint {path}: {e.strerror}") from None
    if not os.path.isdir(path):
        raise UserError(f"mountpoint {path} is not a directory")
    if fstype is not None or os.path.ismount(path):
        what = "a ckptgw mount" if fstype == FSTYPE else f"a {fstype or 'mount'}"
        raise UserError(f"mountpoint {path} is busy: already {what} is mounted there")

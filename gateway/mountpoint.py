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


def _top_mount(path: Path) -> list[str] | None:
    """The /proc/self/mounts fields of the mount exactly at ``path`` (the top one), or None."""
    target = str(path)
    found = None
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 4 and unescape(parts[1]) == target:
                found = parts  # the last one listed is the one on top
    return found


def mounted_fstype(path: Path) -> str | None:
    """The filesystem type mounted exactly at ``path``, or None."""
    parts = _top_mount(path)
    return parts[2] if parts else None


def mount_options(path: Path) -> set[str]:
    """The options of the mount exactly at ``path``, or an empty set."""
    parts = _top_mount(path)
    return set(parts[3].split(",")) if parts else set()


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
            users = holders(path)
            named = "; ".join(f"{f} (pid {pid} {comm})" for pid, comm, f in users[:5])
            more = f"; and {len(users) - 5} more" if len(users) > 5 else ""
            raise UserError(
                f"{path} is busy: "
                + (f"in use by {named}{more}" if users else "files on it are still in use")
                + "; stop those processes or close the files, then umount again"
            )
        raise UserError(f"cannot unmount {path}: {detail}")


def holders(path: Path) -> list[tuple[int, str, str]]:
    """(pid, command, file) for every open file and working directory of a process that is on
    the mount at ``path``, as far as /proc lets us see (other users' processes need root)."""
    top = str(path).rstrip("/")
    found = []
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        base = f"/proc/{pid}"
        try:
            with open(f"{base}/comm") as f:
                comm = f.read().strip()
            links = [f"{base}/cwd"] + [f"{base}/fd/{fd}" for fd in os.listdir(f"{base}/fd")]
        except OSError:
            continue
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if target == top or target.startswith(top + "/"):
                found.append(
                    (pid, comm, target + (" (working directory)" if link.endswith("cwd") else ""))
                )
    return found


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
    if fstype is not None or os.path.ismount(path):
        what = "a ckptgw mount" if fstype == FSTYPE else f"a {fstype or 'mount'}"
        raise UserError(f"mountpoint {path} is busy: already {what} is mounted there")
    problem = directory_problem(path)
    if problem is not None:
        raise UserError(problem)


def directory_problem(path: Path) -> str | None:
    """What keeps an unmounted ``path`` from being mounted on, in one line that says what to
    do: missing, not a directory, not ours to mount on, or not empty (the mount would hide
    what is there)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return f"mountpoint {path} does not exist: mkdir -p {path}"
    except OSError as e:
        return f"mountpoint {path}: {e.strerror}"
    if not os.path.isdir(path):
        return f"mountpoint {path} is not a directory"
    if os.geteuid() != 0 and not os.access(path, os.W_OK):
        return (
            f"mountpoint {path} is not writable by you, so fusermount3 refuses it: chown it "
            "or mount as root"
        )
    with os.scandir(path) as it:
        names = sorted(e.name for e in it)
    if names:
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        return (
            f"mountpoint {path} is not empty ({len(names)} entries: {shown}): the mount would "
            "hide them; move them away or mount on an empty directory"
        )
    return None

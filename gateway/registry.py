"""Which gateways run on this machine: one small JSON file per mountpoint in a runtime dir.

``ckptgw umount`` uses it to find the daemon of a mountpoint; ``ckptgw status`` without a
mountpoint lists every entry. Entries of processes that are gone are ignored and removed.
The directory is ``$CKPTGW_RUNTIME_DIR``, else /run/ckptgw for root, else
``$XDG_RUNTIME_DIR/ckptgw``."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


def runtime_dir() -> Path:
    env = os.environ.get("CKPTGW_RUNTIME_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/run/ckptgw")
    xdg = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/ckptgw-{os.geteuid()}"
    return Path(xdg) / "ckptgw"


@dataclass
class Entry:
    mountpoint: str
    cache_dir: str
    store: str
    pid: int
    control: str = ""  # the control socket's path


def _file(mountpoint: Path) -> Path:
    digest = hashlib.sha1(str(mountpoint).encode()).hexdigest()[:16]
    return runtime_dir() / f"{digest}.json"


def alive(pid: int) -> bool:
    """True while the process runs (a zombie waiting to be reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def register(entry: Entry) -> None:
    d = runtime_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = _file(Path(entry.mountpoint))
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(entry)))
    tmp.replace(path)


def unregister(mountpoint: Path) -> None:
    path = _file(mountpoint)
    try:
        entry = Entry(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return
    if entry.pid == os.getpid():
        path.unlink(missing_ok=True)


def find(mountpoint: Path) -> Entry | None:
    path = _file(mountpoint)
    try:
        entry = Entry(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if not alive(entry.pid):
        path.unlink(missing_ok=True)
        return None
    return entry

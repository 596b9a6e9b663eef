"""The FUSE daemons the ``floor`` section measures beside ckptgw: ones that only pass a
directory through, so that what they cost a save is what FUSE itself costs on this machine.

* ``pyfuse3 pass-through``: :mod:`bench.floorfs`, built as ckptgw's mount is (pyfuse3,
  trio, kernel passthrough);
* ``libfuse passthrough_hp (C)``: libfuse's own example, multi-threaded C++ with kernel
  passthrough, where ``make floor-tools`` built it into the venv (or ``--floor-hp``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptgw.gateway.mountpoint import mounted_fstype

PYFUSE3 = "pyfuse3 pass-through"
LIBFUSE = "libfuse passthrough_hp (C)"
MOUNT_WAIT = 20.0  # seconds


def passthrough_hp() -> Path | None:
    """libfuse's passthrough_hp as ``make floor-tools`` installs it, if it did."""
    p = Path(sys.prefix) / "fuse" / "bin" / "passthrough_hp"
    return p if os.access(p, os.X_OK) else None


def daemons(hp: Path | None, passthrough: bool) -> dict[str, list[str]]:
    """Each floor daemon's command, to which SOURCE and MOUNTPOINT are appended; with kernel
    passthrough or without, as ckptgw's mount in the same round."""
    out = {PYFUSE3: [sys.executable, "-m", "bench.floorfs"]}
    if hp is not None:
        out[LIBFUSE] = [str(hp), "--foreground", "-o", "default_permissions"]
    if not passthrough:
        out[PYFUSE3].append("--no-passthrough")
        if LIBFUSE in out:
            out[LIBFUSE].append("--nopassthrough")
    return out


@contextmanager
def mounted(cmd: list[str], source: Path, mountpoint: Path) -> Iterator[Path]:
    """``source`` through the daemon ``cmd`` at ``mountpoint``, always unmounted after."""
    source.mkdir(parents=True)
    mountpoint.mkdir(parents=True)
    env = dict(os.environ)
    lib = Path(sys.prefix) / "fuse" / "lib"  # the libfuse that make built (passthrough)
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(lib), env.get("LD_LIBRARY_PATH")]))
    proc = subprocess.Popen([*cmd, str(source), str(mountpoint)], env=env)
    try:
        deadline = time.monotonic() + MOUNT_WAIT
        while not os.path.ismount(mountpoint):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[0]} did not mount {mountpoint} (exit {proc.poll()})")
            time.sleep(0.05)
        yield mountpoint
    finally:
        if mounted_fstype(mountpoint.resolve()) is not None:  # lazily: the daemon may be gone
            subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
        try:
            proc.wait(MOUNT_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

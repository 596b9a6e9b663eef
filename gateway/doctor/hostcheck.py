"""What ``ckptgw doctor`` checks on this machine: FUSE, the kernel's passthrough, the cache disk
and the mountpoint. Each check is one :class:`Check`, whose message says what to fix.

The checks change nothing that a mount would not: the O_DIRECT probe is a temp file, removed,
and the cache dir's lock is only tried (shared, and let go at once), never taken over."""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from ckptgw.fsops.cache import direct_io_refusal
from ckptgw.gateway.cachedir import space_problem
from ckptgw.gateway.config import Config
from ckptgw.gateway.mountpoint import (
    FSTYPE,
    directory_problem,
    existing_parent,
    is_stale,
    mounted_fstype,
)
from ckptgw.gateway.render import size
from ckptgw.gateway.storeplace import place_of

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"


@dataclass(frozen=True)
class Check:
    """One line of ``ckptgw doctor``: ``check`` names it (stable, for ``--json``)."""

    check: str
    status: str  # OK, WARN (does not fail the run), FAIL or INFO
    message: str

    def line(self) -> str:
        label = "FAIL" if self.status == FAIL else self.status
        return f"{label:<6}{self.message}"


def fuse_check() -> Check:
    """/dev/fuse opens, and fusermount3 (which mounts for users and unmounts for everyone)."""
    what = "fuse"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC))
    except FileNotFoundError:
        return Check(
            what,
            FAIL,
            "/dev/fuse is missing: load the fuse module (modprobe fuse); in a container, pass "
            "the device (--device /dev/fuse)",
        )
    except OSError as e:
        return Check(
            what, FAIL, f"/dev/fuse cannot be opened ({e.strerror}): run as root or fix its mode"
        )
    exe = shutil.which("fusermount3")
    if exe is None:
        return Check(
            what, FAIL, "fusermount3 not found: install the fuse3 package (apt-get install fuse3)"
        )
    if os.geteuid() != 0 and not os.stat(exe).st_mode & stat.S_ISUID:
        return Check(
            what, FAIL, f"{exe} is not setuid root, so only root can mount: chmod u+s {exe}"
        )
    return Check(what, OK, "/dev/fuse and fusermount3")


def passthrough_check(cfg: Config | None) -> Check:
    """Kernel FUSE passthrough: without it every byte goes through the daemon (slower, but
    nothing is wrong), so never a failure."""
    from ckptgw.fsops.passthrough import unavailable  # imports pyfuse3: only here

    if cfg is not None and not cfg.passthrough:
        return Check("passthrough", INFO, "FUSE passthrough is off (mount.passthrough = false)")
    why = unavailable(True)
    if why is not None:
        return Check(
            "passthrough",
            WARN,
            f"no FUSE passthrough: {why}; every byte goes through the daemon (slower saves)",
        )
    return Check("passthrough", OK, "FUSE passthrough (the kernel reads and writes cache files)")


def cache_checks(cfg: Config) -> list[Check]:
    """The cache dir may be made and written by us, its disk has room beyond ``cache.reserve``,
    takes O_DIRECT, and no running gateway holds it."""
    d = cfg.cache_dir
    base = existing_parent(d)
    where = f"cache dir {d}" + ("" if base == d else f" (to be made in {base})")
    if base == d and not d.is_dir():
        return [Check("cache-dir", FAIL, f"cache dir {d} is not a directory: choose --cache-dir")]
    if base == d and (uid := d.stat().st_uid) != os.geteuid():
        return [
            Check(
                "cache-dir",
                FAIL,
                f"cache dir {d} belongs to uid {uid}, not to uid {os.geteuid()}: mount as its "
                "owner or choose another --cache-dir",
            )
        ]
    if not os.access(base, os.W_OK | os.X_OK):
        return [
            Check(
                "cache-dir",
                FAIL,
                f"{where}: {base} is not writable by uid {os.geteuid()}: choose a --cache-dir "
                "on local NVMe that you may write",
            )
        ]
    out = [Check("cache-dir", OK, f"{where} is writable")]
    out.append(_space_check(cfg, base))
    out.append(_direct_io_check(cfg, base))
    out.append(_lock_check(d))
    return out


def _space_check(cfg: Config, base: Path) -> Check:
    problem = space_problem(cfg.cache_dir, cfg.reserve_bytes, cfg.cache_size)
    if problem is not None:
        return Check("cache-space", FAIL if problem.fatal else WARN, str(problem))
    st = os.statvfs(base)
    limit = "" if cfg.cache_size is None else f", cache.size {size(cfg.cache_size)}"
    return Check(
        "cache-space",
        OK,
        f"cache disk: {size(st.f_bavail * st.f_frsize)} free, cache.reserve "
        f"{size(cfg.reserve_bytes)}{limit}",
    )


def _direct_io_check(cfg: Config, base: Path) -> Check:
    """One aligned 4 KiB O_DIRECT write, as the cache does (fsops.cache), in a temp file."""
    if not cfg.direct_io:
        return Check("direct-io", INFO, "O_DIRECT is off (cache.direct_io = false)")
    place = place_of(base)
    refusal = direct_io_refusal(base)
    if refusal is not None:
        return Check(
            "direct-io",
            WARN,
            f"the cache disk ({place}) refuses O_DIRECT ({refusal}): cache writes go "
            "through the page cache (cache.early_writeback); local NVMe takes O_DIRECT",
        )
    return Check("direct-io", OK, f"O_DIRECT writes on the cache disk ({place})")


def _lock_check(d: Path) -> Check:
    """Whether a running gateway holds the cache dir (its flock): a second mount of it is
    refused, which is right while that gateway runs, so this is information."""
    try:
        fd = os.open(d / "lock", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return Check("cache-lock", OK, "cache dir not in use by a running gateway")
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        return Check(
            "cache-lock",
            INFO,
            f"cache dir {d} is in use by a running gateway (pid {pid}): mounting it again is "
            "refused until that one is unmounted (ckptgw status shows it)",
        )
    finally:
        os.close(fd)  # also lets go of a shared lock we got
    return Check("cache-lock", OK, "cache dir not in use by a running gateway")


def mountpoint_check(mp: Path) -> Check:
    """The mountpoint exists, is an empty directory we may mount on, and nothing is mounted
    there (a ckptgw mount whose gateway died is fine: mount clears it)."""
    what = "mountpoint"
    fstype = mounted_fstype(mp)
    if fstype == FSTYPE:
        if is_stale(mp):
            return Check(
                what, INFO, f"mountpoint {mp}: a ckptgw mount whose gateway died; mount clears it"
            )
        return Check(
            what, INFO, f"mountpoint {mp}: a gateway is mounted there (ckptgw status {mp})"
        )
    if fstype is not None:
        return Check(
            what,
            FAIL,
            f"mountpoint {mp} is busy: a {fstype} is mounted there: unmount it or choose another",
        )
    problem = directory_problem(mp)
    if problem is not None:
        return Check(what, FAIL, problem)
    return Check(what, OK, f"mountpoint {mp} is an empty directory, not mounted")

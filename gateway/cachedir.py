"""The cache directory: created 0700, locked so that only one gateway uses it at a time, and
checked for room (``space_problem``) before a mount."""

from __future__ import annotations

import fcntl
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ckptgw.gateway.errors import UserError
from ckptgw.gateway.mountpoint import existing_parent
from ckptgw.gateway.render import size


class CacheDirLock:
    """An exclusive flock on ``<cache_dir>/lock`` for the daemon's lifetime.

    The kernel drops the lock when the process dies, so a crashed gateway never blocks the
    next mount of the same cache dir."""

    def __init__(self, cache_dir: Path) -> None:
        self.path = cache_dir / "lock"
        try:
            cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = cache_dir.stat()
            if st.st_uid != os.geteuid():
                raise UserError(f"cache dir {cache_dir} belongs to uid {st.st_uid}, not to you")
            if stat.S_IMODE(st.st_mode) != 0o700:
                os.chmod(cache_dir, 0o700)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise UserError(f"cache dir {cache_dir}: {e.strerror}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self._fd)
            raise UserError(
                f"cache dir {cache_dir} is in use by another ckptgw (pid {holder})"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True)
class SpaceProblem:
    """What is wrong with the room on the cache disk, in one line that says what to do."""

    message: str
    # Nothing could ever be written (the disk is not larger than the reserve): every write
    # would wait cache.write_wait and then get ENOSPC, so the mount should be refused.
    fatal: bool

    def __str__(self) -> str:
        return self.message


def space_problem(
    cache_dir: Path, reserve: int, limit: int | None, cached: int = 0
) -> SpaceProblem | None:
    """Check the filesystem that holds ``cache_dir`` against ``cache.reserve`` (``reserve``) and
    ``cache.size`` (``limit``, None when unset), worst first:

    * its size is not larger than the reserve: nothing could ever be written (fatal);
    * less than the reserve is free now, even counting the ``cached`` bytes the cache's own
      files hold (they can be evicted once drained): writes wait and then get ENOSPC;
    * ``limit`` is more than the disk can hold beside the reserve: the limit is never reached.

    The size is what the gateway's user may fill (``f_bavail`` when empty, so blocks that ext4
    keeps for root do not count), as in the room the cache charges writes against."""
    st = os.statvfs(existing_parent(cache_dir))
    capacity = (st.f_blocks - (st.f_bfree - st.f_bavail)) * st.f_frsize
    free = st.f_bavail * st.f_frsize
    where = f"the filesystem of cache dir {cache_dir}"
    if capacity <= reserve:
        return SpaceProblem(
            f"{where} is {size(capacity)}, not larger than cache.reserve ({size(reserve)}), "
            f"so nothing could ever be written to the cache: set cache.reserve to "
            f"{_setting(capacity // 4)} or less, or put cache.dir on a larger disk",
            fatal=True,
        )
    if free + cached < reserve:
        return SpaceProblem(
            f"{where} has {size(free)} free, less than cache.reserve ({size(reserve)}), so "
            f"writes will wait for room (cache.write_wait) and then fail with ENOSPC: make "
            f"{size(reserve - free - cached)} more room on that disk or lower cache.reserve",
            fatal=False,
        )
    if limit is not None and limit > capacity - reserve:
        return SpaceProblem(
            f"cache.size ({size(limit)}) is more than {where} can hold ({size(capacity)} less "
            f"cache.reserve {size(reserve)}), so the disk fills first: set cache.size to "
            f"{_setting(capacity - reserve)} or less",
            fatal=False,
        )
    return None


def _setting(n: int) -> str:
    """``n`` bytes rounded down to a whole unit, written the way the config takes sizes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f'"{n >> shift}{unit}"'
    return str(n)

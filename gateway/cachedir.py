"""The cache directory: created 0700, and locked so that only one gateway uses it at a time."""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from gateway.errors import UserError


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

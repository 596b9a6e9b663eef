"""Start and stop a gateway from Python through the real CLI (tests, benchmarks, the demo).

:meth:`Gateway.stop` always leaves no mount and no process behind: it unmounts cleanly if it
can, else lazily, and kills a daemon that does not exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from ckptgw.gateway import client, registry
from ckptgw.gateway.mountpoint import mounted_fstype


class GatewayError(RuntimeError):
    pass


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that ``with Gateway(...)`` blocks unmount on the way out
    (scripts that mount: the benchmarks and the demo)."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


class Gateway:
    def __init__(
        self,
        mountpoint: Path,
        cache_dir: Path,
        store: str,
        *extra_args: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.mountpoint = Path(mountpoint)
        self.cache_dir = Path(cache_dir)
        self.store = store
        self.extra_args = list(extra_args)
        self.env = dict(os.environ, **(env or {}))
        self.pid: int | None = None

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [sys.executable, "-m", "ckptgw.gateway.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if check and r.returncode != 0:
            raise GatewayError(f"ckptgw {' '.join(args)}: {r.stderr.strip()}")
        return r

    def try_mount(self, store: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``ckptgw mount`` for this gateway (optionally with another store); no checks."""
        with contextlib.suppress(OSError):  # a stale mount answers ENOTCONN: mount clears it
            self.mountpoint.mkdir(parents=True, exist_ok=True)
        args = ["mount", str(self.mountpoint), "--cache-dir", str(self.cache_dir)]
        url = store or self.store
        # The tests, benchmarks and the demo use file:// stores in temp dirs on purpose.
        local = ["--allow-local-store"] if url.startswith("file://") else []
        r = self.cli(*args, "--store", url, *local, *self.extra_args, check=False)
        if r.returncode == 0 and (entry := self._entry()) is not None:
            self.pid = entry.pid
        return r

    def start(self) -> Self:
        r = self.try_mount()
        if r.returncode != 0:
            raise GatewayError(f"ckptgw mount {self.mountpoint}: {r.stderr.strip()}")
        entry = self._entry()
        if entry is None:
            raise GatewayError(f"no daemon registered for {self.mountpoint}")
        self.pid = entry.pid
        return self

    def status(self) -> dict[str, Any]:
        """``ckptgw status --json`` of this gateway."""
        doc: dict[str, Any] = json.loads(self.cli("status", str(self.mountpoint), "--json").stdout)
        return doc

    def control(self) -> client.Mount:
        """This gateway's control socket, for requests (``pending``, ``flush``, ...)."""
        entry = self._entry()
        if entry is None:
            raise GatewayError(f"no daemon registered for {self.mountpoint}")
        return client.Mount(self.mountpoint, entry)

    def _entry(self) -> registry.Entry | None:
        old = os.environ.get("CKPTGW_RUNTIME_DIR")
        try:
            if "CKPTGW_RUNTIME_DIR" in self.env:
                os.environ["CKPTGW_RUNTIME_DIR"] = self.env["CKPTGW_RUNTIME_DIR"]
            return registry.find(self.mountpoint.resolve())
        finally:
            if old is None:
                os.environ.pop("CKPTGW_RUNTIME_DIR", None)
            else:
                os.environ["CKPTGW_RUNTIME_DIR"] = old

    def kill(self) -> None:
        """SIGKILL the daemon, as a crash would; the mount is left stale."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGKILL)
            self._wait_gone(self.pid, 10)
            self.pid = None

    def terminate(self, timeout: float = 120) -> None:
        """SIGTERM the daemon, as a node shutting down would, and wait for it to exit (it
        drains first, up to ``shutdown.deadline``); then make sure nothing is left behind."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGTERM)
            if not self._wait_gone(self.pid, timeout):
                raise GatewayError(f"the daemon (pid {self.pid}) did not exit after SIGTERM")
            self.pid = None
        self.stop()

    def stop(self, timeout: float = 60, *, drain: bool = False) -> None:
        """Unmount (at once, or after draining when ``drain``) and wait for the daemon; whatever
        fails, leave nothing behind. Data not drained stays in the cache for the next mount."""
        try:
            if mounted_fstype(self.mountpoint.resolve()) is not None:
                wait = str(timeout) if drain else "0"
                self.cli("umount", str(self.mountpoint), "--force", "--timeout", wait)
        finally:
            if mounted_fstype(self.mountpoint.resolve()) is not None:
                subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], check=False)
            if self.pid is not None and not self._wait_gone(self.pid, timeout):
                os.kill(self.pid, signal.SIGKILL)
                self._wait_gone(self.pid, 10)
            self.pid = None

    @staticmethod
    def _wait_gone(pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while registry.alive(pid):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

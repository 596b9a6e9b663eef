"""``ckptgw serve nfs``: NFS-Ganesha started, watched and stopped beside a gateway mount.

One supervisor process per exported mount keeps one ``ganesha.nfsd`` running while the gateway
runs. Its files are in ``CACHE_DIR/nfs/`` (0700): Ganesha's config, log and pid file, NFSv4
recovery records, its own log and ``serve.json``, the state that ``ckptgw status`` shows.

- Ganesha exits on its own: started again after 1, 2, 4 ... 30 s; the restarts are counted.
- The gateway's daemon dies (its pid is gone): Ganesha is stopped, and started again once the
  gateway is mounted again (a new daemon pid). Clients' file handles then work only if the new
  mount got the old one's device number (see gateway/nfs/export.py).
- The gateway is unmounted cleanly: the export ends, the supervisor exits.
- SIGTERM or SIGINT (``serve nfs --stop``, ``ckptgw umount``, systemd): Ganesha is stopped
  (SIGTERM, then SIGKILL after 10 s) and the supervisor exits. Ganesha is started with a
  parent-death signal, so a supervisor killed with SIGKILL takes it along."""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from ckptgw.gateway import registry
from ckptgw.gateway.errors import UserError
from ckptgw.gateway.mountpoint import FSTYPE, mounted_fstype
from ckptgw.gateway.nfs.export import Export, connected_clients, ganesha_binary, ganesha_conf
from ckptgw.gateway.protocol import Readiness

log = logging.getLogger(__name__)

STATE_FILE = "serve.json"
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
TICK = 1.0  # how often the gateway's daemon is looked at
_GANESHA_LINE = re.compile(r"\] \S+ :([A-Z0-9 _]+) :(CRIT|FATAL|MAJ) :(.*)$")
# Ganesha's complaints that are not about the export: no D-Bus here, no Kerberos configured.
_NOISE = ("DBUS", "NFS CB")


def state_dir(cache_dir: Path) -> Path:
    return cache_dir / "nfs"


def running(cache_dir: Path) -> dict[str, Any] | None:
    """The export of the mount whose cache dir this is, as its supervisor last wrote it, or
    None when no supervisor runs."""
    try:
        st: dict[str, Any] = json.loads((state_dir(cache_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return st if registry.alive(int(st.get("pid") or 0)) else None


def read_state(cache_dir: Path) -> dict[str, Any] | None:
    """What status shows: :func:`running`, and the clients connected now."""
    st = running(cache_dir)
    if st is None:
        return None
    gp = st.get("ganesha_pid")
    ports = (int(st["listen"].rsplit(":", 1)[1]), int(st["mount_port"]))
    st["connected"] = connected_clients(gp, ports) if gp else []
    return st


def stop(cache_dir: Path, timeout: float = STOP_TIMEOUT + 5) -> bool:
    """Stop the export of a mount; False if none was served."""
    st = running(cache_dir)
    if st is None:
        return False
    pid = int(st["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while registry.alive(pid):
        if time.monotonic() > deadline:
            raise UserError(
                f"the NFS export's supervisor (pid {pid}) did not stop in {timeout:.0f} s"
            )
        time.sleep(0.05)
    return True


def _gateway(mountpoint: Path) -> tuple[str, int]:
    """("up", daemon pid), ("dead", 0): mounted but its daemon is gone, or ("gone", 0)."""
    entry = registry.find(mountpoint)
    if mounted_fstype(mountpoint) != FSTYPE:
        # a registry entry whose daemon is gone: it died, and its mount was cleared since
        return ("dead" if entry is not None and not registry.alive(entry.pid) else "gone", 0)
    if entry is None or not registry.alive(entry.pid):
        return "dead", 0
    return "up", entry.pid


def ganesha_errors(text: str, last: int = 2) -> list[str]:
    """The last serious lines of a Ganesha log, each as "COMPONENT: message"."""
    found = []
    for line in text.splitlines():
        m = _GANESHA_LINE.search(line)
        if m and m.group(1).strip() not in _NOISE and "krb5" not in m.group(3):
            found.append(f"{m.group(1).strip()}: {m.group(3).strip()}")
    return found[-last:]


class Supervisor:
    def __init__(self, export: Export, cache_dir: Path, readiness: Readiness) -> None:
        self.export = export
        self.dir = state_dir(cache_dir)
        self.readiness = readiness
        self.ganesha: subprocess.Popen[bytes] | None = None
        self.served = 0  # the gateway daemon's pid that Ganesha serves
        self.state = "starting"
        self.reason = ""
        self.restarts = 0
        self.failures = 0  # in a row, for the backoff
        self.next_start = 0.0
        self.crashed = False
        self.last_error: str | None = None
        self.since = time.time()
        self.stopping = False
        self._pidfd = -1

    @property
    def log_path(self) -> Path:
        return self.dir / "ganesha.log"

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> int:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            status, pid = _gateway(self.export.mountpoint)
            error = self._start(pid) if status == "up" else "the gateway is not running"
            if error is not None:
                message = f"the NFS export of {self.export.mountpoint} failed: {error}"
                self.readiness.failed(message)
                log.error("%s", message)
                raise UserError(message)
            self.readiness.ok()
            self._loop(wake_r)
        finally:
            self._stop_ganesha()
            self.state, self.reason = "stopped", ""
            self._save()
            signal.set_wakeup_fd(-1)
            os.close(wake_r)
            os.close(wake_w)
        return 0

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True

    def _loop(self, wake_r: int) -> None:
        while not self.stopping:
            status, pid = _gateway(self.export.mountpoint)
            if self.ganesha is not None and pid != self.served:
                log.warning(
                    "the gateway at %s is %s: stopping NFS-Ganesha",
                    self.export.mountpoint,
                    "gone" if status == "gone" else "not running",
                )
                self._stop_ganesha()
            if status == "dead":
                self.crashed = True
                self._set(
                    "waiting", "the gateway's daemon is gone; waiting for it to be mounted again"
                )
            elif status == "gone" and not self.crashed:
                log.info("the gateway at %s was unmounted: the export ends", self.export.mountpoint)
                return
            elif status == "up" and self.ganesha is None and time.monotonic() >= self.next_start:
                error = self._start(pid)
                if error is not None:
                    self._failed(error)
            self._save()
            fds = [wake_r] + ([self._pidfd] if self.ganesha is not None else [])
            ready, _, _ = select.select(fds, [], [], TICK)
            if wake_r in ready:
                while True:
                    try:
                        if not os.read(wake_r, 64):
                            break
                    except BlockingIOError:
                        break
            if self.ganesha is not None and self.ganesha.poll() is not None and not self.stopping:
                code = self.ganesha.returncode
                self._close_ganesha()
                self.restarts += 1
                self._failed(f"NFS-Ganesha exited with code {code}" + self._why())

    # -- Ganesha ---------------------------------------------------------------------------------

    def _start(self, gateway_pid: int) -> str | None:
        """Start Ganesha for the gateway daemon ``gateway_pid``; None once it serves, else why
        not (and it is not running)."""
        conf = self.dir / "ganesha.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(ganesha_conf(self.export, self.dir))
        (self.dir / "recovery").mkdir(mode=0o700, exist_ok=True)
        if self.log_path.exists():
            self.log_path.replace(self.dir / "ganesha.log.1")
        cmd = [
            "setpriv", "--pdeathsig", "KILL", "--",
            ganesha_binary(), "-F", "-f", str(conf), "-L", str(self.log_path),
            "-p", str(self.dir / "ganesha.pid"), "-N", "NIV_EVENT",
        ]  # fmt: skip
        self._set("starting", "")
        self._save()
        self.ganesha = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        self._pidfd = os.pidfd_open(self.ganesha.pid)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline and not self.stopping:
            text = self._log_text()
            if self.ganesha.poll() is not None:
                code = self.ganesha.returncode
                self._close_ganesha()
                return f"NFS-Ganesha exited with code {code}" + self._why()
            if "Could not create export" in text:
                self._stop_ganesha()
                return "NFS-Ganesha could not export the mount" + self._why()
            if "NFS SERVER INITIALIZED" in text:
                self.served = gateway_pid
                self.crashed = False
                self.failures = 0
                self._set("serving", "")
                host, port = self.export.listen
                log.info("NFS-Ganesha (pid %d) serves %s as %s on %s:%d to %s",
                         self.ganesha.pid, self.export.mountpoint, self.export.pseudo, host,
                         port, ", ".join(self.export.clients))  # fmt: skip
                return None
            time.sleep(0.1)
        self._stop_ganesha()
        return f"NFS-Ganesha did not start serving in {READY_TIMEOUT:.0f} s" + self._why()

    def _why(self) -> str:
        lines = ganesha_errors(self._log_text())
        return (": " + "; ".join(lines) if lines else "") + f" (its log: {self.log_path})"

    def _log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _stop_ganesha(self) -> None:
        if self.ganesha is None:
            return
        if self.ganesha.poll() is None:
            self.ganesha.terminate()
            try:
                self.ganesha.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                log.warning("NFS-Ganesha (pid %d) ignored SIGTERM: killing it", self.ganesha.pid)
                self.ganesha.kill()
                self.ganesha.wait()
        self._close_ganesha()

    def _close_ganesha(self) -> None:
        os.close(self._pidfd)
        self.ganesha = None
        self.served = 0

    def _failed(self, error: str) -> None:
        delay = BACKOFF[min(self.failures, len(BACKOFF) - 1)]
        self.failures += 1
        self.next_start = time.monotonic() + delay
        self.last_error = error
        self._set("restarting", f"{error}; starting it again in {delay:.0f} s")
        log.error("%s; starting it again in %.0f s", error, delay)

    # -- what status shows -----------------------------------------------------------------------

    def _set(self, state: str, reason: str) -> None:
        if (state, reason) != (self.state, self.reason):
            self.since = time.time()
        self.state, self.reason = state, reason

    def _save(self) -> None:
        doc = {
            "pid": os.getpid(),
            "state": self.state,
            "reason": self.reason or None,
            "since": round(self.since, 3),
            "ganesha_pid": self.ganesha.pid if self.ganesha is not None else None,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "log": str(self.log_path),
            **self.export.describe(),
        }
        path = self.dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        tmp.replace(path)


def setup_logging(d: Path, foreground: bool) -> None:
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    fh = logging.handlers.RotatingFileHandler(d / "serve.log", maxBytes=4 << 20, backupCount=2)
    fh.setFormatter(fmt)
    root.addHandler(fh)
    if foreground:
        sh = logging.StreamHandler()
        sh.setFormatter(fmt)
        root.addHandler(sh)


def serve(export: Export, cache_dir: Path, foreground: bool) -> int:
    """Run the supervisor in this process until it is stopped."""
    d = state_dir(cache_dir)
    d.mkdir(mode=0o700, exist_ok=True)
    os.chmod(d, 0o700)  # whatever the umask made of it
    setup_logging(d, foreground)
    return Supervisor(export, cache_dir, Readiness()).run()

"""NFS on this machine without a kernel NFS client or server: a private network namespace
(loopback and its own rpcbind) for NFS-Ganesha, and a real user-space client (libnfs, through
tests/nfs/client.c) driven line by line. Used by tests/test_nfs.py and bench/."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.s3server import stop

SOURCE = Path(__file__).parent / "nfs" / "client.c"
NFS_PACKAGES = "apt-get install nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-dev"


def nfs_unavailable() -> str | None:
    """Why NFS cannot be tested here, or None."""
    if os.geteuid() != 0:
        return "needs root (a network namespace, and NFS-Ganesha)"
    for exe in ("ganesha.nfsd", "rpcbind", "unshare", "nsenter", "cc", "pkg-config"):
        if shutil.which(exe) is None:
            return f"{exe} is missing ({NFS_PACKAGES})"
    return None


# libnfs >= 5 that `make test` builds into the venv (deploy/nfs-client/libnfs.sh): Debian 12's
# libnfs 4.0 cannot write over NFSv4.
LIBNFS = Path(sys.prefix) / "nfs"


def nfs4_unavailable() -> str | None:
    """Why NFSv4 writes cannot be tested here (no libnfs >= 5 in the venv), or None."""
    if (why := nfs_unavailable()) is not None:
        return why
    if not (LIBNFS / ".built").exists():
        return f"no libnfs >= 5 in {LIBNFS} (make test builds it: deploy/nfs-client/libnfs.sh)"
    return None


def build_client(out_dir: Path) -> Path:
    """Compile the libnfs client into ``out_dir``: against the venv's libnfs where `make` built
    it (NFSv3 and NFSv4), else the system's (NFSv3 only with Debian 12's 4.0)."""
    exe = out_dir / "ckptgw-nfs-client"
    env = dict(os.environ)
    rpath: list[str] = []
    if (LIBNFS / ".built").exists():
        env["PKG_CONFIG_PATH"] = str(LIBNFS / "lib" / "pkgconfig")
        rpath = [f"-Wl,-rpath,{LIBNFS / 'lib'}"]
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "libnfs"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.split()
    subprocess.run(["cc", "-O2", "-Wall", "-o", str(exe), str(SOURCE), *flags, *rpath], check=True)
    return exe


GANESHA_READY = 30.0  # seconds for a plain Ganesha to serve


@contextlib.contextmanager
def plain_ganesha(
    ns: NetNs, root: Path, state: Path, *, port: int, pseudo: str, root_squash: bool = True
) -> Iterator[None]:
    """NFS-Ganesha exporting ``root``, a plain directory, with the configuration ``serve nfs``
    writes (gateway.nfs.export.ganesha_conf), NFSv4 only, on ``port`` in ``ns``: the floor that
    the bench and the conformance run compare ckptgw's export with. Stopped on exit."""
    from ckptgw.gateway.nfs.export import Export, ganesha_binary, ganesha_conf

    (state / "recovery").mkdir(parents=True)
    export = Export(
        mountpoint=root,
        pseudo=pseudo,
        clients=("127.0.0.1/32",),
        listen=("0.0.0.0", port),
        mount_port=port + 1,
        protocols=(4,),
        root_squash=root_squash,
        grace=0,
    )
    conf = state / "ganesha.conf"
    conf.write_text(ganesha_conf(export, state))
    log = state / "ganesha.log"
    argv = [ganesha_binary(), "-F", "-f", str(conf), "-L", str(log), "-p", str(state / "pid")]
    proc = subprocess.Popen(ns.argv(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + GANESHA_READY
        while "NFS SERVER INITIALIZED" not in (log.read_text() if log.exists() else ""):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"NFS-Ganesha for {root} did not serve: see {log}")
            time.sleep(0.1)
        yield
    finally:
        stop(proc, 30)


def serve_nfs(
    ns: NetNs, mountpoint: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """``ckptgw serve nfs MOUNTPOINT ARGS`` run inside ``ns`` (so Ganesha listens there)."""
    argv = [sys.executable, "-m", "ckptgw.gateway.cli", "serve", "nfs", str(mountpoint), *args]
    return subprocess.run(
        ns.argv(argv), env=env, capture_output=True, text=True, timeout=120, check=False
    )


class NetNs:
    """A network namespace with loopback up and an rpcbind of its own (NFSv3 servers register
    there). rpcbind runs in a private mount namespace too, so its socket in /run is not the
    node's. Everything in it is one process group, killed at close. Make it before the mounts
    it should serve: its private mount namespace holds a copy of every mount that exists when it
    starts, and a FUSE mount copied there stays alive after its unmount."""

    def __init__(self) -> None:
        script = (
            "ip link set lo up && "
            "{ unshare --mount sh -c "
            "'mount -t tmpfs -o mode=0755 ckptgw-test-run /run && exec rpcbind -f' & } && "
            "exec sleep infinity"
        )
        self.holder = subprocess.Popen(
            ["unshare", "--net", "--fork", "--kill-child", "sh", "-c", script],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        self.pid = self._child()
        deadline = time.monotonic() + 10
        while not self._rpcbind_up():
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("rpcbind did not start in the test's network namespace")
            time.sleep(0.05)

    def _child(self) -> int:
        """The pid of the namespace's first process (the shell that becomes sleep)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                kids = Path(f"/proc/{self.holder.pid}/task/{self.holder.pid}/children").read_text()
            except OSError:
                kids = ""
            if kids.split():
                return int(kids.split()[0])
            time.sleep(0.02)
        raise RuntimeError("the test's network namespace did not start")

    def _rpcbind_up(self) -> bool:
        r = subprocess.run(
            self.argv(["rpcinfo", "-p", "127.0.0.1"]), capture_output=True, check=False
        )
        return r.returncode == 0

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net", "--", *argv]

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.holder.pid, signal.SIGKILL)
        self.holder.wait(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class NfsError(RuntimeError):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"NFS error {code}: {message}")
        self.code = code  # the negative errno libnfs returned


class LineClient:
    """A child process driven one command line at a time; it answers each with one line,
    "ok ..." or "err CODE MESSAGE", and its first line says it is ready."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self._reply()  # ready, or NfsError

    def _reply(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line == "ok" or line.startswith("ok "):
            return line[3:]
        if line.startswith("err "):
            code, _, message = line[4:].partition(" ")
            raise NfsError(int(code), message)
        raise NfsError(-5, f"the client said {line!r} (exit {self.proc.poll()})")

    def cmd(self, *words: str | Path | int) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class NfsClient(LineClient):
    """One libnfs client session (tests/nfs/client.c): mounted at start, one command per call."""

    def __init__(self, exe: Path, ns: NetNs, url: str, timeout_ms: int = 60000) -> None:
        env = dict(os.environ, CKPTGW_NFS_TIMEOUT_MS=str(timeout_ms))
        super().__init__(ns.argv([str(exe), url]), env)  # "ok mounted", or NfsError

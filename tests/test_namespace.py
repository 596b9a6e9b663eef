"""The whole namespace on every node: regular files, directories (empty ones too), symlinks,
FIFOs, sockets, character and block devices, and ``user.*`` extended attributes survive a
kill -9 and a remount, reach the store, and come back on a fresh node with an empty cache.

pjdfstest (the public POSIX suite) runs against a mount when ``PJDFSTEST_DIR`` points at a
built copy of it; CI cannot fetch it, so the semantics it found broken are checked here too.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from tests.conftest import GatewayFactory, errno_of, needs_fuse
from tests.test_readthrough import Nodes, nodes  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.mount, needs_fuse]

ROOT = os.geteuid() == 0
XATTR = "user.ckptgw.step"


def make_tree(mnt: Path) -> None:
    """One entry of every kind, with modes, a target, device numbers and xattrs."""
    run = mnt / "run"
    (run / "step_1").mkdir(parents=True)
    f = run / "step_1" / "model.pt"
    f.write_bytes(b"weights" * 1000)
    f.chmod(0o640)
    os.setxattr(f, XATTR, b"1")
    os.setxattr(run / "step_1", "user.ckptgw.kind", b"checkpoint")
    (run / "step_2").mkdir(mode=0o750)  # made before its files: stays empty here
    (run / "step_2").chmod(0o750)
    (run / "last.ckpt").symlink_to("step_1/model.pt")  # Lightning's save_last="link"
    os.mkfifo(run / "pipe", 0o600)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(run / "sock"))
    s.close()
    if ROOT:
        os.mknod(run / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.mknod(run / "loop", stat.S_IFBLK | 0o660, os.makedev(7, 0))


def tree(mnt: Path) -> dict[str, tuple[object, ...]]:
    """What a node shows: per path its kind, mode bits, owner, target or device, xattrs."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(mnt):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            kind = stat.S_IFMT(st.st_mode)
            extra: object = None
            if stat.S_ISLNK(st.st_mode):
                extra = os.readlink(p)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                extra = st.st_rdev
            elif stat.S_ISREG(st.st_mode):
                extra = p.read_bytes()
            xattrs = {}
            if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                xattrs = {n: os.getxattr(p, n) for n in sorted(os.listxattr(p))}
            rel = str(p.relative_to(mnt))
            out[rel] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, extra, xattrs)
    return out


def test_every_kind_of_entry_reaches_a_fresh_node(nodes: Nodes) -> None:  # noqa: F811
    a = nodes.node("a")
    make_tree(a.mountpoint)
    # An attribute changed after the entry is in the store reaches it too (an in-place copy).
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0
    (a.mountpoint / "run/step_1/model.pt").chmod(0o600)
    os.setxattr(a.mountpoint / "run/step_1/model.pt", XATTR, b"2")
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0
    want = tree(a.mountpoint)
    assert want["run/step_1/model.pt"][1] == 0o600
    assert want["run/step_1/model.pt"][5] == {XATTR: b"2"}
    assert want["run/last.ckpt"][4] == "step_1/model.pt"

    b = nodes.node("b")
    assert tree(b.mountpoint) == want
    # The symlink resolves on B as on A; the FIFO is a FIFO the kernel serves.
    assert (b.mountpoint / "run/last.ckpt").read_bytes() == b"weights" * 1000
    assert stat.S_ISFIFO((b.mountpoint / "run/pipe").stat().st_mode)

    # A removal on A reaches B: the empty directory's marker and the symlink go.
    (a.mountpoint / "run/step_2").rmdir()
    (a.mountpoint / "run/last.ckpt").unlink()
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0
    c = nodes.node("c")
    names = sorted(os.listdir(c.mountpoint / "run"))
    assert "step_2" not in names and "last.ckpt" not in names and "pipe" in names


def test_a_fresh_node_reads_a_directorys_metadata_in_one_parallel_pass(
    nodes: Nodes,  # noqa: F811
) -> None:
    if nodes.kind != "s3":
        pytest.skip("counts the requests an S3 store gets")
    a = nodes.node("a")
    (a.mountpoint / "step_3").mkdir()
    for i in range(40):
        f = a.mountpoint / f"step_3/shard_{i:02}.distcp"
        f.write_bytes(os.urandom(5000 + i))
        f.chmod(0o600 if i % 2 else 0o640)
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0
    proxy = nodes.count_requests()
    b = nodes.node("b")

    def heads() -> list[str]:
        return [p for m, p, _ in proxy.log if m == "HEAD" and "/step_3/shard_" in p]

    names = sorted(os.listdir(b.mountpoint / "step_3"))
    assert len(names) == 40 and len(heads()) == 40  # each shard once, during the listing
    modes = {n: stat.S_IMODE((b.mountpoint / "step_3" / n).stat().st_mode) for n in names}
    assert modes == {f"shard_{i:02}.distcp": 0o600 if i % 2 else 0o640 for i in range(40)}
    assert len(heads()) == 40  # the lookups took what the listing read


def test_renaming_a_directory_moves_its_marker_and_everything_below(nodes: Nodes) -> None:  # noqa: F811
    a = nodes.node("a")
    (a.mountpoint / "tmp_step_5/empty").mkdir(parents=True, mode=0o700)
    (a.mountpoint / "tmp_step_5/empty").chmod(0o700)
    (a.mountpoint / "tmp_step_5").chmod(0o750)  # a marker of its own (not as a listing infers)
    (a.mountpoint / "tmp_step_5/link").symlink_to("empty")
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0
    os.rename(a.mountpoint / "tmp_step_5", a.mountpoint / "step_5")
    assert a.cli("flush", "--wait", "--timeout", "60").returncode == 0
    keys = set(nodes.objects())
    assert {"step_5/", "step_5/empty/", "step_5/link"} <= keys
    assert not any(k.startswith("tmp_step_5") for k in keys)
    b = nodes.node("b")
    assert os.readlink(b.mountpoint / "step_5/link") == "empty"
    assert stat.S_IMODE((b.mountpoint / "step_5/empty").stat().st_mode) == 0o700
    assert stat.S_IMODE((b.mountpoint / "step_5").stat().st_mode) == 0o750


def test_every_kind_of_entry_survives_kill_9_and_remount(gateway: GatewayFactory) -> None:
    gw = gateway()
    make_tree(gw.mountpoint)
    for p in (gw.mountpoint / "run", gw.mountpoint / "run/step_1"):
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)  # the contract: names are durable once their directory is fsynced
        os.close(fd)
    fd = os.open(gw.mountpoint / "run/step_1/model.pt", os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    want = tree(gw.mountpoint)
    gw.kill()
    gw.stop()
    gw.start()
    assert tree(gw.mountpoint) == want
    # And after the restart the drain still takes every kind to the store.
    assert gw.cli("flush", "--wait", "--timeout", "60").returncode == 0
    store = Path(gw.store.removeprefix("file://"))
    assert (store / "run/step_2").is_dir() and (store / "run/last.ckpt").is_file()


def test_special_files_behave_as_the_kernel_makes_them(mnt: Path) -> None:
    # A FIFO through the mount is a working pipe (the kernel serves it, not the daemon).
    os.mkfifo(mnt / "p", 0o600)
    r = os.open(mnt / "p", os.O_RDONLY | os.O_NONBLOCK)
    w = os.open(mnt / "p", os.O_WRONLY)
    os.write(w, b"through the pipe")
    assert os.read(r, 100) == b"through the pipe"
    os.close(w)
    os.close(r)
    assert errno_of(os.mkfifo, mnt / "p") == errno.EEXIST
    os.rename(mnt / "p", mnt / "q")
    assert stat.S_ISFIFO(os.lstat(mnt / "q").st_mode)
    os.unlink(mnt / "q")
    # xattrs only where Linux allows "user." ones, and never on this node only.
    (mnt / "d").mkdir()
    os.setxattr(mnt / "d", "user.a", b"1")
    assert os.getxattr(mnt / "d", "user.a") == b"1"
    assert errno_of(os.setxattr, mnt / "d", "trusted.a", b"1") in (errno.ENOTSUP, errno.EPERM)
    assert errno_of(os.setxattr, mnt / "d", "user.big", b"x" * 4000) == errno.ENOSPC
    # Hard links stay refused: an object store has no two names for one object.
    (mnt / "f").write_bytes(b"x")
    assert errno_of(os.link, mnt / "f", mnt / "g") == errno.EPERM


# pjdfstest's tests that fail only for the two documented choices (docs/conformance.md):
# hard links (EPERM), and paths whose key would be over 1,024 bytes (ENAMETOOLONG, where
# the suite expects PATH_MAX = 4,096 to work). Measured: 198 and 48 of 8,798 subtests.
HARD_LINKS = {
    "link/00.t", "link/02.t", "link/03.t", "link/06.t", "link/07.t", "link/09.t",
    "rename/00.t", "rename/23.t", "unlink/00.t",
}  # fmt: skip
LONG_KEYS = {
    "chmod/03.t", "chown/03.t", "ftruncate/03.t", "link/03.t", "mkdir/03.t", "mkfifo/03.t",
    "mknod/03.t", "open/03.t", "rename/02.t", "rmdir/03.t", "symlink/03.t", "truncate/03.t",
    "unlink/03.t",
}  # fmt: skip


@pytest.mark.timeout(1800)  # the suite's own limit below: it took 3.5-9.5 min here
def test_pjdfstest(gateway: GatewayFactory) -> None:
    """The public POSIX suite, when a built copy is at hand (``PJDFSTEST_DIR``), on a mount
    made with ``--allow-other`` (its tests switch uids)."""
    suite = os.environ.get("PJDFSTEST_DIR")
    if not suite:
        pytest.skip("set PJDFSTEST_DIR to a built pjdfstest (see docs/conformance.md)")
    if not ROOT:
        pytest.skip("pjdfstest needs root")
    gw = gateway("pjd", "--allow-other")
    work = gw.mountpoint / "work"
    work.mkdir()
    r = subprocess.run(
        ["prove", "-r", str(Path(suite) / "tests")],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    failing = set()
    for line in r.stdout.splitlines():  # "…/tests/link/00.t (Wstat: 0 Tests: 202 Failed: 110)"
        m = re.search(r"/tests/(\S+\.t)\s.*?(?:Wstat: (\d+).*?)?Failed:? (\d+)", line)
        if m and (int(m.group(3)) or int(m.group(2) or 0)):
            failing.add(m.group(1))
    assert "Files=" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    unexpected = failing - HARD_LINKS - LONG_KEYS
    assert not unexpected, f"pjdfstest failures beyond the documented ones:\n{r.stdout[-3000:]}"

"""POSIX behaviour through a real FUSE mount (the daemon runs in its own process)."""

from __future__ import annotations

import ctypes
import errno
import multiprocessing
import os
import signal
import stat
import threading
from pathlib import Path

import pytest
import xxhash

from tests.conftest import GatewayFactory, any_data_path, errno_of, needs_fuse

pytestmark = [pytest.mark.mount, needs_fuse]

_libc = ctypes.CDLL(None, use_errno=True)
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
AT_FDCWD = -100


def renameat2(src: Path, dst: Path, flags: int) -> None:
    r = _libc.renameat2(AT_FDCWD, bytes(src), AT_FDCWD, bytes(dst), flags)
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def test_write_read_stat_and_persistence_across_remount(gateway: GatewayFactory) -> None:
    gw = gateway()
    data = os.urandom(5 << 20) + b"tail"
    (gw.mountpoint / "run1").mkdir()
    (gw.mountpoint / "run1" / "a.bin").write_bytes(data)
    st = os.stat(gw.mountpoint / "run1" / "a.bin")
    assert st.st_size == len(data) and stat.S_ISREG(st.st_mode)
    gw.stop()
    gw.start()
    assert (gw.mountpoint / "run1" / "a.bin").read_bytes() == data


def test_rename_replace_noreplace_exchange(mnt: Path) -> None:
    (mnt / "a").write_bytes(b"A")
    (mnt / "b").write_bytes(b"B")
    assert errno_of(renameat2, mnt / "a", mnt / "b", RENAME_NOREPLACE) == errno.EEXIST
    renameat2(mnt / "a", mnt / "b", RENAME_EXCHANGE)
    assert (mnt / "a").read_bytes() == b"B" and (mnt / "b").read_bytes() == b"A"
    os.rename(mnt / "a", mnt / "b")
    assert not (mnt / "a").exists() and (mnt / "b").read_bytes() == b"B"
    (mnt / "d1").mkdir()
    (mnt / "d2").mkdir()
    os.rename(mnt / "d1", mnt / "d2")  # replaces an empty directory
    assert not (mnt / "d1").exists() and (mnt / "d2").is_dir()
    (mnt / "d3").mkdir()
    (mnt / "d3" / "x").write_bytes(b"x")
    assert errno_of(os.rename, mnt / "d2", mnt / "d3") in (errno.ENOTEMPTY, errno.EEXIST)
    os.rename(mnt / "d3", mnt / "d2" / "inner")  # a directory with contents
    assert (mnt / "d2" / "inner" / "x").read_bytes() == b"x"


def test_unlinked_file_stays_readable_while_open(mnt: Path) -> None:
    p = mnt / "f"
    p.write_bytes(b"still here")
    with open(p, "rb") as f:
        os.unlink(p)
        assert not p.exists()
        assert f.read() == b"still here"
    assert os.listdir(mnt) == []


def test_open_flags_trunc_append(mnt: Path) -> None:
    p = mnt / "f"
    p.write_bytes(b"0123456789")
    with open(p, "ab") as f:
        f.write(b"AB")
    assert p.read_bytes() == b"0123456789AB"
    with open(p, "r+b") as f:
        f.seek(2)
        f.write(b"xx")
    assert p.read_bytes() == b"01xx456789AB"
    with open(p, "wb") as f:
        f.write(b"new")
    assert p.read_bytes() == b"new"
    os.truncate(p, 1)
    assert p.read_bytes() == b"n"


def test_attributes_chmod_chown_utime(mnt: Path) -> None:
    p = mnt / "f"
    p.write_bytes(b"x")
    os.chmod(p, 0o640)
    os.chown(p, 1234, 5678)
    os.utime(p, ns=(1_000_000_000_123, 2_000_000_000_456))
    st = os.stat(p)
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert (st.st_uid, st.st_gid) == (1234, 5678)
    assert st.st_mtime_ns == 2_000_000_000_456 and st.st_atime_ns == 1_000_000_000_123


def test_default_permissions_are_enforced(mnt: Path) -> None:
    """default_permissions: the kernel checks modes; a non-root child cannot read 0600 files."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch users")
    p = mnt / "secret"
    p.write_bytes(b"s")
    os.chmod(p, 0o600)
    os.chmod(mnt, 0o755)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            open(p, "rb").close()
            os._exit(0)
        except PermissionError:
            os._exit(13)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 13


def test_symlink_hardlink_xattr(mnt: Path) -> None:
    (mnt / "step_1").mkdir()
    (mnt / "step_1" / "m.pt").write_bytes(b"m")
    os.symlink("step_1", mnt / "latest")
    assert os.readlink(mnt / "latest") == "step_1"
    assert (mnt / "latest" / "m.pt").read_bytes() == b"m"
    assert errno_of(os.link, mnt / "step_1" / "m.pt", mnt / "hard") == errno.EPERM
    os.setxattr(mnt / "step_1" / "m.pt", "user.step", b"1")
    assert os.getxattr(mnt / "step_1" / "m.pt", "user.step") == b"1"
    assert "user.step" in os.listxattr(mnt / "step_1" / "m.pt")


def test_name_and_key_limits(mnt: Path) -> None:
    assert errno_of((mnt / ("n" * 256)).write_bytes, b"") == errno.ENAMETOOLONG
    (mnt / ("n" * 255)).write_bytes(b"ok")
    d = mnt
    for _ in range(4):  # 4 x 251 bytes + separators: the key is still <= 1,024 bytes
        d = d / ("d" * 250)
        d.mkdir()
    assert errno_of((d / ("f" * 30)).write_bytes, b"") == errno.ENAMETOOLONG
    assert errno_of(os.mkdir, d / ("f" * 30)) == errno.ENAMETOOLONG
    (d / "f").write_bytes(b"fits")
    assert errno_of(os.rename, d / "f", d / ("f" * 30)) == errno.ENAMETOOLONG


@any_data_path
def test_large_directory_listing(mnt: Path) -> None:
    d = mnt / "many"
    d.mkdir()
    names = {f"rank_{i:05}.distcp" for i in range(3000)}
    for n in names:
        (d / n).write_bytes(b"")
    assert set(os.listdir(d)) == names
    with os.scandir(d) as it:  # delete while iterating: no entry is returned twice
        seen = []
        for i, e in enumerate(it):
            seen.append(e.name)
            if i % 3 == 0:
                os.unlink(e.path)
    assert len(seen) == len(set(seen))


def test_statfs_reports_the_cache_disk(mnt: Path, tmp_path: Path) -> None:
    # Other tests write and delete on the same disk meanwhile: the mount's room is compared
    # with the disk's just before and just after it was taken.
    before = os.statvfs(tmp_path)
    ours = os.statvfs(mnt)
    after = os.statvfs(tmp_path)
    assert ours.f_blocks * ours.f_frsize == before.f_blocks * before.f_frsize
    room = max(before.f_bavail * before.f_frsize, after.f_bavail * after.f_frsize)
    assert 0 < ours.f_bavail * ours.f_frsize <= room
    assert ours.f_namemax == 255


def _writer(root: str, rank: int) -> str:
    data = os.urandom(3 << 20) + rank.to_bytes(4, "little")
    p = Path(root) / f"rank_{rank}.bin"
    with open(p, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return xxhash.xxh3_128_hexdigest(data)


def test_many_processes_write_at_once(mnt: Path) -> None:
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        digests = pool.starmap(_writer, [(str(mnt), r) for r in range(12)])
    for r, digest in enumerate(digests):
        assert xxhash.xxh3_128_hexdigest((mnt / f"rank_{r}.bin").read_bytes()) == digest


def test_concurrent_readers_and_writers_of_one_file(mnt: Path) -> None:
    p = mnt / "shared"
    block = 1 << 16
    with open(p, "wb") as f:
        f.truncate(64 * block)
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            fd = os.open(p, os.O_WRONLY)
            for i in range(k, 64, 4):
                os.pwrite(fd, bytes([i]) * block, i * block)
            os.close(fd)
        except BaseException as e:
            errors.append(e)

    def reader() -> None:
        try:
            fd = os.open(p, os.O_RDONLY)
            for _ in range(20):
                assert len(os.pread(fd, 64 * block, 0)) == 64 * block
            os.close(fd)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    data = p.read_bytes()
    assert all(data[i * block : (i + 1) * block] == bytes([i]) * block for i in range(64))


def test_fsync_and_fsyncdir_succeed(mnt: Path) -> None:
    fd = os.open(mnt / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"x" * 10000)
    os.fsync(fd)
    os.fdatasync(fd)
    os.close(fd)
    dfd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)


def test_mount_refuses_a_busy_mountpoint_and_a_cache_dir_in_use(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    a = gateway("a")
    same_mnt = gateway("b", start=False)
    same_mnt.mountpoint = a.mountpoint
    r = same_mnt.cli(
        "mount",
        str(a.mountpoint),
        "--cache-dir",
        str(tmp_path / "other"),
        "--store",
        a.store,
        "--allow-local-store",
        check=False,
    )
    assert r.returncode != 0 and "busy" in r.stderr and r.stderr.count("\n") == 1
    (tmp_path / "m2").mkdir()
    r = a.cli(
        "mount",
        str(tmp_path / "m2"),
        "--cache-dir",
        str(a.cache_dir),
        "--store",
        a.store,
        "--allow-local-store",
        check=False,
    )
    assert r.returncode != 0 and "in use by another ckptgw" in r.stderr
    assert "Traceback" not in r.stderr


def test_sigterm_unmounts_and_stops_cleanly(gateway: GatewayFactory) -> None:
    gw = gateway()
    (gw.mountpoint / "f").write_bytes(b"before sigterm")
    assert gw.pid is not None
    os.kill(gw.pid, signal.SIGTERM)
    assert gw._wait_gone(gw.pid, 30)
    gw.pid = None
    with open("/proc/self/mounts") as m:
        assert str(gw.mountpoint) not in m.read()
    assert "stopped cleanly" in (gw.cache_dir / "ckptgw.log").read_text()
    gw.start()
    assert (gw.mountpoint / "f").read_bytes() == b"before sigterm"

"""A full cache disk: the writer gets ENOSPC, the journal stays intact, acknowledged data stays,
and the gateway works again once space is freed. Runs on a small ext4 image (direct I/O path)
and on a small tmpfs (page-cache path).

On the kernel's path (passthrough) the disk reserve is a file that no writer can take: these
tests check that it is the journal's once the disk is full and no writer on the kernel's path
is left open, whatever the writers' pace (a pause, a writer kept open), and that the journal
still commits meanwhile (fsops.passthrough.Passthrough.check_room,
fsops.journal.connection.WAL_ROOM)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptgw.fsops.passthrough import NOFLUSH, PASSTHROUGH
from tests.conftest import CheckedGateway, GatewayFactory, needs_fuse, wait_data_path
from tests.test_drain import wait_for

pytestmark = [pytest.mark.mount, needs_fuse]


@pytest.fixture(params=["ext4", "tmpfs"])
def small_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    d = tmp_path / "small"
    d.mkdir()
    if request.param == "ext4":
        if shutil.which("mkfs.ext4") is None:
            pytest.skip("mkfs.ext4 not installed")
        img = tmp_path / "cache.img"
        subprocess.run(["truncate", "-s", "96M", str(img)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
        subprocess.run(["mount", "-o", "loop", str(img), str(d)], check=True)
    else:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


RESERVE = 8 << 20


def gateway_on(
    disk: Path, gateway: GatewayFactory, tmp_path: Path, more: str = ""
) -> CheckedGateway:
    """A started gateway whose cache is on ``disk``, with an 8 MiB reserve (and the config
    lines ``more``). Its fixture is set up after the disk's, so that it is stopped (and its
    log checked) before the disk is unmounted."""
    cfg = tmp_path / f"{disk.name}.toml"
    cfg.write_text(f'[cache]\ndir = "{disk / "cache"}"\nreserve = "8MiB"\nwrite_wait = 1.0\n{more}')
    gw = gateway(disk.name, "--config", str(cfg), start=False)
    gw.cache_dir = disk / "cache"
    return gw.start()


@pytest.fixture
def small_gateway(small_disk: Path, gateway: GatewayFactory, tmp_path: Path) -> CheckedGateway:
    return gateway_on(small_disk, gateway, tmp_path)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def free_for_root(path: Path) -> int:
    """Free for the daemon, root: with passthrough the kernel writes with the daemon's
    credentials, which may use ext4's root-only blocks too; the reserve is on top of them."""
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def flushes(gw: CheckedGateway) -> int:
    return int(gw.status()["requests"].get("flush", {}).get("count", 0))


def reserve_held(gw: CheckedGateway) -> int:
    """Bytes the reserve file holds on the cache disk (0: none, it is the journal's)."""
    try:
        return (gw.cache_dir / "reserve").stat().st_blocks * 512
    except FileNotFoundError:
        return 0


def write_until_full(path: Path, chunk: bytes, most: int = 1000) -> int:
    """Write (at most ``most`` chunks) and fsync until something says ENOSPC; return the
    errno seen."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for _ in range(most):
            os.write(fd, chunk)
        os.fsync(fd)
    except OSError as e:
        return e.errno or 0
    finally:
        try:
            os.close(fd)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
    return 0


def test_full_cache_disk_gives_enospc_and_keeps_the_journal(
    small_gateway: CheckedGateway,
) -> None:
    mnt = small_gateway.mountpoint
    keep = os.urandom(10 << 20)
    with open(mnt / "keep.pt", "wb") as f:
        f.write(keep)
        os.fsync(f.fileno())
    assert write_until_full(mnt / "big.pt", os.urandom(1 << 20)) == errno.ENOSPC
    # Namespace changes still work. This mkdir is the writer's next request: on the kernel's
    # path it comes after the RELEASE of its close, which gives the reserve to the journal.
    (mnt / "dir-after-full").mkdir()
    assert free_for_root(small_gateway.cache_dir) >= RESERVE // 2  # the reserve is still free
    os.unlink(mnt / "big.pt")
    # The space comes back once nothing holds the file: the kernel's forget, and the drain,
    # which cancels its upload of an unlinked file. A bounded wait, not a timing assertion.
    wait_for("the space of the unlinked file", lambda: free_bytes(mnt) >= 32 << 20)
    (mnt / "after.pt").write_bytes(b"space is back")
    small_gateway.stop()
    small_gateway.start()
    assert (mnt / "keep.pt").read_bytes() == keep
    assert (mnt / "after.pt").read_bytes() == b"space is back"
    assert (mnt / "dir-after-full").is_dir()


@pytest.fixture
def kernel_path(data_path: str) -> None:
    if data_path != PASSTHROUGH:
        pytest.skip("the reserve file is the kernel's path's (passthrough)")


def test_a_writer_that_pauses_on_a_nearly_full_disk_does_not_get_the_reserve(
    kernel_path: None, small_disk: Path, gateway: GatewayFactory, tmp_path: Path
) -> None:
    """A writer on the kernel's path that stops writing for a while just before the disk is
    full (as a loaded machine deschedules one) and then writes on: the reserve stays held
    while it is open, so it stops at ENOSPC with the reserve intact, and its close (no
    FLUSH: RELEASE alone) gives the reserve to the journal. (Given back after a pause, the
    writer took it all: seen with a heuristic that released it after 0.15 s without growth.)"""
    gw = gateway_on(small_disk, gateway, tmp_path)
    wait_data_path(gw, PASSTHROUGH)
    mnt = gw.mountpoint
    before = flushes(gw)
    chunk = os.urandom(1 << 20)
    with open(mnt / "big.pt", "wb", buffering=0) as f:
        while free_bytes(small_disk) >= RESERVE // 2:  # nearly full (the reserve aside)
            f.write(chunk)
        os.stat(mnt / "big.pt")  # (a getattr: the daemon sees the disk nearly full)
        time.sleep(1.0)  # the pause (descheduled, or computing): the watcher ticks
        assert reserve_held(gw) >= RESERVE  # held while the writer is open...
        with pytest.raises(OSError) as full:
            for _ in range(64):
                f.write(chunk)
        assert full.value.errno == errno.ENOSPC
        assert reserve_held(gw) >= RESERVE  # ...which stopped at ENOSPC without it
    (mnt / "dir-after-full").mkdir()  # after the writer's RELEASE
    assert reserve_held(gw) == 0
    assert free_for_root(small_disk) >= RESERVE // 2  # the journal's
    if NOFLUSH:
        assert flushes(gw) == before
    os.unlink(mnt / "big.pt")
    wait_for("the space of the unlinked file", lambda: free_bytes(mnt) >= 32 << 20)
    (mnt / "after.pt").write_bytes(b"space is back")
    assert reserve_held(gw) >= RESERVE  # taken back before that writer opened
    gw.stop()
    gw.start()
    assert (mnt / "after.pt").read_bytes() == b"space is back"
    assert (mnt / "dir-after-full").is_dir()


def test_the_journal_commits_while_a_writer_stays_open_on_a_full_disk(
    kernel_path: None, small_disk: Path, gateway: GatewayFactory, tmp_path: Path
) -> None:
    """A file kept open for writing on the kernel's path (a training log) while another
    writer fills the disk: the reserve stays held until the log is closed too, so the log
    cannot take it either (ENOSPC); meanwhile the journal commits into the room it keeps in
    its WAL (namespace changes and fsync work on the full disk), and once the log is
    closed the reserve is the journal's."""
    # No upload, so no file becomes clean and is evicted to make room meanwhile.
    gw = gateway_on(small_disk, gateway, tmp_path, "[drain]\nsettle = 3600\n")
    wait_data_path(gw, PASSTHROUGH)
    mnt = gw.mountpoint
    (mnt / "small.txt").write_bytes(b"small")
    log = os.open(mnt / "train.log", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(log, b"step 1\n")
        assert write_until_full(mnt / "big.pt", os.urandom(1 << 20)) == errno.ENOSPC
        (mnt / "after-big").mkdir()  # after big.pt's RELEASE: the log is still open
        assert reserve_held(gw) >= RESERVE
        written = 0
        with pytest.raises(OSError) as full:
            for _ in range(64):
                written += os.write(log, b"x" * (1 << 20))
        assert full.value.errno == errno.ENOSPC
        assert written < RESERVE // 2 and reserve_held(gw) >= RESERVE  # not the log's
        # The journal works on the full disk, from its own room.
        (mnt / "dir-on-full-disk").mkdir()
        os.rename(mnt / "small.txt", mnt / "dir-on-full-disk" / "small.txt")
        os.unlink(mnt / "dir-on-full-disk" / "small.txt")
        os.fsync(log)
    finally:
        os.close(log)
    (mnt / "after-log").mkdir()  # after the log's RELEASE
    assert reserve_held(gw) == 0
    assert free_for_root(small_disk) >= RESERVE // 2  # the journal's
    os.unlink(mnt / "big.pt")
    wait_for("the space of the unlinked file", lambda: free_bytes(mnt) >= 32 << 20)
    gw.stop()
    gw.start()
    assert (mnt / "train.log").read_bytes().startswith(b"step 1\n")
    assert sorted(p.name for p in mnt.iterdir()) == [
        "after-big",
        "after-log",
        "dir-on-full-disk",
        "train.log",
    ]

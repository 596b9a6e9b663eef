"""FUSE passthrough (fsops.passthrough): the kernel reads and writes the cache files, the
daemon sees opens, flushes, fsyncs and releases. Every other mount test runs on both data
paths (tests/conftest.py ``data_path``); these are about what only passthrough has: bytes
the daemon never sees, the choice of path per inode, and crashes with such bytes in flight.
Skipped, with the reason, where this machine cannot do passthrough."""

from __future__ import annotations

import contextlib
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgw.fsops.passthrough import PASSTHROUGH
from tests.conftest import GatewayFactory, needs_fuse
from tests.test_drain import wait_for

pytestmark = [needs_fuse, pytest.mark.parametrize("data_path", [PASSTHROUGH], indirect=True)]


def write_fd(path: Path, data: bytes, flags: int = os.O_WRONLY | os.O_CREAT) -> int:
    fd = os.open(path, flags, 0o644)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return fd


def test_the_daemon_sees_no_bytes_and_learns_size_and_mtime(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    gw = gateway()
    path = gw.mountpoint / "ckpt.pt"
    first, second = os.urandom(16 << 20), os.urandom(8 << 20)
    fd = write_fd(path, first)
    try:
        assert os.fstat(fd).st_size == len(first)  # a getattr: from the cache file
        assert path.stat().st_size == len(first)
        os.write(fd, second)
        os.fsync(fd)
        os.utime(path, ns=(1_700_000_000 * 10**9, 1_700_000_000 * 10**9))  # while open
    finally:
        os.close(fd)
    st = path.stat()
    assert st.st_size == len(first) + len(second)
    assert st.st_mtime_ns == 1_700_000_000 * 10**9, "a utimens after the writes was lost"
    assert path.read_bytes() == first + second
    status = gw.status()
    assert status["data_path"] == {
        "mode": PASSTHROUGH,
        "reason": None,
        "passthrough_opens": 2,
        "daemon_opens": 0,
        "daemon_bytes": 0,  # no byte went through the daemon
    }
    assert status["written_bytes"] == len(first) + len(second)  # as observed
    gw.cli("flush", "--wait", str(path))
    assert (tmp_path / "store" / "ckpt.pt").read_bytes() == first + second
    assert gw.status()["cache"]["used"] >= len(first) + len(second)  # charged when observed
    assert (gw.cache_dir / "reserve").stat().st_size > 0  # held while kernel writers may run
    gw.stop()
    assert not (gw.cache_dir / "reserve").exists()  # the reserve goes with the mount


def test_append_truncate_and_a_second_open_share_the_cache_file(gateway: GatewayFactory) -> None:
    gw = gateway()
    path = gw.mountpoint / "log.txt"
    path.write_bytes(b"one\n")
    fd = write_fd(path, b"two\n", os.O_WRONLY | os.O_APPEND)
    try:
        with open(path, "rb") as reader:  # shares the writer's backing file
            assert reader.read() == b"one\ntwo\n"
        os.truncate(path, 3)  # a setattr, through the daemon, with a writer open
        os.write(fd, b"!")  # O_APPEND: at the new end
    finally:
        os.close(fd)
    assert path.read_bytes() == b"one!"
    assert gw.status()["data_path"]["daemon_opens"] == 0


def test_a_file_being_fetched_goes_through_the_daemon_until_every_open_is_closed(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    """The kernel refuses a passthrough open of an inode with page-cached (daemon) opens:
    while a read of a file from the store is open, later opens take the daemon path too."""
    a = gateway("a")
    data = os.urandom(12 << 20)
    (a.mountpoint / "shard.bin").write_bytes(data)
    a.cli("flush", "--wait", str(a.mountpoint / "shard.bin"))
    b = gateway("b")  # a fresh node on the same store
    path = b.mountpoint / "shard.bin"
    with open(path, "rb") as reader:  # remote: fetched on demand, through the daemon
        assert reader.read(1 << 20) == data[: 1 << 20]
        with open(path, "r+b") as writer:  # fetched whole first; the reader is still open
            writer.seek(0)
            writer.write(b"HEAD")
        assert reader.read() == data[1 << 20 :]
    assert b.status()["data_path"]["daemon_opens"] == 2
    assert path.read_bytes() == b"HEAD" + data[4:]  # every open closed: passthrough now
    assert b.status()["data_path"]["passthrough_opens"] == 1


def test_kill9_keeps_what_was_written_before_and_after_fsync(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    """A write the kernel made to the cache file is acknowledged like any other: it
    survives a crash of the daemon (not of the node) without fsync, and anything with it."""
    gw = gateway()
    synced, unsynced = os.urandom(6 << 20), os.urandom(5 << 20)
    fd = write_fd(gw.mountpoint / "synced.bin", synced)
    os.fsync(fd)
    os.close(fd)
    fd = write_fd(gw.mountpoint / "unsynced.bin", unsynced)  # no fsync, still open
    gw.kill()
    with contextlib.suppress(OSError):  # the connection is gone
        os.close(fd)
    gw.start()
    assert (gw.mountpoint / "synced.bin").read_bytes() == synced
    assert (gw.mountpoint / "unsynced.bin").read_bytes() == unsynced
    gw.cli("flush", "--wait", str(gw.mountpoint))
    assert (tmp_path / "store" / "unsynced.bin").read_bytes() == unsynced
    assert (tmp_path / "store" / "synced.bin").read_bytes() == synced


def test_read_write_opens_and_a_cache_size_take_the_daemon_path(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    """An O_RDWR open could map the file shared and write it after close, unseen on the
    kernel's path; a ``cache.size`` is kept write by write: both go through the daemon."""
    gw = gateway()
    path = gw.mountpoint / "mapped.bin"
    path.write_bytes(bytes(1 << 20))
    fd = os.open(path, os.O_RDWR)
    mapped = mmap.mmap(fd, 1 << 20)
    os.close(fd)  # like numpy.memmap: the mapping outlives the descriptor
    mapped[:4] = b"MMAP"
    mapped.flush()
    mapped.close()
    assert gw.status()["data_path"]["daemon_opens"] == 1
    gw.cli("flush", "--wait", str(path))
    assert (tmp_path / "store" / "mapped.bin").read_bytes()[:4] == b"MMAP"

    cfg = tmp_path / "sized.toml"
    cfg.write_text('[cache]\nsize = "64MiB"\n')
    sized = gateway("sized", "--config", str(cfg))
    (sized.mountpoint / "a.bin").write_bytes(b"x" * 4096)
    assert (sized.mountpoint / "a.bin").read_bytes() == b"x" * 4096  # a reader: the kernel's
    path_st = sized.status()["data_path"]
    assert (path_st["mode"], path_st["daemon_opens"], path_st["passthrough_opens"]) == (
        PASSTHROUGH,
        1,
        1,
    )
    assert path_st["daemon_bytes"] == 4096


def test_the_daemon_learns_what_an_open_writer_wrote_without_a_request(
    gateway: GatewayFactory,
) -> None:
    """The watcher (OpenFiles.watch) observes files open for writing on the kernel's path:
    their growth is charged and counted while no FUSE request names them. The writer is a
    process of its own: a descriptor of this one would be closed (a FLUSH) by every process
    it starts, such as the status command."""
    gw = gateway()
    script = (
        "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644); "
        "os.write(fd, os.urandom(8 << 20)); print('written', flush=True); sys.stdin.read()"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", script, str(gw.mountpoint / "open.bin")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "written"
        wait_for(
            "the watcher to observe the writes",
            lambda: gw.status()["written_bytes"] >= 8 << 20,
        )
        assert gw.status()["cache"]["used"] >= 8 << 20
    finally:
        writer.communicate(timeout=30)

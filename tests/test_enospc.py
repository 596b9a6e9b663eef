"""A full cache disk: the writer gets ENOSPC, the journal stays intact, acknowledged data stays,
and the gateway works again once space is freed. Runs on a small ext4 image (direct I/O path)
and on a small tmpfs (page-cache path)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptgw.fsops.passthrough import FLUSH_HEADROOM, NOFLUSH, PASSTHROUGH
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


def gateway_on(disk: Path, gateway: GatewayFactory, tmp_path: Path) -> CheckedGateway:
    """A started gateway whose cache is on ``disk``, with an 8 MiB reserve. Its fixture is
    set up after the disk's, so that it is stopped (and its log checked) before the disk
    is unmounted."""
    cfg = tmp_path / f"{disk.name}.toml"
    cfg.write_text(f'[cache]\ndir = "{disk / "cache"}"\nreserve = "8MiB"\nwrite_wait = 1.0\n')
    gw = gateway(disk.name, "--config", str(cfg), start=False)
    gw.cache_dir = disk / "cache"
    return gw.start()


@pytest.fixture
def small_gateway(small_disk: Path, gateway: GatewayFactory, tmp_path: Path) -> CheckedGateway:
    return gateway_on(small_disk, gateway, tmp_path)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


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
    # The reserve is still free: the journal can commit, so namespace changes still work.
    # (Free for the daemon, root: with passthrough the kernel writes with the daemon's
    # credentials, which may use ext4's root-only blocks too; the reserve is on top of them.)
    free = os.statvfs(small_gateway.cache_dir)
    assert free.f_bfree * free.f_frsize >= 4 << 20
    (mnt / "dir-after-full").mkdir()
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
def roomy_disk(tmp_path: Path, data_path: str) -> Iterator[Path]:
    """A tmpfs with just more than passthrough.FLUSH_HEADROOM free (in memory: about 1.1 GiB
    while a test fills it)."""
    if data_path != PASSTHROUGH or not NOFLUSH:
        pytest.skip("a close without FLUSH is the kernel's path's (passthrough)")
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem needs root")
    d = tmp_path / "roomy"
    d.mkdir()
    size = FLUSH_HEADROOM + (64 << 20)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.fixture
def roomy_gateway(roomy_disk: Path, gateway: GatewayFactory, tmp_path: Path) -> CheckedGateway:
    gw = gateway_on(roomy_disk, gateway, tmp_path)
    wait_data_path(gw, PASSTHROUGH)
    return gw


def test_a_writer_whose_close_sent_no_flush_gives_the_reserve_back_at_release(
    roomy_gateway: CheckedGateway, roomy_disk: Path
) -> None:
    """Opened with room (passthrough.FLUSH_HEADROOM), a writer's close sends no FLUSH: if it
    then filled the disk, its RELEASE, which comes after close() has returned and before
    the writer's next request, gives the reserve back to the journal."""
    gw = roomy_gateway
    mnt = gw.mountpoint
    flushes = gw.status()["requests"].get("flush", {}).get("count", 0)
    chunks = (FLUSH_HEADROOM >> 20) + 128
    assert write_until_full(mnt / "big.pt", os.urandom(1 << 20), chunks) == errno.ENOSPC
    # The writer's next request (this mkdir, which the journal must commit) comes after its
    # RELEASE: the reserve is the journal's again by then.
    (mnt / "dir-after-full").mkdir()
    assert free_bytes(roomy_disk) >= 4 << 20
    assert gw.status()["requests"].get("flush", {}).get("count", 0) == flushes
    os.unlink(mnt / "big.pt")
    wait_for("the space of the unlinked file", lambda: free_bytes(mnt) >= 32 << 20)
    (mnt / "after.pt").write_bytes(b"space is back")
    gw.stop()
    gw.start()
    assert (mnt / "after.pt").read_bytes() == b"space is back"
    assert (mnt / "dir-after-full").is_dir()

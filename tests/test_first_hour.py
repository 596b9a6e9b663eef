"""What a new user meets first, through the real CLI: where things are, help that shows how,
a local store that is never taken for a durable one, a mountpoint that would hide files, a
busy unmount that names who holds it, a status --watch that outlives its gateway, completion."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptgw import __version__
from ckptgw.fsops.passthrough import DAEMON
from tests.conftest import GatewayFactory, needs_fuse
from tests.test_cli import assert_one_line_error, ckptgw

COMMANDS = ("mount", "umount", "status", "flush", "wait", "pin", "unpin", "pins", "doctor",
            "cache", "lifecycle", "completion")  # fmt: skip
one_path = pytest.mark.parametrize("data_path", [DAEMON], indirect=True)


def test_version_and_help_with_an_example_and_the_exit_codes() -> None:
    r = ckptgw("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"ckptgw {__version__}"
    for command in COMMANDS:
        h = ckptgw(command, "--help").stdout
        assert "example:\n  ckptgw " + command in h, command
        assert re.search(r"^  3 +not durable", h, re.M), command


def test_a_local_store_is_refused_unless_asked_for(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    r = ckptgw("mount", str(tmp_path / "mnt"), "--store", f"file://{tmp_path / 'store'}",
               "--cache-dir", str(tmp_path / "cache"))  # fmt: skip
    assert_one_line_error(r, "lost with this node", "--allow-local-store", "s3://")
    assert not (tmp_path / "cache").exists()  # refused before anything was made


def test_no_store_at_all_is_the_local_default_and_refused(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    r = ckptgw("mount", str(tmp_path / "mnt"), "--cache-dir", str(tmp_path / "cache"),
               env={"XDG_DATA_HOME": str(tmp_path / "data")})  # fmt: skip
    assert_one_line_error(r, "lost with this node", "--store")


@needs_fuse
@one_path
def test_mount_says_where_things_are_and_that_a_local_store_is_local(
    gateway: GatewayFactory,
) -> None:
    gw = gateway("gw", start=False)
    r = gw.try_mount()
    assert r.returncode == 0, r.stderr
    assert f"  store  {gw.store}" in r.stdout and f"  cache  {gw.cache_dir}" in r.stdout
    assert f"  log    {gw.cache_dir / 'ckptgw.log'}" in r.stdout
    assert "warning" in r.stderr and "not safe from losing this node" in r.stderr
    assert gw.status()["store_local"] is True
    text = gw.cli("status", str(gw.mountpoint)).stdout
    assert f"cache dir {gw.cache_dir}, log {gw.cache_dir / 'ckptgw.log'}" in text


@needs_fuse
@one_path
def test_log_flags_put_the_log_where_asked(gateway: GatewayFactory, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "gw.log"
    gw = gateway("gw", "--log-file", str(log), "--log-level", "debug", start=False)
    r = gw.try_mount()
    assert r.returncode == 0, r.stderr
    assert f"  log    {log}" in r.stdout
    (gw.mountpoint / "a").write_bytes(b"x")
    gw.stop()
    text = log.read_text()
    assert " DEBUG " in text and "mounted" in text
    assert not (gw.cache_dir / "ckptgw.log").exists()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


@needs_fuse
@one_path
def test_a_log_file_that_is_a_link_is_refused(gateway: GatewayFactory, tmp_path: Path) -> None:
    """A daemon running as root must not write (or chmod) through a link planted where the
    log would go."""
    target = tmp_path / "precious"
    target.write_text("not a log")
    target.chmod(0o644)
    link = tmp_path / "gw.log"
    link.symlink_to(target)
    gw = gateway("gw", "--log-file", str(link), start=False)
    r = gw.try_mount()
    assert_one_line_error(r, "is a symbolic link", "--log-file")
    assert target.read_text() == "not a log" and stat.S_IMODE(target.stat().st_mode) == 0o644


@needs_fuse
@one_path
def test_a_non_empty_mountpoint_is_refused(gateway: GatewayFactory) -> None:
    gw = gateway("gw", start=False)
    gw.mountpoint.mkdir(parents=True)
    (gw.mountpoint / "hidden.pt").write_bytes(b"would be hidden")
    gw.expect_errors = True  # the refusal is logged
    r = gw.try_mount()
    assert_one_line_error(r, "is not empty", "hidden.pt")


@needs_fuse
@one_path
def test_a_busy_umount_names_the_process_and_the_file(gateway: GatewayFactory) -> None:
    gw = gateway()
    held = gw.mountpoint / "held.pt"
    held.write_bytes(b"x")
    holder = subprocess.Popen(
        [sys.executable, "-c", f"f = open({str(held)!r}); import time; time.sleep(60)"]
    )
    try:
        deadline = time.monotonic() + 30
        while not any(p.is_symlink() and str(held) == _link(p) for p in _fds(holder.pid)):
            assert time.monotonic() < deadline, "the holder did not open the file"
            time.sleep(0.05)
        r = gw.cli("umount", str(gw.mountpoint), "--force", "--timeout", "0", check=False)
        assert_one_line_error(r, "is busy", str(held), f"pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait()


def _fds(pid: int) -> list[Path]:
    try:
        return list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return []


def _link(p: Path) -> str:
    try:
        return str(p.readlink())
    except OSError:
        return ""


@needs_fuse
@one_path
def test_status_watch_waits_for_a_gateway_that_went_away(gateway: GatewayFactory) -> None:
    gw = gateway()
    watch = subprocess.Popen(
        [sys.executable, "-m", "ckptgw.gateway.cli", "status", str(gw.mountpoint), "--watch",
         "0.2"],
        stdout=subprocess.PIPE, text=True, env=gw.env,
    )  # fmt: skip
    try:
        time.sleep(1.0)
        gw.stop()
        time.sleep(1.5)
        assert watch.poll() is None, "status --watch exited when its gateway went away"
    finally:
        watch.kill()
        out = watch.communicate()[0]
    frames = out.split("\x1b[H\x1b[2J")
    assert any(str(gw.mountpoint) in f and "durable" not in f and "waiting" in f for f in frames)
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  every 0.2 s", frames[-1]), frames[-1]


def test_completion_offers_commands_and_options(tmp_path: Path) -> None:
    script = ckptgw("completion", "bash").stdout
    probe = tmp_path / "probe.sh"
    probe.write_text(
        script
        + 't() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); COMPREPLY=(); '
        + '_ckptgw; echo "${COMPREPLY[*]}"; }\n'
        + 't ckptgw li\nt ckptgw lifecycle ""\nt ckptgw mount /x --allow-l\n'
    )
    out = subprocess.run(["bash", str(probe)], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "lifecycle",
        "plan apply rules --help",
        "--allow-local-store",
    ]

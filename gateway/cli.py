"""The ``ckptgw`` command line.

Every error a user can cause ends as one line on stderr and a non-zero exit code."""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gateway import registry
from gateway.config import load_config
from gateway.daemon import READY_FD_ENV
from gateway.errors import UserError
from gateway.mountpoint import FSTYPE, mounted_fstype, unmount

MOUNT_TIMEOUT = 120.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ckptgw", description="Checkpoint gateway: a FUSE write-back cache for ML training"
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m = sub.add_parser("mount", help="mount a gateway (returns once the mount is ready)")
    m.add_argument("mountpoint")
    m.add_argument("--store", help="s3://BUCKET[/PREFIX] or file:///PATH (default: embedded)")
    m.add_argument("--cache-dir", help="cache directory on local NVMe")
    m.add_argument("--endpoint-url", help="S3 endpoint (S3-compatible stores)")
    m.add_argument("--config", help="TOML config file; flags override it")
    m.add_argument(
        "--allow-other",
        action="store_true",
        default=None,
        help="let other users access the mount (off by default)",
    )
    m.add_argument(
        "--foreground", action="store_true", help="stay in front (for systemd and containers)"
    )

    u = sub.add_parser("umount", help="unmount a gateway and wait for its daemon to finish")
    u.add_argument("mountpoint")
    u.add_argument("--timeout", type=float, default=60.0, metavar="S")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "mount":
            return cmd_mount(args, list(argv if argv is not None else sys.argv[1:]))
        if args.command == "umount":
            return cmd_umount(args)
    except UserError as e:
        print(f"ckptgw: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
    raise AssertionError(args.command)


def cmd_mount(args: argparse.Namespace, argv: list[str]) -> int:
    cfg = load_config(
        args.mountpoint,
        config_file=args.config,
        store=args.store,
        cache_dir=args.cache_dir,
        endpoint_url=args.endpoint_url,
        allow_other=args.allow_other,
        foreground=args.foreground,
    )
    if args.foreground:
        from gateway.daemon import run

        return run(cfg)
    return _start_in_background(argv, cfg.mountpoint)


def _start_in_background(argv: list[str], mountpoint: Path) -> int:
    """Start the daemon in its own session; wait for its one line of readiness."""
    r, w = os.pipe()
    env = dict(os.environ, **{READY_FD_ENV: str(w)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", *argv, "--foreground"],
        pass_fds=(w,),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(w)
    line = b""
    deadline = time.monotonic() + MOUNT_TIMEOUT
    with os.fdopen(r, "rb", buffering=0) as pipe:
        while b"\n" not in line and time.monotonic() < deadline:
            ready, _, _ = select.select([pipe], [], [], 0.5)
            if ready:
                chunk = pipe.read(4096)
                if not chunk:
                    break
                line += chunk
    text = line.decode(errors="replace").strip()
    if text == "ok":
        return 0
    if text.startswith("ok warning: "):
        print(f"ckptgw: warning: {text.removeprefix('ok warning: ')}", file=sys.stderr)
        return 0
    if text.startswith("error: "):
        proc.wait(timeout=30)
        raise UserError(text.removeprefix("error: "))
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        raise UserError(f"the gateway for {mountpoint} did not get ready in {MOUNT_TIMEOUT:.0f} s")
    raise UserError(f"the gateway for {mountpoint} exited with code {proc.returncode}")


def cmd_umount(args: argparse.Namespace) -> int:
    mp = Path(os.path.abspath(args.mountpoint))
    entry = registry.find(mp)
    if mounted_fstype(mp) != FSTYPE:
        raise UserError(f"{mp} is not a ckptgw mount")
    unmount(mp)
    if entry is None:
        return 0
    deadline = time.monotonic() + args.timeout
    while registry.alive(entry.pid):
        if time.monotonic() > deadline:
            raise UserError(
                f"{mp} is unmounted, but its daemon (pid {entry.pid}) is still finishing after "
                f"{args.timeout:.0f} s"
            )
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())

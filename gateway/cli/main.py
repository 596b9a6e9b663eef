"""The ``ckptgw`` command line.

Every error a user can cause ends as one line on stderr and a non-zero exit code."""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckptgw import __version__
from ckptgw.gateway import registry
from ckptgw.gateway.cli.progressbar import ProgressBar
from ckptgw.gateway.client import (
    Mount,
    NotDurable,
    NotRunning,
    describe,
    entries,
    mount_at,
    mount_of,
    mounts,
    wait_until_durable,
)
from ckptgw.gateway.errors import UserError
from ckptgw.gateway.mountpoint import FSTYPE, mounted_fstype, unmount
from ckptgw.gateway.protocol import READY_FD_ENV
from ckptgw.gateway.render import (
    Painter,
    files,
    plan_text,
    size,
    status_text,
    use_colour,
    warmup_line,
)

MOUNT_TIMEOUT = 120.0
EXIT_WAIT = 60.0  # after the unmount, how long the daemon may take to finish
NOT_DURABLE_EXIT = 3  # flush --wait / wait timed out with data not in the store
NOT_WARM_EXIT = 4  # warmup --wait ended with files not in the cache


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ckptgw",
        description="Checkpoint gateway: a FUSE write-back cache for ML training",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"ckptgw {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m = sub.add_parser("mount", help="mount a gateway (returns once the mount is ready)")
    m.add_argument("mountpoint", help="an empty directory to mount on")
    _config_options(m)
    m.add_argument(
        "--allow-other",
        action="store_true",
        default=None,
        help="let other users access the mount (off by default)",
    )
    m.add_argument(
        "--no-passthrough",
        dest="passthrough",
        action="store_false",
        default=None,
        help="every byte through the daemon, not kernel FUSE passthrough (mount.passthrough)",
    )
    m.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help="log.level (default: info)",
    )
    m.add_argument("--log-file", metavar="FILE", help="log.file (default: CACHE_DIR/ckptgw.log)")
    m.add_argument(
        "--foreground", action="store_true", help="stay in front (for systemd and containers)"
    )

    u = sub.add_parser(
        "umount", help="drain, then unmount a gateway and wait for its daemon to finish"
    )
    u.add_argument("mountpoint", help="a running gateway's mountpoint")
    u.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="how long to drain before giving up (default 60; 0: do not drain)",
    )
    u.add_argument(
        "--force",
        action="store_true",
        help="unmount even if data is not in the store yet (it stays in the cache)",
    )

    s = sub.add_parser("status", help="what is only local, what is draining, what is durable")
    s.add_argument("mountpoint", nargs="?", help="one mount (default: every mount)")
    s.add_argument("--json", action="store_true", help="machine-readable (versioned schema)")
    s.add_argument(
        "--watch", nargs="?", type=float, const=1.0, metavar="S", help="refresh every S seconds"
    )

    f = sub.add_parser("flush", help="drain now (the given paths first)")
    f.add_argument(
        "paths", nargs="*", metavar="PATH", help="files or directories on a mount (default: all)"
    )
    f.add_argument("--wait", action="store_true", help="block until durable")
    f.add_argument("--timeout", type=float, metavar="S", help="with --wait: give up after S s")

    w = sub.add_parser("wait", help="block until a file or directory is durable")
    w.add_argument("path", metavar="PATH", help="a file or directory on a mount")
    w.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds")

    wu = sub.add_parser(
        "warmup",
        help="fetch a checkpoint (a file or a directory) into this node's cache before it is "
        "read, largest files first, as far as the cache has room",
    )
    wu.add_argument("path", metavar="PATH", help="a file or directory on a mount")
    wu.add_argument("--wait", action="store_true", help="block until it is done")
    wu.add_argument("--timeout", type=float, metavar="S", help="with --wait: give up after S s")
    wu.add_argument("--json", action="store_true", help="print the outcome as JSON")

    for name, what in (
        ("pin", "keep a checkpoint whatever retention says (it must exist)"),
        ("unpin", "undo pin (of a path not pinned: says so, exit 0)"),
    ):
        pp = sub.add_parser(name, help=f"{what}; stored in the bucket: every node agrees")
        pp.add_argument("path", metavar="PATH", help="a checkpoint on a mount")
    pl = sub.add_parser("pins", help="the pinned checkpoints, and whether each still exists")
    pl.add_argument("mountpoint", nargs="?", help="default: the only running gateway")
    pl.add_argument("--json", action="store_true")

    ca = sub.add_parser("cache", help="a cache dir that is not mounted")
    csub = ca.add_subparsers(dest="action", required=True, metavar="ACTION")
    cr = csub.add_parser(
        "rebind",
        help="send the cache's data to another store at its next mount (e.g. after a "
        "misspelled bucket); refused while mounted",
    )
    cr.add_argument("cache_dir", metavar="CACHE_DIR", help="the cache directory to rebind")
    cr.add_argument("--store", required=True, help="the store to bind it to: s3://... or file://")
    cr.add_argument("--endpoint-url", help="S3 endpoint (S3-compatible stores)")
    cr.add_argument(
        "--allow-local-store", action="store_true", help="accept a store on this node's disks"
    )

    lc = sub.add_parser("lifecycle", help="retention: plan, apply, and the bucket's rules")
    lsub = lc.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, what in (
        ("plan", "what retention would keep, delete or transition, and why"),
        ("apply", "carry out the plan: delete in the bucket and the caches, tag milestones"),
    ):
        la = lsub.add_parser(name, help=what)
        la.add_argument("mountpoint", nargs="?", help="default: the only running gateway")
        la.add_argument("--run", metavar="PREFIX", help="only this run")
        la.add_argument("--json", action="store_true")
    lr = lsub.add_parser("rules", help="the bucket's lifecycle rules with ours merged in")
    lr.add_argument("mountpoint", nargs="?", help="default: the only running gateway")
    lr.add_argument("--apply", action="store_true", help="put the merged rules on the bucket")
    lr.add_argument("--json", action="store_true")

    sv = sub.add_parser("serve", help="export a mount to other nodes")
    svsub = sv.add_subparsers(dest="protocol", required=True, metavar="PROTOCOL")
    sn = svsub.add_parser(
        "nfs",
        help="export a mount over NFS through NFS-Ganesha (returns once it serves)",
        description="Export a running gateway mount over NFSv3 and NFSv4 through NFS-Ganesha, "
        "and keep Ganesha running beside it. Settings: [nfs] in --config, then the flags.",
    )
    sn.add_argument("mountpoint", help="the running gateway's mountpoint to export")
    sn.add_argument("--listen", metavar="ADDR:PORT", help="nfs.listen (default :2049)")
    sn.add_argument(
        "--export", metavar="PATH", help="the path clients mount (default /checkpoints)"
    )
    sn.add_argument(
        "--clients", metavar="CIDR[,CIDR...]", help="the networks allowed to mount (required)"
    )
    sn.add_argument("--protocols", metavar="3,4", help="NFS versions (default 3,4)")
    sn.add_argument(
        "--no-root-squash",
        dest="root_squash",
        action="store_false",
        default=None,
        help="let a client's root act as root (squashed to nobody by default)",
    )
    sn.add_argument("--config", help="TOML config file with an [nfs] section")
    sn.add_argument(
        "--foreground", action="store_true", help="stay in front (for systemd and containers)"
    )
    sn.add_argument("--stop", action="store_true", help="stop the mount's NFS export")

    d = sub.add_parser(
        "doctor",
        help="check what a mount needs (FUSE, cache disk, store), or a running mount",
        description="Before a mount: check this machine and the store as `mount` would load "
        "the configuration. On a running gateway's mountpoint: check that mount as its daemon "
        "runs it (its store, endpoint and cache dir, asked over its control socket; the store "
        "checked by the daemon, with its credentials), and what its status says is wrong.",
    )
    d.add_argument(
        "mountpoint",
        nargs="?",
        help="the mountpoint to check: an empty directory before a mount, or a running gateway's",
    )
    _config_options(d)
    d.add_argument("--json", action="store_true", help="a list of {check, status, message}")
    co = sub.add_parser("completion", help="print a shell completion script")
    co.add_argument("shell", choices=("bash", "zsh"), help="the shell")

    for name, parser in sub.choices.items():
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.epilog = (
            f"example:\n  {EXAMPLES[name]}\n\n{EXIT_CODES}" if name in EXAMPLES else EXIT_CODES
        )
    sn.formatter_class = argparse.RawDescriptionHelpFormatter
    sn.epilog = f"example:\n  {EXAMPLES['serve']}\n\n{EXIT_CODES}"
    return p


def _config_options(p: argparse.ArgumentParser) -> None:
    """The options that choose the store and the cache, as ``mount`` and ``doctor`` take them."""
    p.add_argument(
        "--store",
        help="s3://BUCKET[/PREFIX], or file:///PATH on a shared filesystem (store.url; the "
        "default, a directory on this node, needs --allow-local-store)",
    )
    p.add_argument(
        "--cache-dir",
        help="cache directory on local NVMe (cache.dir; default: /var/cache/ckptgw/MOUNTPOINT "
        "as root, ~/.cache/ckptgw/MOUNTPOINT otherwise)",
    )
    p.add_argument("--endpoint-url", help="S3 endpoint (S3-compatible stores)")
    p.add_argument("--config", help="TOML config file; flags override it")
    p.add_argument(
        "--allow-local-store",
        action="store_true",
        default=None,
        help="accept a file:// store on this node's own disks, which the node's loss takes "
        "with it (store.allow_local; refused otherwise)",
    )


EXIT_CODES = f"""exit codes:
  0    done
  1    an error (one line on stderr says what to fix), or a failed check (doctor)
  2    a command line that does not parse
  {NOT_DURABLE_EXIT}    not durable in time (flush --wait, wait): what is not is listed
  {NOT_WARM_EXIT}    warmup --wait: not all of it is in the cache (did not fit, could not be
       read, or the timeout passed): what is not is listed
  130  interrupted"""

EXAMPLES = {
    "mount": "ckptgw mount /mnt/ckpt --store s3://my-bucket/run1 --cache-dir /nvme/ckptgw",
    "umount": "ckptgw umount /mnt/ckpt --timeout 300",
    "status": "ckptgw status /mnt/ckpt --watch 2",
    "flush": "ckptgw flush /mnt/ckpt/run1/step_1000 --wait --timeout 600",
    "wait": "ckptgw wait /mnt/ckpt/run1/step_1000 --timeout 600 && rm -r /mnt/ckpt/run1/step_900",
    "warmup": "ckptgw warmup /mnt/ckpt/run1/step_5000 --wait --timeout 1800",
    "pin": "ckptgw pin /mnt/ckpt/run1/step_5000",
    "unpin": "ckptgw unpin /mnt/ckpt/run1/step_5000",
    "pins": "ckptgw pins /mnt/ckpt",
    "serve": "ckptgw serve nfs /mnt/ckpt --clients 10.0.0.0/16",
    "doctor": "ckptgw doctor /mnt/ckpt --store s3://my-bucket/run1 --cache-dir /nvme/ckptgw\n"
    "  ckptgw doctor /mnt/ckpt    # once it is mounted: that mount, as its daemon runs it",
    "cache": "ckptgw cache rebind /var/cache/ckptgw/mnt-ckpt --store s3://the-right-bucket/run1",
    "lifecycle": "ckptgw lifecycle plan /mnt/ckpt --run run1",
    "completion": "ckptgw completion bash > /etc/bash_completion.d/ckptgw",
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "mount":
            return cmd_mount(args, list(argv if argv is not None else sys.argv[1:]))
        if args.command == "umount":
            return cmd_umount(args)
        if args.command == "status":
            return cmd_status(args)
        if args.command == "flush":
            return cmd_flush(args)
        if args.command == "wait":
            return cmd_wait(args)
        if args.command == "warmup":
            return cmd_warmup(args)
        if args.command in ("pin", "unpin"):
            return cmd_pin(args)
        if args.command == "pins":
            return cmd_pins(args)
        if args.command == "lifecycle":
            return cmd_lifecycle(args)
        if args.command == "doctor":
            return cmd_doctor(args)
        if args.command == "serve":
            return cmd_serve(args, list(argv if argv is not None else sys.argv[1:]))
        if args.command == "cache":
            return cmd_cache(args)
        if args.command == "completion":
            from ckptgw.gateway.cli import completion

            print(getattr(completion, args.shell)(_parser()), end="")
            return 0
    except UserError as e:
        print(f"ckptgw: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
    raise AssertionError(args.command)


def cmd_mount(args: argparse.Namespace, argv: list[str]) -> int:
    from ckptgw.gateway.config import load_config  # loads the drain modules: only for mount

    cfg = load_config(
        args.mountpoint,
        config_file=args.config,
        store=args.store,
        cache_dir=args.cache_dir,
        endpoint_url=args.endpoint_url,
        allow_other=args.allow_other,
        passthrough=args.passthrough,
        allow_local_store=args.allow_local_store,
        log_level=args.log_level,
        log_file=args.log_file,
        foreground=args.foreground,
    )
    if args.foreground:
        from ckptgw.gateway.daemon.main import run

        return run(cfg)
    code = _start_in_background(argv, f"the gateway for {cfg.mountpoint}")
    print(
        f"mounted {cfg.mountpoint}\n  store  {cfg.store}\n  cache  {cfg.cache_dir}\n"
        f"  log    {cfg.log_path}"
    )
    return code


def _start_in_background(argv: list[str], what: str) -> int:
    """Start ``ckptgw ARGV --foreground`` in its own session; wait for its one line of
    readiness."""
    r, w = os.pipe()
    env = dict(os.environ, **{READY_FD_ENV: str(w)})
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptgw.gateway.cli", *argv, "--foreground"],
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
            while line.startswith(b"wait: ") and b"\n" in line:  # what it waits for
                said, line = line.split(b"\n", 1)
                print(f"ckptgw: {said[6:].decode(errors='replace')}", file=sys.stderr)
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
        raise UserError(f"{what} did not get ready in {MOUNT_TIMEOUT:.0f} s")
    raise UserError(f"{what} exited with code {proc.returncode}")


def cmd_umount(args: argparse.Namespace) -> int:
    """Drain (up to --timeout), then unmount. Data that is not in the store by then keeps the
    mount up unless --force: it stays in the cache, and the next mount of it drains it."""
    mp = Path(os.path.abspath(args.mountpoint))
    entry = registry.find(mp)
    if mounted_fstype(mp) != FSTYPE:
        raise UserError(f"{mp} is not a ckptgw mount")
    left: dict[str, Any] | None = None
    if entry is not None:
        mount = Mount(mp, entry)
        try:
            if args.timeout > 0:
                left = wait_until_durable(mount, [], args.timeout, progress=ProgressBar())
            else:
                left = mount.request("pending", paths=[])
        except NotDurable as e:
            left = e.pending
        except NotRunning:
            left = None  # a daemon that died: its journal keeps the data for the next mount
        if left is not None and left["count"] and not args.force:
            raise UserError(
                f"{mp}: {entries(left)} ({size(int(left['bytes']))}) not in the store "
                f"yet; not unmounting (ckptgw status {mp} shows why; --force unmounts anyway "
                "and keeps them in the cache for the next mount)"
            )
    if entry is not None:
        from ckptgw.gateway.nfs import serve as nfsserve

        if nfsserve.stop(Path(entry.cache_dir)):  # Ganesha holds the mount's root open
            print(f"stopped the NFS export of {mp}", file=sys.stderr)
    unmount(mp)
    if left is not None and left["count"]:
        print(
            f"ckptgw: warning: {entries(left)} ({size(int(left['bytes']))}) "
            f"stay in the cache at {entry.cache_dir if entry else '?'}; the next mount of it "
            "drains them",
            file=sys.stderr,
        )
    if entry is None:
        return 0
    deadline = time.monotonic() + EXIT_WAIT
    while registry.alive(entry.pid):
        if time.monotonic() > deadline:
            raise UserError(
                f"{mp} is unmounted, but its daemon (pid {entry.pid}) is still finishing after "
                f"{EXIT_WAIT:.0f} s"
            )
        time.sleep(0.05)
    return 0


def _targets(mountpoint: str | None) -> list[Mount]:
    if mountpoint is not None:
        return [mount_at(mountpoint)]
    found = mounts()
    if not found:
        raise NotRunning("no ckptgw gateway is running on this machine")
    return found


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch is None:
        print(_status_text(args))
        return 0
    while True:  # a gateway that goes away is waited for, not given up on
        try:
            text = _status_text(args)
        except UserError as e:
            text = f"{e}; waiting for it"
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        sys.stdout.write(f"\x1b[H\x1b[2J{stamp}  every {args.watch:g} s\n\n{text}\n")
        sys.stdout.flush()
        time.sleep(max(0.1, args.watch))


def _status_text(args: argparse.Namespace) -> str:
    reports = []
    for m in _targets(args.mountpoint):
        try:
            reports.append(m.request("status"))
        except NotRunning:
            if args.mountpoint is not None:
                raise
    if args.json:
        doc: object = reports[0] if args.mountpoint else {"version": 1, "mounts": reports}
        return json.dumps(doc, indent=2)
    colour = use_colour(sys.stdout)
    return "\n\n".join(status_text(r, colour) for r in reports) or "no gateway answers"


def _by_mount(paths: list[str]) -> dict[Path, tuple[Mount, list[str]]]:
    out: dict[Path, tuple[Mount, list[str]]] = {}
    for path in paths:
        mount, p = mount_of(path)
        if not os.path.lexists(p):  # through the mount: also finds files only in the store
            raise UserError(f"{p}: no such file or directory")
        out.setdefault(mount.mountpoint, (mount, []))[1].append(mount.relative(p))
    return out


def _wait_all(groups: list[tuple[Mount, list[str]]], timeout: float | None, wait: bool) -> int:
    deadline = None if timeout is None else time.monotonic() + timeout
    for mount, paths in groups:
        if not wait:
            mount.request("flush", paths=paths)
            continue
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        bar = ProgressBar()
        try:
            wait_until_durable(mount, paths, left, progress=bar)
        except NotDurable as e:
            bar.close()
            for f in e.pending["files"]:
                why = f" ({f['error']})" if f.get("error") else ""
                held = " [open for writing]" if f.get("open_for_writing") else ""
                print(f"{f['state']:9} {size(f['size']):>10}  {f['path']}{held}{why}")
            print(
                f"ckptgw: not durable after {timeout:g} s: {describe(e.pending)}", file=sys.stderr
            )
            return NOT_DURABLE_EXIT
        bar.close()
    return 0


def cmd_flush(args: argparse.Namespace) -> int:
    if args.timeout is not None and not args.wait:
        raise UserError("--timeout needs --wait")
    if args.paths:
        groups = list(_by_mount(args.paths).values())
    else:
        groups = [(m, []) for m in _targets(None)]
    return _wait_all(groups, args.timeout, args.wait)


def cmd_wait(args: argparse.Namespace) -> int:
    return _wait_all(list(_by_mount([args.path]).values()), args.timeout, True)


def cmd_warmup(args: argparse.Namespace) -> int:
    if args.timeout is not None and not args.wait:
        raise UserError("--timeout needs --wait")
    mount, p = mount_of(args.path)
    job = mount.request("warmup", path=mount.relative(p))
    if not args.wait:
        print(f"warming up {p} (warm-up {job['id']}): see ckptgw status {mount.mountpoint}")
        return 0
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    tty = sys.stderr.isatty()
    while job["phase"] != "done":
        if tty:
            print("\r" + warmup_line(job, Painter(False)).strip()[:150], end="", file=sys.stderr)
        if deadline is not None and time.monotonic() >= deadline:
            break
        time.sleep(0.2)
        job = mount.request("warmup_status", id=job["id"])
    if tty:
        print("\r\033[K", end="", file=sys.stderr)
    if args.json:
        print(json.dumps(job, indent=2))
    else:
        print(warmup_line(job, Painter(False)).strip())
        for f in job["skipped"]:
            print(f"did not fit  {size(f['size']):>10}  {mount.mountpoint / f['path']}")
        for f in job["failed"]:
            print(f"not read     {f['error']}  {mount.mountpoint / f['path']}")
    if job["error"]:
        raise UserError(f"warm-up of {p} failed: {job['error']}")
    timed_out = job["phase"] != "done"
    if timed_out or job["skipped_files"] or job["failed_files"]:
        why = [
            f"not done after {args.timeout:g} s" if timed_out else "",
            f"{files(job['skipped_files'])} did not fit in the cache"
            if job["skipped_files"]
            else "",
            f"{files(job['failed_files'])} could not be read" if job["failed_files"] else "",
        ]
        print(
            f"ckptgw: {p} is not all in the cache: {'; '.join(w for w in why if w)}",
            file=sys.stderr,
        )
        return NOT_WARM_EXIT
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    mount, p = mount_of(args.path)
    r = mount.request("pin", path=mount.relative(p), pin=args.command == "pin")
    what = "pinned" if r["pinned"] else "unpinned" if r.get("changed", True) else "not pinned"
    print(f"{what}: {mount.mountpoint / r['path']}")
    return 0


PIN_WHERE = {
    "store": "in the store",
    "both": "in the store",
    "local": "only in this node's cache (not drained yet)",
    None: "gone: in neither the store nor this node's cache",
}


def cmd_pins(args: argparse.Namespace) -> int:
    """The pins, listed from the store, and where each checkpoint is (a pin of one deleted
    outside ckptgw keeps nothing)."""
    mount = _only_mount(args.mountpoint)
    r = mount.request("pins")
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    if not r["pins"]:
        print("no pins")
        return 0
    for p in r["pins"]:
        where = PIN_WHERE.get(p["where"], str(p["where"]))
        if p["where"] in ("store", "both") and r.get("store_local"):
            where = "in the local store (on this node's own disk: durable (local store) only)"
        at = p["pinned_at"]
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "-"
        count = f"  {files(p['files'])}" if p.get("files") else ""
        print(f"{mount.mountpoint / p['path']}  pinned {when}  {where}{count}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from ckptgw.gateway.cli.rebind import describe, rebind_cache  # the journal and store modules

    cache_dir = Path(os.path.abspath(args.cache_dir))
    endpoint = args.endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
    report = rebind_cache(cache_dir, args.store, endpoint, args.allow_local_store)
    if report is None:
        print(f"{cache_dir} is already bound to {args.store}")
    else:
        print(describe(cache_dir, report))
    return 0


def _only_mount(mountpoint: str | None) -> Mount:
    if mountpoint is not None:
        return mount_at(mountpoint)
    found = _targets(None)
    if len(found) > 1:
        names = ", ".join(str(m.mountpoint) for m in found)
        raise UserError(f"several gateways run ({names}): name the mountpoint")
    return found[0]


def cmd_lifecycle(args: argparse.Namespace) -> int:
    mount = _only_mount(args.mountpoint)
    if args.action == "rules":
        r = mount.request("lifecycle_rules", apply=args.apply)
        if args.json:
            print(json.dumps(r, indent=2))
        else:
            print(json.dumps({"Rules": r["proposed"]}, indent=2))
            print("applied to the bucket" if r["applied"] else "not applied (--apply to apply)")
        return 0
    op = "lifecycle_plan" if args.action == "plan" else "lifecycle_apply"
    r = mount.request(op, run=args.run)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    colour = use_colour(sys.stdout)
    print(plan_text(r["plan"], mount.mountpoint, colour, bool(r.get("store_local"))))
    if args.action == "apply":
        print(
            f"deleted {r['deleted']} checkpoints ({size(r['deleted_bytes'])}), "
            f"tagged {r['tagged']} milestones, dropped {r['dropped_local_files']} files here"
        )
    return 0


def cmd_serve(args: argparse.Namespace, argv: list[str]) -> int:
    from ckptgw.gateway.nfs import serve as nfsserve
    from ckptgw.gateway.nfs.export import host_problem, load_export, who_may_write

    mp = Path(os.path.abspath(args.mountpoint))
    entry = registry.find(mp)
    if mounted_fstype(mp) != FSTYPE or entry is None:
        raise UserError(f"{mp} is not a ckptgw mount (mount it first: ckptgw mount {mp} ...)")
    cache_dir = Path(entry.cache_dir)
    if args.stop:
        print(
            f"stopped the NFS export of {mp}" if nfsserve.stop(cache_dir) else f"not exported: {mp}"
        )
        return 0
    export = load_export(
        mp,
        args.config,
        listen=args.listen,
        export=args.export,
        clients=args.clients,
        protocols=args.protocols,
        root_squash=args.root_squash,
    )
    running = nfsserve.running(cache_dir)
    if running is not None:
        raise UserError(
            f"{mp} is already exported as {running['export']} on {running['listen']} "
            f"(pid {running['pid']}); ckptgw serve nfs --stop {mp} first"
        )
    problem = host_problem(export)
    if problem is not None:
        raise UserError(problem)
    if args.foreground:
        return nfsserve.serve(export, cache_dir, foreground=True)
    code = _start_in_background(argv, f"the NFS export of {mp}")
    host, port = export.listen
    versions = " and ".join(f"NFSv{v}" for v in export.protocols)
    print(
        f"serving {mp} over {versions} on {host}:{port}\n"
        f"  clients  {', '.join(export.clients)}"
        f"{'' if export.root_squash else ' (root not squashed)'}\n"
        f"  writes   {who_may_write(mp, export.root_squash)}\n"
        f"  mount    mount -t nfs -o vers={max(export.protocols)} "
        f"GATEWAY:{export.pseudo} /mnt/ckpt\n"
        f"  log      {nfsserve.state_dir(cache_dir) / 'serve.log'}"
    )
    return code


def cmd_doctor(args: argparse.Namespace) -> int:
    from ckptgw.gateway.doctor.main import run  # loads the drain and botocore: only for doctor

    return run(args)

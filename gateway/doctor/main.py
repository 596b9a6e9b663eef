"""``ckptgw doctor``: check what a mount needs and say what is wrong, one line per check.

On a running gateway's mountpoint it checks that mount, as its daemon runs it
(:mod:`gateway.doctor.live`), and the flags that choose a store or a cache are refused: they
would check something else than what runs. Otherwise the configuration is resolved as ``mount``
resolves it (:func:`gateway.config.load_config`), then this machine is checked
(:mod:`gateway.doctor.hostcheck`: FUSE, passthrough, the cache disk, the mountpoint) and then the
store (:mod:`gateway.doctor.storeprobe`). A config file that does not load is one failed line, and
the rest is checked with the flags and defaults alone. Exit code 0 when no check failed (warnings
and information do not fail), 1 otherwise."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from ckptgw.gateway import registry
from ckptgw.gateway.client import Mount, mount_at
from ckptgw.gateway.config import Config, load_config
from ckptgw.gateway.doctor.hostcheck import (
    FAIL,
    OK,
    Check,
    cache_checks,
    fuse_check,
    mountpoint_check,
    passthrough_check,
)
from ckptgw.gateway.errors import UserError
from ckptgw.gateway.mountpoint import FSTYPE, is_stale, mounted_fstype

# Without a MOUNTPOINT, the defaults that depend on one (the cache dir) are those of this one.
PLACEHOLDER = "/mnt/ckpt"


def resolve(
    mountpoint: str | None, config_file: str | None, **flags: Any
) -> Generator[Check, None, Config | None]:
    """The config as ``mount`` would load it; returns it (generator return) after the lines
    about it: none without a config file, one with it, two if even the flags do not load."""
    mp = mountpoint or PLACEHOLDER
    try:
        cfg = load_config(mp, config_file=config_file, **flags)
    except UserError as e:
        if config_file is None:
            yield Check("config", FAIL, str(e))
            return None
        yield Check("config", FAIL, f"{e}; the checks below use the flags and defaults")
        try:
            return load_config(mp, **flags)
        except UserError as e2:
            yield Check("config", FAIL, str(e2))
            return None
    if config_file is not None:
        yield Check("config", OK, f"config file {config_file} loads")
    return cfg


def checks(mountpoint: str | None, config_file: str | None = None, **flags: Any) -> Iterator[Check]:
    """Every check, in order, as each is done."""
    cfg: Config | None = yield from resolve(mountpoint, config_file, **flags)
    yield fuse_check()
    yield passthrough_check(cfg)
    if cfg is not None:
        yield from cache_checks(cfg)
    if mountpoint is not None:
        yield mountpoint_check(Path(os.path.abspath(mountpoint)))
    if cfg is not None:
        from ckptgw.gateway.doctor.storeprobe import store_checks  # botocore: only now

        yield from store_checks(cfg)


CONFIG_FLAGS = ("config", "store", "cache_dir", "endpoint_url", "allow_local_store")


def running_gateway(mountpoint: str | None) -> Mount | None:
    """The gateway mounted and answering at ``mountpoint``; None where nothing (or a dead
    gateway's stale mount) is mounted there. UserError where one runs but cannot be asked."""
    if mountpoint is None:
        return None
    mp = Path(os.path.abspath(mountpoint))
    entry = registry.find(mp)  # first: a hung gateway would never answer a listing of its mount
    if entry is not None:  # find() drops the entries of dead processes
        return Mount(mp, entry)
    if mounted_fstype(mp) != FSTYPE or is_stale(mp):
        return None
    return mount_at(mp)  # NotRunning (another user's, another runtime dir) says what to do


def refuse_config_flags(mount: Mount, args: argparse.Namespace) -> None:
    """The flags that choose a store or a cache would check something else than what runs."""
    given = [f"--{f.replace('_', '-')}" for f in CONFIG_FLAGS if getattr(args, f)]
    if given:
        raise UserError(
            f"{mount.mountpoint} is a running gateway: doctor checks the store and cache dir "
            f"it runs with, so {', '.join(given)} would check something else; drop "
            f"{'it' if len(given) == 1 else 'them'}, or leave out the mountpoint to check "
            "a configuration before mounting it"
        )


def run(args: argparse.Namespace) -> int:
    """``ckptgw doctor``: print the checks (as they are done, or a JSON list at the end)."""
    try:
        mount = running_gateway(args.mountpoint)
        if mount is not None:
            refuse_config_flags(mount, args)
    except UserError as e:
        if not args.json:
            raise
        return report(iter([Check("gateway", FAIL, str(e))]), True)  # --json: still a list
    if mount is not None:
        from ckptgw.gateway.doctor import live

        return report(live.checks(mount), args.json)
    return report(
        checks(
            args.mountpoint,
            args.config,
            store=args.store,
            cache_dir=args.cache_dir,
            endpoint_url=args.endpoint_url,
            allow_local_store=args.allow_local_store,
        ),
        args.json,
    )


def report(done: Iterator[Check], as_json: bool) -> int:
    """Print each check as it is done (or a JSON list at the end); 1 if any failed."""
    found: list[Check] = []
    for c in done:
        found.append(c)
        if not as_json:
            print(c.line(), flush=True)
    if as_json:
        print(json.dumps([dataclasses.asdict(c) for c in found], indent=2))
    return 1 if any(c.status == FAIL for c in found) else 0

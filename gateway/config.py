"""Configuration: defaults, then a TOML file, then command-line flags (last one wins).

Example (every key optional)::

    [store]
    url = "s3://my-bucket/checkpoints"
    endpoint_url = "http://127.0.0.1:9000"
    listing_ttl = 5.0         # seconds a directory listing of the store is reused

    [cache]
    dir = "/nvme/ckptgw"
    reserve = "1GiB"          # kept free on the cache disk; writes get ENOSPC before it
    early_writeback = "8MiB"  # without direct I/O: start write-out every N bytes; 0 = off
    direct_io = true          # O_DIRECT cache writes where the cache filesystem supports it
    size = "200GiB"           # the most the cache files may hold; unset: the disk's room
    write_wait = 60.0         # seconds a write waits for the drain to free room, then ENOSPC
    fetch_chunk = "8MiB"      # ranged GETs of files read from the store
    fetch_parallel = 8        # ranged GETs in flight

    [mount]
    allow_other = false
    attr_timeout = 1.0
    writeback_cache = true    # the kernel's write-back cache (not with passthrough)
    passthrough = true        # the kernel reads/writes cache files (Linux >= 6.9, root)

    [drain]
    settle = 0.2              # seconds a closed file stays quiet before it is uploaded
    max_files = 4             # files uploading at once
    max_parts = 8             # multipart parts in flight (memory: max_parts x part_size)
    part_size = "16MiB"
    multipart_threshold = "16MiB"
    permanent_retry = 60.0    # seconds between retries after a permanent error (403, 404)

    [shutdown]
    deadline = 60.0           # after SIGTERM: seconds to drain before exiting regardless

    [preemption]
    provider = "off"          # "aws" (spot), "gcp", "azure" or "off"
    url = ""                  # the metadata endpoint; empty: the provider's own
    interval = 5.0            # seconds between polls
    command = ""              # run once (sh -c) when a notice arrives, e.g. to tell the trainer

    [metrics]
    listen = ""               # "127.0.0.1:9464" serves Prometheus metrics at /metrics; empty: off

    [lifecycle]
    interval = 0              # seconds between retention runs inside the daemon; 0: off
    abort_days = 7            # bucket rule: abort incomplete multipart uploads after N days
    storage_class = ""        # bucket rule: move milestones to this class (e.g. "GLACIER_IR")
    transition_days = 30      # ... this many days after they were written
    patterns = []             # regexes naming checkpoints, one group = the step; default:
                              # step_N, global_stepN, iter_N, checkpoint-N, epoch_N, ckpt_N.pt

    [[retention]]             # one table per run (a directory in the mount)
    run = "jobs/llama"
    keep_last = 3             # complete durable checkpoints kept, newest first
    keep_every = 1000         # steps that are multiples are milestones, kept; 0: none
    min_age = 0.0             # seconds: younger checkpoints are never deleted
    marker = ".metadata"      # complete once a file matching this is durable (DCP's marker)
    quiet = 300.0             # without a marker: complete once durable and quiet this long

    [log]
    level = "info"
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptgw.drain.checkpoints import DEFAULT_PATTERNS
from ckptgw.drain.lifecycle import BucketRules, RunPolicy
from ckptgw.drain.retention import Policy
from ckptgw.drain.storeurl import StoreURL, StoreURLError, parse_store_url
from ckptgw.gateway.errors import UserError

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(value: object, what: str) -> int:
    """Bytes from an int or a string like "256MiB", "1G", "4096"."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise UserError(f"config: {what} = {value!r} is not a size (e.g. 512MiB, 2GiB, 4096)")
    unit = (m.group(2) or "").upper()[:1]
    return int(m.group(1)) * _UNITS[unit]


def _escape_path(path: Path) -> str:
    """A file name for a mountpoint, like systemd-escape --path: /mnt/ckpt -> mnt-ckpt."""
    text = str(path).strip("/") or "root"
    return re.sub(r"[^A-Za-z0-9_.]", "-", text)


def data_home() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/ckptgw")
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local/share")) / "ckptgw"


def cache_home() -> Path:
    if os.geteuid() == 0:
        return Path("/var/cache/ckptgw")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ckptgw"


@dataclass
class Config:
    mountpoint: Path
    store: StoreURL
    cache_dir: Path
    endpoint_url: str | None = None
    # A store on this node's own disks (a file:// store not on a network filesystem) holds
    # no copy that survives the node: the mount refuses one unless this is set.
    allow_local_store: bool = False
    allow_other: bool = False
    writeback_cache: bool = True
    passthrough: bool = True
    attr_timeout: float = 1.0
    reserve_bytes: int = 256 << 20
    early_writeback: int = 8 << 20
    direct_io: bool = True
    log_level: str = "info"
    log_file: Path | None = None  # None: <cache dir>/ckptgw.log
    foreground: bool = False
    settle: float = 0.2
    max_files: int = 4
    max_parts: int = 8
    part_size: int = 16 << 20
    multipart_threshold: int = 16 << 20
    permanent_retry: float = 60.0
    listing_ttl: float = 5.0
    cache_size: int | None = None
    write_wait: float = 60.0
    fetch_chunk: int = 8 << 20
    fetch_parallel: int = 8
    shutdown_deadline: float = 60.0
    preemption_provider: str = "off"
    preemption_url: str = ""
    preemption_interval: float = 5.0
    preemption_command: str = ""
    metrics_listen: tuple[str, int] | None = None
    retention: tuple[RunPolicy, ...] = ()
    lifecycle_interval: float = 0.0
    checkpoint_patterns: tuple[str, ...] = DEFAULT_PATTERNS
    bucket_rules: BucketRules = field(default_factory=BucketRules)


# Every section and its keys, in the order of the example above.
_KNOWN = {
    "store": {"url", "endpoint_url", "listing_ttl", "allow_local"},
    "cache": {
        "dir",
        "reserve",
        "early_writeback",
        "direct_io",
        "size",
        "write_wait",
        "fetch_chunk",
        "fetch_parallel",
    },
    "mount": {"allow_other", "attr_timeout", "writeback_cache", "passthrough"},
    "drain": {
        "settle",
        "max_files",
        "max_parts",
        "part_size",
        "multipart_threshold",
        "permanent_retry",
    },
    "shutdown": {"deadline"},
    "preemption": {"provider", "url", "interval", "command"},
    "metrics": {"listen"},
    "lifecycle": {"interval", "abort_days", "storage_class", "transition_days", "patterns"},
    "retention": {"run", "keep_last", "keep_every", "min_age", "marker", "quiet"},
    "log": {"level", "file"},
}
_TABLE_LISTS = {"retention"}  # written [[retention]]: one table per run


def _header(section: str) -> str:
    return f"[[{section}]]" if section in _TABLE_LISTS else f"[{section}]"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"config file {path}: {e}") from None
    for name, body in data.items():
        for table in _tables(path, name, body):
            unknown = set(table) - _KNOWN[name]
            if unknown:
                raise UserError(f"config file {path}: unknown key {name}.{sorted(unknown)[0]}")
    return data


def _tables(path: Path, name: str, body: object) -> list[dict[str, Any]]:
    """The tables of one top-level entry of the file; UserError for anything that is not a
    section this file may have."""
    where = f"config file {path}"
    is_tables = isinstance(body, list) and all(isinstance(t, dict) for t in body)
    if name not in _KNOWN:
        sections = ", ".join(_header(s) for s in _KNOWN)
        if isinstance(body, dict) or (is_tables and body):
            header = f"[{name}]" if isinstance(body, dict) else f"[[{name}]]"
            raise UserError(f"{where}: unknown section {header}; the sections are {sections}")
        owners = " or ".join(_header(s) for s, keys in _KNOWN.items() if name in keys)
        hint = f"; {name} belongs under {owners}" if owners else ""
        raise UserError(
            f"{where}: unknown top-level key {name}: settings go in sections: {sections}{hint}"
        )
    if name in _TABLE_LISTS:
        if isinstance(body, list) and is_tables:
            return body
        raise UserError(f"{where}: write {name} as [[{name}]] tables, one per run")
    if isinstance(body, dict):
        return [body]
    got = f"[[{name}]] tables" if is_tables else "a value"
    raise UserError(f"{where}: {name} must be one section, [{name}], not {got}")


def load_config(
    mountpoint: str,
    *,
    config_file: str | None = None,
    store: str | None = None,
    cache_dir: str | None = None,
    endpoint_url: str | None = None,
    allow_other: bool | None = None,
    passthrough: bool | None = None,
    allow_local_store: bool | None = None,
    log_level: str | None = None,
    log_file: str | None = None,
    foreground: bool = False,
) -> Config:
    data = _read_toml(Path(config_file)) if config_file else {}
    st, ca, mo, lg, dr = (data.get(k, {}) for k in ("store", "cache", "mount", "log", "drain"))
    sd, pe, me, lc = (data.get(k, {}) for k in ("shutdown", "preemption", "metrics", "lifecycle"))
    provider = str(pe.get("provider", "off")).lower()
    if provider not in PREEMPTION_PROVIDERS:
        raise UserError(
            f"config: preemption.provider = {provider!r} is not one of "
            + ", ".join(PREEMPTION_PROVIDERS)
        )
    mp = Path(os.path.abspath(mountpoint))

    url = store or st.get("url") or f"file://{data_home() / 'store'}"
    try:
        store_url = parse_store_url(url)
    except StoreURLError as e:
        raise UserError(str(e)) from None

    cdir = cache_dir or ca.get("dir") or str(cache_home() / _escape_path(mp))
    level = str(log_level or lg.get("level", "info")).lower()
    if level not in ("debug", "info", "warning", "error"):
        raise UserError(f"config: log.level = {level!r} is not debug, info, warning or error")
    timeout = mo.get("attr_timeout", 1.0)
    if not isinstance(timeout, int | float) or timeout < 0:
        raise UserError(f"config: mount.attr_timeout = {timeout!r} is not a number >= 0")
    return Config(
        mountpoint=mp,
        store=store_url,
        cache_dir=Path(os.path.abspath(cdir)),
        endpoint_url=endpoint_url or st.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL"),
        allow_other=bool(allow_other if allow_other is not None else mo.get("allow_other", False)),
        writeback_cache=bool(mo.get("writeback_cache", True)),
        passthrough=bool(passthrough if passthrough is not None else mo.get("passthrough", True)),
        attr_timeout=float(timeout),
        reserve_bytes=parse_size(ca.get("reserve", 256 << 20), "cache.reserve"),
        early_writeback=parse_size(ca.get("early_writeback", 8 << 20), "cache.early_writeback"),
        direct_io=bool(ca.get("direct_io", True)),
        log_level=level,
        log_file=Path(os.path.abspath(lf)) if (lf := log_file or lg.get("file")) else None,
        allow_local_store=bool(
            allow_local_store if allow_local_store is not None else st.get("allow_local", False)
        ),
        foreground=foreground,
        settle=_number(dr, "settle", 0.2, float),
        max_files=int(_number(dr, "max_files", 4, int, minimum=1)),
        max_parts=int(_number(dr, "max_parts", 8, int, minimum=1)),
        part_size=parse_size(dr.get("part_size", 16 << 20), "drain.part_size"),
        multipart_threshold=parse_size(
            dr.get("multipart_threshold", 16 << 20), "drain.multipart_threshold"
        ),
        permanent_retry=_number(dr, "permanent_retry", 60.0, float, minimum=0.1),
        listing_ttl=_number(st, "listing_ttl", 5.0, float, section_name="store"),
        cache_size=parse_size(ca["size"], "cache.size") if "size" in ca else None,
        write_wait=_number(ca, "write_wait", 60.0, float, section_name="cache"),
        fetch_chunk=_chunk(ca.get("fetch_chunk", 8 << 20)),
        fetch_parallel=int(_number(ca, "fetch_parallel", 8, int, minimum=1, section_name="cache")),
        shutdown_deadline=_number(sd, "deadline", 60.0, float, section_name="shutdown"),
        preemption_provider=provider,
        preemption_url=str(pe.get("url", "")),
        preemption_interval=_number(
            pe, "interval", 5.0, float, minimum=0.05, section_name="preemption"
        ),
        preemption_command=str(pe.get("command", "")),
        metrics_listen=_listen(me.get("listen", "")),
        retention=tuple(_run_policy(t) for t in data.get("retention", [])),
        lifecycle_interval=_number(lc, "interval", 0.0, float, section_name="lifecycle"),
        checkpoint_patterns=_patterns(lc.get("patterns", [])),
        bucket_rules=BucketRules(
            abort_days=int(_number(lc, "abort_days", 7, int, 1, "lifecycle")),
            storage_class=str(lc.get("storage_class", "")),
            transition_days=int(_number(lc, "transition_days", 30, int, 0, "lifecycle")),
        ),
    )


def _patterns(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise UserError("config: lifecycle.patterns must be a list of regular expressions")
    for p in value:
        try:
            groups = re.compile(p).groups
        except re.error as e:
            raise UserError(f"config: lifecycle.patterns: {p!r} is not a regex: {e}") from None
        if groups != 1:
            raise UserError(f"config: lifecycle.patterns: {p!r} needs one group, the step number")
    return tuple(value) or DEFAULT_PATTERNS


def _run_policy(t: dict[str, Any]) -> RunPolicy:
    run = str(t.get("run", "")).strip("/")
    if not run:
        raise UserError('config: every [[retention]] needs run = "DIR" (a directory in the mount)')
    try:
        policy = Policy(
            keep_last=int(_number(t, "keep_last", 3, int, 1, "retention")),
            keep_every=int(_number(t, "keep_every", 0, int, 0, "retention")),
            min_age=_number(t, "min_age", 0.0, float, 0, "retention"),
        )
    except ValueError as e:
        raise UserError(f"config: retention for {run}: {e}") from None
    return RunPolicy(
        run,
        policy,
        marker=str(t.get("marker", "")),
        quiet=_number(t, "quiet", 300.0, float, 0, "retention"),
    )


PREEMPTION_PROVIDERS = ("off", "aws", "gcp", "azure")


def _listen(value: object) -> tuple[str, int] | None:
    """ "HOST:PORT" (or ":PORT", all interfaces) for the metrics endpoint; empty: off."""
    text = str(value).strip()
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"config: metrics.listen = {text!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    return host.strip("[]") or "0.0.0.0", int(port)


def _chunk(value: object) -> int:
    size = parse_size(value, "cache.fetch_chunk")
    if not (64 << 10) <= size <= (1 << 30):
        raise UserError(f"config: cache.fetch_chunk = {value!r} is not between 64KiB and 1GiB")
    return size


def _number(
    section: dict[str, Any],
    key: str,
    default: float,
    kind: type,
    minimum: float = 0,
    section_name: str = "drain",
) -> float:
    value = section.get(key, default)
    what = f"{section_name}.{key}"
    if not isinstance(value, int | float) or isinstance(value, bool) or value < minimum:
        raise UserError(f"config: {what} = {value!r} is not a number >= {minimum}")
    if kind is int and not isinstance(value, int):
        raise UserError(f"config: {what} = {value!r} is not a whole number")
    return float(value)

"""Configuration: defaults, then a TOML file, then command-line flags (last one wins).

Every setting (section, key, default, check, flag) is written once, in :mod:`gateway.settings`;
docs/config.md, the reference, is printed from it. This module reads the file through that
table and fills in the defaults that depend on the machine (the store and cache paths).
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ckptgw.drain.reads.fetch import FetchConfig
from ckptgw.drain.reads.listing import ListingConfig
from ckptgw.drain.retention.lifecycle import BucketRules, RunPolicy
from ckptgw.drain.retention.policy import Policy
from ckptgw.drain.uploads.engine import DrainConfig
from ckptgw.drain.uploads.scheduler import ScheduleConfig
from ckptgw.drain.uploads.upload import UploadConfig
from ckptgw.fsops.filesystem import FsOptions
from ckptgw.gateway.daemon.preemption import WatchConfig
from ckptgw.gateway.errors import UserError
from ckptgw.gateway.settings import BY_NAME, SECTIONS, SETTINGS, default, known, parse_size
from ckptgw.store.deadlines import Deadlines
from ckptgw.store.pacing import PacingConfig
from ckptgw.store.url import StoreURL, StoreURLError, parse_store_url

__all__ = ["Config", "cache_home", "data_home", "load_config", "parse_size"]


def _endpoint(url: str | None) -> str | None:
    """An S3 endpoint: http(s)://HOST[:PORT], with no credentials in it (they would show in
    errors and status: the AWS credential chain carries them)."""
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise UserError(
            "--endpoint-url (store.endpoint_url, AWS_ENDPOINT_URL): credentials do not belong "
            "in the URL; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or a profile instead"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(
            f"--endpoint-url (store.endpoint_url, AWS_ENDPOINT_URL) {url!r} is not "
            "http(s)://HOST[:PORT]"
        )
    return url


def _yield_to_saves(value: float | None) -> float:
    """The drain yields to sharded saves where cores are few (see drain.yield_to_saves)."""
    if value is not None:
        return value
    return 30.0 if (os.cpu_count() or 1) <= 4 else 0.0


def _part_workers(value: int | None) -> int:
    """Part worker processes pay off where cores are many (see drain.part_workers)."""
    if value is not None:
        return value
    cpus = os.cpu_count() or 1
    return 0 if cpus <= 4 else min(4, cpus // 4)


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
    """What the daemon runs with. The defaults are gateway/settings.py's (docs/config.md)."""

    mountpoint: Path
    store: StoreURL
    cache_dir: Path
    endpoint_url: str | None = None
    # A store on this node's own disks (a file:// store not on a network filesystem) holds
    # no copy that survives the node: the mount refuses one unless this is set.
    allow_local_store: bool = default("store.allow_local")
    allow_other: bool = default("mount.allow_other")
    writeback_cache: bool = default("mount.writeback_cache")
    passthrough: bool = default("mount.passthrough")
    attr_timeout: float = default("mount.attr_timeout")
    reserve_bytes: int = default("cache.reserve")
    early_writeback: int = default("cache.early_writeback")
    direct_io: bool = default("cache.direct_io")
    log_level: str = default("log.level")
    log_file: Path | None = None  # None: <cache dir>/ckptgw.log
    foreground: bool = False
    settle: float = default("drain.settle")
    max_files: int = default("drain.max_files")
    max_small_files: int = default("drain.max_small_files")
    yield_to_saves: float = 0.0
    max_parts: int = default("drain.max_parts")
    part_workers: int = 0
    part_size: int = default("drain.part_size")
    multipart_threshold: int = default("drain.multipart_threshold")
    permanent_retry: float = default("drain.permanent_retry")
    listing_ttl: float = default("store.listing_ttl")
    connect_timeout: float = default("store.connect_timeout")
    first_byte_timeout: float = default("store.first_byte_timeout")
    stall_timeout: float = default("store.stall_timeout")
    stall_warning: float = default("store.stall_warning")
    lookup_wait: float = default("store.lookup_wait")
    adaptive_rate: bool = default("store.adaptive_rate")
    min_rate: float = default("store.min_rate")
    cache_size: int | None = None  # None: the cache disk's room
    write_wait: float = default("cache.write_wait")
    fetch_chunk: int | None = None  # None: adapts to each object
    fetch_chunk_max: int = default("cache.fetch_chunk_max")
    prefetch: bool = default("cache.prefetch")
    fetch_parallel: int = default("cache.fetch_parallel")
    shutdown_deadline: float = default("shutdown.deadline")
    preemption_provider: str = default("preemption.provider")
    preemption_url: str = default("preemption.url")
    preemption_interval: float = default("preemption.interval")
    preemption_command: str = default("preemption.command")
    metrics_listen: tuple[str, int] | None = default("metrics.listen")
    retention: tuple[RunPolicy, ...] = ()
    lifecycle_interval: float = default("lifecycle.interval")
    checkpoint_patterns: tuple[str, ...] = default("lifecycle.patterns")
    bucket_rules: BucketRules = field(default_factory=BucketRules)

    # What each module below the gateway is given of the settings, built here and only here;
    # each field keeps the table's name (ScheduleConfig.max_small_files is drain.max_small_files).

    @property
    def deadlines(self) -> Deadlines:
        """What every request to the store is held to (ckptgw.store.deadlines)."""
        return Deadlines(
            connect_timeout=self.connect_timeout,
            first_byte_timeout=self.first_byte_timeout,
            stall_timeout=self.stall_timeout,
            stall_warning=self.stall_warning,
        )

    def pacing(self) -> PacingConfig:
        return PacingConfig(adaptive_rate=self.adaptive_rate, min_rate=self.min_rate)

    def fs_options(self) -> FsOptions:
        return FsOptions(
            store_url=str(self.store),
            key_prefix=self.store.key_prefix,
            reserve_bytes=self.reserve_bytes,
            early_writeback=self.early_writeback,
            direct_io=self.direct_io,
            writeback_cache=self.writeback_cache,
            passthrough=self.passthrough,
            attr_timeout=self.attr_timeout,
            cache_size=self.cache_size,
            write_wait=self.write_wait,
        )

    def schedule(self) -> ScheduleConfig:
        return ScheduleConfig(
            settle=self.settle,
            max_files=self.max_files,
            emergency_files=self.max_parts,  # the emergency drain: as many files as parts
            permanent_retry=self.permanent_retry,
            max_small_files=self.max_small_files,
            yield_to_saves=self.yield_to_saves,
        )

    def drain(self) -> DrainConfig:
        return DrainConfig(
            max_parts=self.max_parts,
            upload=UploadConfig(
                multipart_threshold=max(self.multipart_threshold, 5 << 20),
                part_size=self.part_size,
            ),
        )

    def listing(self) -> ListingConfig:
        return ListingConfig(listing_ttl=self.listing_ttl)

    def fetch(self) -> FetchConfig:
        return FetchConfig(
            fetch_chunk=self.fetch_chunk,
            fetch_chunk_max=self.fetch_chunk_max,
            fetch_parallel=self.fetch_parallel,
        )

    def preemption(self) -> WatchConfig:
        return WatchConfig(
            self.preemption_provider,
            self.preemption_url,
            self.preemption_interval,
            self.preemption_command,
        )

    @property
    def log_path(self) -> Path:
        return self.log_file or self.cache_dir / "ckptgw.log"

    def running_view(self) -> dict[str, Any]:
        """What a running daemon tells ``ckptgw doctor`` it runs with (the control socket's
        ``config``): what doctor checks. No credentials: the config never holds any."""
        return {
            "mountpoint": str(self.mountpoint),
            "store": str(self.store),
            "endpoint_url": self.endpoint_url,
            "cache_dir": str(self.cache_dir),
            "allow_local_store": self.allow_local_store,
            "passthrough": self.passthrough,
            "reserve_bytes": self.reserve_bytes,
            "cache_size": self.cache_size,
            "direct_io": self.direct_io,
            "log_file": str(self.log_path),
        }

    @classmethod
    def from_running_view(cls, view: dict[str, Any]) -> Config:
        """The Config a ``running_view`` describes (the rest at its defaults)."""
        try:
            return cls(
                mountpoint=Path(view["mountpoint"]),
                store=parse_store_url(str(view["store"])),
                cache_dir=Path(view["cache_dir"]),
                endpoint_url=view.get("endpoint_url"),
                allow_local_store=bool(view["allow_local_store"]),
                passthrough=bool(view["passthrough"]),
                reserve_bytes=int(view["reserve_bytes"]),
                cache_size=None if view.get("cache_size") is None else int(view["cache_size"]),
                direct_io=bool(view["direct_io"]),
                log_file=Path(view["log_file"]),
            )
        except (KeyError, TypeError, ValueError, StoreURLError) as e:
            raise UserError(f"the gateway's description of its configuration: {e!r}") from None


_KNOWN = known()  # every section and its keys
_TABLE_LISTS = {s.name for s in SECTIONS if s.many}  # written [[name]]: one table each


def _header(section: str) -> str:
    return f"[[{section}]]" if section in _TABLE_LISTS else f"[{section}]"


def read_config_file(path: Path) -> dict[str, Any]:
    """The TOML file, every section and key checked against the settings table."""
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
        if isinstance(body, dict):  # [retention]: one table, where a list of them is meant
            run = body.get("run") if isinstance(body.get("run"), str) else "jobs/llama"
            raise UserError(
                f"{where}: write [[{name}]] (double brackets), not [{name}]: one [[{name}]] "
                f'table per run, e.g. the two lines [[{name}]] and run = "{run}"'
            )
        raise UserError(f"{where}: write {name} as [[{name}]] tables, one per run")
    if isinstance(body, dict):
        return [body]
    got = f"[[{name}]] tables" if is_tables else "a value"
    raise UserError(f"{where}: {name} must be one section, [{name}], not {got}")


# The settings of Config: every section but the per-run [[retention]] tables and `serve nfs`'s.
_CONFIG_SETTINGS = tuple(s for s in SETTINGS if s.section not in ("retention", "nfs"))


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
    """Every setting of the table: the flag's value (None or "": not given), else the file's,
    else the table's default; then the defaults that depend on the machine."""
    data = read_config_file(Path(config_file)) if config_file else {}
    flags: dict[str, object] = {
        "store.url": store,
        "cache.dir": cache_dir,
        "store.endpoint_url": endpoint_url,
        "mount.allow_other": allow_other,
        "mount.passthrough": passthrough,
        "store.allow_local": allow_local_store,
        "log.level": log_level,
        "log.file": log_file,
    }
    mp = Path(os.path.abspath(mountpoint))
    fields: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}  # "bucket_rules.abort_days": one object's field
    for s in _CONFIG_SETTINGS:
        override = flags.get(s.name)
        override = None if override == "" else override  # an empty flag: not given
        value = _computed(s.name, s.read(data.get(s.section, {}), override), mp)
        owner, dot, name = s.field.partition(".")
        if dot:
            nested.setdefault(owner, {})[name] = value
        else:
            fields[s.field] = value
    return Config(
        mountpoint=mp,
        foreground=foreground,
        retention=tuple(_run_policy(t) for t in data.get("retention", [])),
        bucket_rules=BucketRules(**nested.pop("bucket_rules")),
        **fields,
    )


def _computed(name: str, value: Any, mountpoint: Path) -> Any:
    """One setting as Config holds it: the defaults that depend on the machine, the paths made
    absolute, the store's URL parsed."""
    if name == "store.url":
        try:
            return parse_store_url(value or f"file://{data_home() / 'store'}")
        except StoreURLError as e:
            raise UserError(str(e)) from None
    if name == "store.endpoint_url":
        return _endpoint(value or os.environ.get("AWS_ENDPOINT_URL"))
    if name == "cache.dir":
        return Path(os.path.abspath(value or str(cache_home() / _escape_path(mountpoint))))
    if name == "log.file":
        return Path(os.path.abspath(value)) if value else None
    if name == "drain.yield_to_saves":
        return _yield_to_saves(value)
    if name == "drain.part_workers":
        return _part_workers(value)
    return value


def _run_policy(t: dict[str, Any]) -> RunPolicy:
    """One [[retention]] table."""

    def get(key: str) -> Any:
        return BY_NAME[f"retention.{key}"].read(t)

    run = (get("run") or "").strip("/")
    if not run:
        raise UserError('config: every [[retention]] needs run = "DIR" (a directory in the mount)')
    try:
        policy = Policy(
            keep_last=get("keep_last"), keep_every=get("keep_every"), min_age=get("min_age")
        )
    except ValueError as e:
        raise UserError(f"config: retention for {run}: {e}") from None
    return RunPolicy(run, policy, marker=get("marker"), quiet=get("quiet"))

"""Every setting of the config file, written once: its section and key, how it is parsed and
checked, its default, the ``ckptgw mount`` flag that overrides it and what it does.

:mod:`gateway.config` reads the file through this table (the keys it accepts, the defaults it
fills in, the checks it makes); ``Config``'s field defaults come from it; docs/config.md is
printed from it::

    python -m ckptgw.gateway.settings > docs/config.md

tests/test_config.py checks that an empty config file gives every default written here and that
docs/config.md is this module's output.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ckptgw.drain.checkpoints import DEFAULT_PATTERNS
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


def _size_text(n: int) -> str:
    for unit in "TGMK":
        if n and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}iB"
    return str(n)


class Kind(Protocol):
    """How a value is read and checked, and how the reference describes what is allowed."""

    def parse(self, value: object, what: str) -> Any: ...

    def allowed(self) -> str: ...


@dataclass(frozen=True)
class Bool:
    def parse(self, value: object, what: str) -> bool:
        if not isinstance(value, bool):
            raise UserError(f"config: {what} = {value!r} is not true or false")
        return value

    def allowed(self) -> str:
        return "`true` or `false`"


@dataclass(frozen=True)
class Number:
    minimum: float = 0
    whole: bool = False

    def parse(self, value: object, what: str) -> float | int:
        if not isinstance(value, int | float) or isinstance(value, bool) or value < self.minimum:
            raise UserError(f"config: {what} = {value!r} is not a number >= {self.minimum}")
        if self.whole:
            if not isinstance(value, int):
                raise UserError(f"config: {what} = {value!r} is not a whole number")
            return value
        return float(value)

    def allowed(self) -> str:
        return f"a {'whole ' if self.whole else ''}number >= {self.minimum}"


@dataclass(frozen=True)
class Size:
    low: int = 0
    high: int | None = None

    def parse(self, value: object, what: str) -> int:
        size = parse_size(value, what)
        if self.high is not None and not self.low <= size <= self.high:
            raise UserError(
                f"config: {what} = {value!r} is not between "
                f"{_size_text(self.low)} and {_size_text(self.high)}"
            )
        return size

    def allowed(self) -> str:
        if self.high is None:
            return "a size"
        return f"a size from {_size_text(self.low)} to {_size_text(self.high)}"


@dataclass(frozen=True)
class Choice:
    options: tuple[str, ...]

    def parse(self, value: object, what: str) -> str:
        text = str(value).lower()
        if text not in self.options:
            raise UserError(f"config: {what} = {value!r} is not one of {', '.join(self.options)}")
        return text

    def allowed(self) -> str:
        return "one of " + ", ".join(f'`"{o}"`' for o in self.options)


@dataclass(frozen=True)
class Text:
    shape: str = "a string"

    def parse(self, value: object, what: str) -> str:
        if not isinstance(value, str):
            raise UserError(f'config: {what} = {value!r} is not a string (write it in "quotes")')
        return value

    def allowed(self) -> str:
        return self.shape


@dataclass(frozen=True)
class Listen:
    """ "HOST:PORT" (or ":PORT", all interfaces) for the metrics endpoint; empty: off."""

    def parse(self, value: object, what: str) -> tuple[str, int] | None:
        text = str(value).strip()
        if not text:
            return None
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit() or not 0 < int(port) < 65536:
            raise UserError(f"config: {what} = {text!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
        return host.strip("[]") or "0.0.0.0", int(port)

    def allowed(self) -> str:
        return '`"HOST:PORT"`, `":PORT"` (every interface) or `""`'


@dataclass(frozen=True)
class Networks:
    """Client addresses and networks in CIDR form; a string may list them split by commas."""

    def parse(self, value: object, what: str) -> tuple[str, ...]:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(x, str) for x in items):
            raise UserError(f'config: {what} must be a list of networks (e.g. ["10.0.0.0/16"])')
        out = []
        for item in (x.strip() for x in items if x.strip()):
            try:
                out.append(str(ipaddress.ip_network(item, strict=False)))
            except ValueError:
                raise UserError(
                    f"config: {what}: {item!r} is not an address or a network in CIDR form "
                    "(e.g. 10.0.0.0/16)"
                ) from None
        return tuple(out)

    def allowed(self) -> str:
        return 'a list of addresses or CIDR networks, e.g. `["10.0.0.0/16"]`'


@dataclass(frozen=True)
class Versions:
    """NFS versions: 3 and 4 (a string may list them split by commas)."""

    def parse(self, value: object, what: str) -> tuple[int, ...]:
        items = value.split(",") if isinstance(value, str) else value
        try:
            found = {int(x) for x in items} if isinstance(items, list | tuple) else set()
        except (TypeError, ValueError):
            found = set()
        if not found or not found <= {3, 4}:
            raise UserError(f"config: {what} = {value!r} is not a list of NFS versions: 3, 4")
        return tuple(sorted(found))

    def allowed(self) -> str:
        return "`[3, 4]`, `[3]` or `[4]`"


@dataclass(frozen=True)
class Patterns:
    """Regular expressions naming checkpoints; an empty list means the built-in ones."""

    def parse(self, value: object, what: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise UserError(f"config: {what} must be a list of regular expressions")
        for p in value:
            try:
                groups = re.compile(p).groups
            except re.error as e:
                raise UserError(f"config: {what}: {p!r} is not a regex: {e}") from None
            if groups != 1:
                raise UserError(f"config: {what}: {p!r} needs one group, the step number")
        return tuple(value) or DEFAULT_PATTERNS

    def allowed(self) -> str:
        return "a list of regular expressions, each with one group: the step"


@dataclass(frozen=True)
class Section:
    name: str
    what: str
    many: bool = False  # written [[name]], one table each (a list of tables)

    @property
    def header(self) -> str:
        return f"[[{self.name}]]" if self.many else f"[{self.name}]"


@dataclass(frozen=True)
class Setting:
    section: str
    key: str
    kind: Kind
    default: object  # the TOML value an absent key means; None: computed (default_text says how)
    what: str
    default_text: str = ""  # a computed default, or what the default value means
    flag: str = ""  # the `ckptgw mount` flag that overrides the file
    example: object = None  # the example block's value; only for docs/config.md
    field: str = ""  # where load_config puts it: a Config attribute (RunPolicy for retention)

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"

    def read(self, table: Mapping[str, Any], override: object = None) -> Any:
        """The parsed value from one table of the file, or from a flag (override), else the
        default; None where the default is computed by the caller."""
        if override is not None:
            return self.kind.parse(override, self.flag or self.name)
        value = table.get(self.key, self.default)
        return None if value is None else self.kind.parse(value, self.name)


SECONDS = Number()
DEADLINE = Number(0.1)  # seconds a request may wait: never 0 (every wait has a bound)
_STORE_DIR = (
    "`file:///var/lib/ckptgw/store` as root, else `file://$XDG_DATA_HOME/ckptgw/store` "
    "(`~/.local/share/ckptgw/store`)"
)
_CACHE_DIR = (
    "`/var/cache/ckptgw/<mountpoint>` as root, else `$XDG_CACHE_HOME/ckptgw/<mountpoint>` "
    "(`~/.cache/ckptgw/...`); `<mountpoint>` escaped like `systemd-escape --path`: "
    "`/mnt/ckpt` is `mnt-ckpt`"
)

# fmt: off
SECTIONS = (
    Section("store", "where the files drain to"),
    Section("cache", "the local cache the mount writes into (put it on NVMe)"),
    Section("mount", "the FUSE mount"),
    Section("drain", "uploading to the store"),
    Section("shutdown", "what SIGTERM does"),
    Section("preemption", "spot and preemptible nodes: termination notices"),
    Section("metrics", "Prometheus metrics"),
    Section("lifecycle", "retention in the daemon, and the bucket's lifecycle rules"),
    Section("retention", "which checkpoints of a run are kept in the store, one table per run",
            many=True),
    Section("log", "the daemon's log"),
    Section("nfs", "`ckptgw serve nfs`: the mount exported over NFS by NFS-Ganesha (flags of "
            "`serve nfs` override these)"),
)

SETTINGS = (
    Setting("store", "url", Text("`s3://BUCKET[/PREFIX]` or `file:///PATH`"), None,
            "the store the files drain to; a `file://` store on this node's own disks needs "
            "`allow_local`", _STORE_DIR, "--store",
            "s3://my-bucket/checkpoints", "store"),
    Setting("store", "endpoint_url", Text("a URL"), None,
            "S3 endpoint of an S3-compatible store (path-style addressing)",
            "`$AWS_ENDPOINT_URL`, else AWS's own", "--endpoint-url",
            field="endpoint_url"),
    Setting("store", "listing_ttl", SECONDS, 5.0,
            "seconds a directory listing of the store is reused", field="listing_ttl"),
    Setting("store", "lookup_wait", DEADLINE, 2.0,
            "seconds a lookup waits for the store (a listing, an entry's metadata); then it is "
            "answered from what this node knows, where that cannot wrongly say a file is "
            "missing, and the request goes on in the background", field="lookup_wait"),
    Setting("store", "connect_timeout", DEADLINE, 10.0,
            "seconds to open a connection to the S3 endpoint", field="connect_timeout"),
    Setting("store", "first_byte_timeout", DEADLINE, 30.0,
            "seconds from a request sent to the first byte of its answer; then the attempt is "
            "cancelled and retried (CompleteMultipartUpload and copies: 10x, the store works on "
            "the whole object first)", field="first_byte_timeout"),
    Setting("store", "stall_timeout", DEADLINE, 30.0,
            "seconds without a byte moving while a request's body is sent or an answer's is "
            "received; then the attempt is cancelled and retried", field="stall_timeout"),
    Setting("store", "stall_warning", DEADLINE, 10.0,
            "seconds without progress after which a request counts as stalled: one warning in "
            "the log, and `ckptgw status` and the metrics name it until it moves again",
            field="stall_warning"),
    Setting("store", "adaptive_rate", Bool(), True,
            "learn how fast the store takes requests: after a refusal as too many (503 "
            "SlowDown, throttling) this gateway sends fewer per second, reads and writes "
            "apart, and speeds up again as requests are accepted (`ckptgw status` shows the "
            "rates); false: never slow down, only retry", field="adaptive_rate"),
    Setting("store", "min_rate", Number(0.01), 0.5,
            "requests per second (reads, and writes, each) below which a slowed-down gateway "
            "never goes", field="min_rate"),
    Setting("store", "allow_local", Bool(), False,
            "accept a `file://` store on this node's own disks, which does not survive the node",
            flag="--allow-local-store", field="allow_local_store"),
    Setting("cache", "dir", Text("a directory"), None,
            "the cache directory, on local NVMe; it also holds the journal, the log and the "
            "control socket (`control.sock`)", _CACHE_DIR, "--cache-dir",
            "/nvme/ckptgw", "cache_dir"),
    Setting("cache", "reserve", Size(), "256MiB",
            "kept free on the cache disk: writes get ENOSPC before it",
            field="reserve_bytes"),
    Setting("cache", "early_writeback", Size(), "8MiB",
            "without direct I/O: start write-out every N bytes; 0: off", field="early_writeback"),
    Setting("cache", "direct_io", Bool(), True,
            "O_DIRECT cache writes where the cache filesystem supports them", field="direct_io"),
    Setting("cache", "size", Size(), None,
            "the most the cache files may hold", "unset: the cache disk's room",
            example="200GiB", field="cache_size"),
    Setting("cache", "write_wait", SECONDS, 60.0,
            "seconds a write waits for the drain to free room, then ENOSPC", field="write_wait"),
    Setting("cache", "fetch_chunk", Size(64 << 10, 1 << 30), None,
            "a fixed size for the ranged GETs that read files from the store",
            "unset: adapts to each object (about its size / `fetch_parallel`, from 8MiB to "
            "`fetch_chunk_max`)", example="64MiB", field="fetch_chunk"),
    Setting("cache", "fetch_chunk_max", Size(8 << 20, 5 << 30), "256MiB",
            "the largest ranged GET when the size adapts", field="fetch_chunk_max"),
    Setting("cache", "fetch_parallel", Number(1, whole=True), 8,
            "ranged GETs in flight, over all files", field="fetch_parallel"),
    Setting("cache", "prefetch", Bool(), True,
            "opening a file of a checkpoint fetches all of that checkpoint's files (largest "
            "first, within the cache's room); `ckptgw warmup` does it on demand",
            field="prefetch"),
    Setting("mount", "allow_other", Bool(), False,
            "let other users than the gateway's use the mount (`default_permissions` is always "
            "on)", flag="--allow-other", field="allow_other"),
    Setting("mount", "attr_timeout", SECONDS, 1.0,
            "seconds the kernel caches attributes and names", field="attr_timeout"),
    Setting("mount", "writeback_cache", Bool(), True,
            "the kernel's write-back cache (on the daemon's data path)", field="writeback_cache"),
    Setting("mount", "passthrough", Bool(), True,
            "the kernel reads and writes cache files itself (Linux >= 6.9, as root); where it "
            "cannot, every byte goes through the daemon", flag="--no-passthrough",
            field="passthrough"),
    Setting("drain", "settle", SECONDS, 0.2,
            "seconds a closed file stays quiet before it is uploaded (a renamed one need not: "
            "the rename ends a save)", field="settle"),
    Setting("drain", "max_files", Number(1, whole=True), 4,
            "files uploading at once", field="max_files"),
    Setting("drain", "max_small_files", Number(1, whole=True), 16,
            "files of up to 4 MiB uploading at once besides `max_files` (the many small files "
            "of a sharded save; each PUT holds its file in memory)", field="max_small_files"),
    Setting("drain", "yield_to_saves", SECONDS, None,
            "while files are still being finished one after another (a sharded save), uploads "
            "wait until the burst ends, each for at most this many seconds, so the drain does "
            "not take the save's cores; 0: never", field="yield_to_saves",
            default_text="30 on a machine with 4 CPUs or fewer, else 0", example=30),
    Setting("drain", "max_parts", Number(1, whole=True), 8,
            "multipart parts in flight (memory: max_parts x part_size)", field="max_parts"),
    Setting("drain", "part_workers", Number(0, whole=True), None,
            "processes that read, checksum and send multipart parts (S3 stores), so that the "
            "bytes of uploads use more than the daemon's one core; 0: the daemon sends them",
            field="part_workers",
            default_text="0 on a machine with 4 CPUs or fewer, else CPUs / 4, at most 4",
            example=2),
    Setting("drain", "part_size", Size(), "16MiB",
            "multipart part size", field="part_size"),
    Setting("drain", "multipart_threshold", Size(), "16MiB",
            "files this big or bigger upload in parts", field="multipart_threshold"),
    Setting("drain", "permanent_retry", Number(0.1), 60.0,
            "seconds between retries after a permanent error (403, 404)",
            field="permanent_retry"),
    Setting("shutdown", "deadline", SECONDS, 60.0,
            "after SIGTERM: seconds to drain before exiting regardless",
            field="shutdown_deadline"),
    Setting("preemption", "provider", Choice(("off", "aws", "gcp", "azure")), "off",
            "whose metadata service to poll for a termination notice (`aws`: spot)",
            field="preemption_provider"),
    Setting("preemption", "url", Text("a URL"), "",
            "the metadata endpoint", "empty: the provider's own", field="preemption_url"),
    Setting("preemption", "interval", Number(0.05), 5.0,
            "seconds between polls", field="preemption_interval"),
    Setting("preemption", "command", Text("a shell command"), "",
            "run once with `sh -c` when a notice arrives, with `CKPTGW_MOUNTPOINT` and "
            "`CKPTGW_NOTICE` set, e.g. to tell the trainer to save now",
            "empty: none", field="preemption_command"),
    Setting("metrics", "listen", Listen(), "",
            "serve Prometheus metrics at `/metrics` on this address", "empty: off",
            example="127.0.0.1:9464", field="metrics_listen"),
    Setting("lifecycle", "interval", SECONDS, 0.0,
            "seconds between retention runs inside the daemon", "0: off",
            example=3600.0, field="lifecycle_interval"),
    Setting("lifecycle", "abort_days", Number(1, whole=True), 7,
            "bucket rule: abort incomplete multipart uploads after N days",
            field="bucket_rules.abort_days"),
    Setting("lifecycle", "storage_class", Text("an S3 storage class"), "",
            "bucket rule: move milestones to this storage class", "empty: they stay",
            example="GLACIER_IR", field="bucket_rules.storage_class"),
    Setting("lifecycle", "transition_days", Number(0, whole=True), 30,
            "bucket rule: milestones move to `storage_class` this many days after they were "
            "written",
            field="bucket_rules.transition_days"),
    Setting("lifecycle", "patterns", Patterns(), [],
            "regexes naming a checkpoint (a path component); the group is its step",
            "empty: the built-in ones, " + ", ".join(f"`{p}`" for p in DEFAULT_PATTERNS),
            field="checkpoint_patterns"),
    Setting("retention", "run", Text("a directory in the mount"), None,
            "the run this table is for", "required", example="jobs/llama", field="run"),
    Setting("retention", "keep_last", Number(1, whole=True), 3,
            "complete durable checkpoints kept, newest first", example=3,
            field="policy.keep_last"),
    Setting("retention", "keep_every", Number(0, whole=True), 0,
            "checkpoints whose step is a multiple of this are milestones, kept", "0: none",
            example=1000, field="policy.keep_every"),
    Setting("retention", "min_age", SECONDS, 0.0,
            "seconds: younger checkpoints are never deleted (set it above your drain time)",
            example=3600.0, field="policy.min_age"),
    Setting("retention", "marker", Text("a glob"), "",
            "a checkpoint is complete once a file matching this is durable (DCP: `.metadata`)",
            "empty: no marker, `quiet` decides", example=".metadata", field="marker"),
    Setting("retention", "quiet", SECONDS, 300.0,
            "without a marker: a checkpoint is complete once durable and quiet this long",
            field="quiet"),
    Setting("log", "level", Choice(("debug", "info", "warning", "error")), "info",
            "the least severe messages logged", flag="--log-level", field="log_level"),
    Setting("log", "file", Text("a file"), None,
            "the log file (rotated at 16 MiB, 3 kept)", "`<cache dir>/ckptgw.log`", "--log-file",
            field="log_file"),
    Setting("nfs", "listen", Listen(), ":2049",
            "the NFS server's address and port", "every interface, port 2049", "--listen",
            example="10.0.0.2:2049", field="listen"),
    Setting("nfs", "export", Text("an absolute path"), "/checkpoints",
            "the path clients mount, `GATEWAY:/checkpoints`, over NFSv3 and NFSv4",
            flag="--export", field="pseudo"),
    Setting("nfs", "clients", Networks(), [],
            "the client networks allowed to mount it, read-write; no other host may",
            "none: `serve nfs` refuses to start without them", "--clients",
            example=["10.0.0.0/16"], field="clients"),
    Setting("nfs", "protocols", Versions(), [3, 4],
            "the NFS versions served; NFSv3 needs rpcbind running on the node",
            flag="--protocols", field="protocols"),
    Setting("nfs", "root_squash", Bool(), True,
            "a client's root acts as nobody (uid 65534); the users of other uids are trusted as "
            "the client says (`sec=sys`)", flag="--no-root-squash", field="root_squash"),
    Setting("nfs", "mount_port", Number(1, whole=True), 20048,
            "NFSv3's MOUNT service port (fixed, to open in a firewall)", field="mount_port"),
    Setting("nfs", "grace", SECONDS, 20.0,
            "after NFS-Ganesha restarts, how long NFSv4 clients may reclaim their open files "
            "before new opens are served; 0 skips it", field="grace"),
)
# fmt: on

BY_NAME = {s.name: s for s in SETTINGS}


def known() -> dict[str, set[str]]:
    """Every section and its keys, in the reference's order."""
    return {sec.name: {s.key for s in SETTINGS if s.section == sec.name} for sec in SECTIONS}


def default(name: str) -> Any:
    """The parsed default of one setting, e.g. default("cache.reserve") == 256 << 20."""
    s = BY_NAME[name]
    return None if s.default is None else s.kind.parse(s.default, name)


# The environment variables ckptgw reads that a user may set (CKPTGW_READY_FD is internal:
# `ckptgw mount` and the daemon it starts).
# fmt: off
ENVIRONMENT = (
    ("AWS_ENDPOINT_URL", "`store.endpoint_url` when neither `--endpoint-url` nor the file sets it"),
    ("AWS_CA_BUNDLE", "a CA bundle for the S3 endpoint's certificate (botocore reads it)"),
    ("AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, ...",
     "credentials: the standard AWS chain (environment, profile, instance role)"),
    ("CKPTGW_RUNTIME_DIR",
     "where the registry of running gateways lives (one small JSON file per mountpoint, naming "
     "its cache dir and control socket), which `status`, `umount`, `flush` and the others read; "
     "default `/run/ckptgw` as root, else `$XDG_RUNTIME_DIR/ckptgw`, else "
     "`/tmp/ckptgw-<uid>/ckptgw`"),
    ("XDG_DATA_HOME", "not root: the default store is under `$XDG_DATA_HOME/ckptgw` "
     "(default `~/.local/share`)"),
    ("XDG_CACHE_HOME", "not root: the default cache dirs are under `$XDG_CACHE_HOME/ckptgw` "
     "(default `~/.cache`)"),
    ("XDG_RUNTIME_DIR", "not root, without `CKPTGW_RUNTIME_DIR`: the registry is in "
     "`$XDG_RUNTIME_DIR/ckptgw`"),
    ("NO_COLOR", "set: `ckptgw status` prints no colour (nor with `TERM=dumb`)"),
    ("NOTIFY_SOCKET", "set by systemd for `Type=notify`: `mount --foreground` reports "
     "readiness there"),
)
# fmt: on


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | list):
        return json.dumps(value)  # a TOML basic string or array, for the values used here
    return repr(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default_cell(s: Setting) -> str:
    if s.default is None:
        return s.default_text
    shown = f"`{_toml(s.default)}`"
    return f"{shown} ({s.default_text})" if s.default_text else shown


def _what_cell(s: Setting) -> str:
    text = f"{s.what}. Values: {s.kind.allowed()}."
    if s.flag:
        sets = " (sets it to `false`)" if s.flag.startswith("--no-") else ""
        text += f" Flag: `{s.flag}`{sets}."
    return text


def example() -> str:
    """A short config file using the settings that have an example (it loads; a test says so)."""
    lines = []
    for sec in SECTIONS:
        chosen = [s for s in SETTINGS if s.section == sec.name and s.example is not None]
        if chosen:
            lines += ["", sec.header, *(f"{s.key} = {_toml(s.example)}" for s in chosen)]
    return "\n".join(lines[1:]) + "\n"


def reference() -> str:
    """docs/config.md."""
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated from gateway/settings.py by "
        "`python -m ckptgw.gateway.settings > docs/config.md`; do not edit by hand. -->",
        "",
        "`ckptgw mount` takes its settings from the defaults below, then the TOML file given "
        "with `--config FILE`, then its flags: the last one wins. Every key is optional; an "
        "unknown section or key is an error. Sizes are bytes or a number with a unit, powers "
        "of 1024: `4096`, `512KiB`, `16MiB`, `2GiB`. Durations are seconds.",
    ]
    for sec in SECTIONS:
        out += ["", f"## `{sec.header}`: {sec.what}", ""]
        if sec.many:
            out += [
                f"Write `{sec.header}` (double brackets) once per run, each followed by its "
                "keys; `[retention]` is an error.",
                "",
            ]
        out += ["| key | default | what |", "|---|---|---|"]
        out += [
            f"| `{s.key}` | {_cell(_default_cell(s))} | {_cell(_what_cell(s))} |"
            for s in SETTINGS
            if s.section == sec.name
        ]
    out += ["", "## Environment", "", "| variable | what |", "|---|---|"]
    out += [f"| `{name}` | {_cell(what)} |" for name, what in ENVIRONMENT]
    out += [
        "",
        "## Example",
        "",
        "An example, not the defaults: a node that drains to S3, keeps its cache on NVMe and "
        "prunes one run's checkpoints.",
        "",
        "```toml",
        example().rstrip("\n"),
        "```",
    ]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(reference(), end="")

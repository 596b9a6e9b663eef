"""What ``ckptgw doctor`` checks of the store, through the gateway's own store layer
(:func:`ckptgw.store.open.open_store`, the bare store: no retries), so that it tests what a mount
will use: the credentials, the endpoint, the bucket, a PUT/GET/DELETE round trip and a
multipart upload under the prefix, the bucket's lifecycle rules and the clock (S3); for a
``file://`` store the directory, the same round trip, and whether it survives this node.

Every call is made once and given :data:`STEP_TIMEOUT` seconds. What doctor writes it removes:
the test object (``<prefix>.ckptgw-doctor/<host>-<pid>-<random>``) is deleted and looked for
again, the multipart upload aborted; a line says so when that fails."""

from __future__ import annotations

import contextvars
import dataclasses
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import trio

from ckptgw.gateway.config import Config
from ckptgw.gateway.doctor.hostcheck import FAIL, INFO, OK, WARN, Check
from ckptgw.gateway.storecheck import SYNC_CLOCK, explain, what_to_fix
from ckptgw.gateway.storeplace import (
    endpoint_on_this_node,
    local_store,
    local_store_problem,
    local_store_warning,
)
from ckptgw.store.deadlines import Deadlines
from ckptgw.store.interface import Store, StoreError
from ckptgw.store.open import open_store

STEP_TIMEOUT = 5.0  # seconds for each store call
SKEW_WARN = 60.0  # seconds between our clock and the store's: a warning beyond
SKEW_FAIL = 15 * 60.0  # S3 refuses requests signed further off (RequestTimeTooSkewed)
_UNREACHABLE = ("Transport", "Timeout")
T = TypeVar("T")


def store_checks(cfg: Config) -> list[Check]:
    """The store's checks, from this process (``ckptgw doctor`` before any mount)."""
    return trio.run(probe_store, cfg)


async def probe_store(cfg: Config) -> list[Check]:
    """The store's checks in a trio loop that runs already (a running daemon's: its
    credentials, its endpoint, its store)."""
    if cfg.store.scheme == "s3":
        creds = await trio.to_thread.run_sync(credentials_check)  # may ask instance metadata
        if creds.status == FAIL:
            return [creds]
        return [creds, *await _probe(cfg), place_check(cfg)]
    place = place_check(cfg)  # first: a store doctor would refuse is not created
    if place.status == FAIL:
        return [place]
    return [*await _probe(cfg), place]


def credentials_check() -> Check:
    """Where boto's chain finds credentials (its name for the source, never a value)."""
    import botocore.exceptions
    import botocore.session

    try:
        creds = botocore.session.get_session().get_credentials()
    except botocore.exceptions.BotoCoreError as e:  # e.g. a profile that does not exist
        return Check("credentials", FAIL, f"AWS credentials: {e}")
    if creds is None:
        return Check(
            "credentials",
            FAIL,
            "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
            "AWS_PROFILE, or give the machine an instance role",
        )
    profile = os.environ.get("AWS_PROFILE")
    source = f"{creds.method}, profile {profile}" if profile else creds.method
    return Check("credentials", OK, f"AWS credentials found ({source})")


def place_check(cfg: Config) -> Check:
    """A store on this node's own disk is lost with the node: the mount refuses it unless
    allowed, and even then it is a warning. An S3 endpoint on loopback is a warning."""
    if cfg.store.scheme == "s3":
        if endpoint_on_this_node(cfg.endpoint_url):
            return Check(
                "store-place",
                WARN,
                f"store endpoint {cfg.endpoint_url} is on this node: if that server keeps its "
                "data here (MinIO on this node, not a proxy to storage elsewhere), checkpoints "
                "are lost with the node",
            )
        return Check("store-place", OK, f"store {cfg.store} is not on this node's disks")
    if local_store(cfg.store) is None:
        return Check("store-place", OK, f"store {cfg.store} is on a shared filesystem")
    if cfg.allow_local_store:
        return Check("store-place", WARN, local_store_warning(cfg.store))
    return Check("store-place", FAIL, local_store_problem(cfg.store, cfg.cache_dir))


def clock_check(server: float | None, local: float) -> Check:
    """Our clock against the store's (its Date header), both in seconds since the epoch."""
    if server is None:
        return Check("clock", INFO, "the store sends no Date header: clocks not compared")
    skew = local - server
    how = f"{abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} the store's"
    if abs(skew) > SKEW_FAIL:
        return Check(
            "clock",
            FAIL,
            f"this machine's clock is {how}: S3 refuses requests signed more than 15 minutes "
            f"off: {SYNC_CLOCK}",
        )
    if abs(skew) > SKEW_WARN:
        return Check(
            "clock",
            WARN,
            f"this machine's clock is {how}: {SYNC_CLOCK}; at 15 minutes S3 refuses every request",
        )
    within = max(1, round(abs(skew)))  # the Date header counts whole seconds
    return Check("clock", OK, f"clock agrees with the store's (within {within} s)")


async def _step(what: str, call: Callable[[], Awaitable[T]]) -> T:
    """One store call, once, for at most STEP_TIMEOUT seconds."""
    with trio.move_on_after(STEP_TIMEOUT):
        return await call()
    raise StoreError(f"{what}: no answer in {STEP_TIMEOUT:g} s", temporary=True, code="Timeout")


def _deadlines(cfg: Config) -> Deadlines:
    """The mount's deadlines, none beyond a step's time: a store that does not answer in
    time is said so by the step that waited, not cut off by trio's timeout unexplained."""
    d = cfg.deadlines
    short = STEP_TIMEOUT - 1.0
    return dataclasses.replace(
        d,
        first_byte_timeout=min(d.first_byte_timeout, short),
        stall_timeout=min(d.stall_timeout, short),
    )


def _failure(cfg: Config, e: StoreError) -> str:
    return explain(e, cfg.store, cfg.endpoint_url)[0]


# One name per probe: two doctors at once (against one daemon, or on hosts and pids that
# coincide) never touch each other's test objects.
_PROBE: contextvars.ContextVar[str] = contextvars.ContextVar("probe", default="")


def _key(cfg: Config, suffix: str = "") -> str:
    me = f"{socket.gethostname()}-{os.getpid()}-{_PROBE.get()}"
    return f"{cfg.store.key_prefix}.ckptgw-doctor/{me}{suffix}"


async def _probe(cfg: Config) -> list[Check]:
    _PROBE.set(secrets.token_hex(4))
    out: list[Check] = []
    try:
        async with open_store(cfg.store, cfg.endpoint_url, deadlines=_deadlines(cfg)) as store:
            if not await _reach(store, cfg, out):
                return out
            await _round_trip(store, cfg, out)
            await _multipart(store, cfg, out)
            if cfg.store.scheme == "s3":
                await _lifecycle(store, cfg, out)
                out.append(await _clock(store))
    except StoreError as e:  # e.g. the client could not be made
        out.append(Check("store", FAIL, _failure(cfg, e)))
    return out


async def _reach(store: Store, cfg: Config, out: list[Check]) -> bool:
    """The store answers and we may use it: the file store's directory, or S3's endpoint
    and bucket (two lines). False when nothing more can be checked."""
    url = cfg.store
    if url.scheme == "file":
        made = not Path(url.prefix).exists()
        try:
            await _step(f"checking store {url.prefix}", store.check)
        except StoreError as e:
            out.append(Check("store-dir", FAIL, _failure(cfg, e)))
            return False
        now = "made now" if made else "exists"
        out.append(Check("store-dir", OK, f"store {url}: the directory {now} and is writable"))
        return True
    endpoint = cfg.endpoint_url or "AWS S3"
    try:
        await _step(f"checking bucket {url.bucket}", store.check)
    except StoreError as e:
        if e.code in _UNREACHABLE:
            fix = what_to_fix(e, url, cfg.endpoint_url) or "check that it is up and the URL right"
            out.append(
                Check("endpoint", FAIL, f"store {url}: {endpoint} does not answer: {e}: {fix}")
            )
            return False
        out.append(Check("endpoint", OK, f"store endpoint {endpoint} answers"))
        if e.code == "403":  # a HEAD has no body: a GET says which 403 it is
            e = await _why_forbidden(store, cfg) or e
        out.append(Check("bucket", FAIL, _failure(cfg, e)))
        return False
    out.append(Check("endpoint", OK, f"store endpoint {endpoint} answers"))
    out.append(Check("bucket", OK, f"bucket {url.bucket} exists and lets us in"))
    return True


async def _why_forbidden(store: Store, cfg: Config) -> StoreError | None:
    """The error code behind a bare 403 (AccessDenied, InvalidAccessKeyId,
    SignatureDoesNotMatch, RequestTimeTooSkewed ...), from a GET of a key that is not there."""
    try:
        await _step("GET", lambda: store.get(_key(cfg)))
    except StoreError as e:
        if e.code not in ("403", "NoSuchKey", *_UNREACHABLE):
            what = f"checking bucket {cfg.store.bucket}: {e.code}"
            return StoreError(what, temporary=e.temporary, code=e.code)
    return None


async def _round_trip(store: Store, cfg: Config, out: list[Check]) -> None:
    """PUT, GET and DELETE of a small object under the prefix; one line for the three."""
    key = _key(cfg)
    data = b"ckptgw doctor " + os.urandom(16).hex().encode()
    problem: str | None = None
    put = False
    try:
        await _step(f"PUT {key}", lambda: store.put(key, data, {}))
        put = True
        got = await _step(f"GET {key}", lambda: store.get(key))
        if got != data:
            problem = f"store {cfg.store}: GET {key} returned other bytes than were PUT"
    except StoreError as e:
        problem = _failure(cfg, e)
        if not put and not e.temporary:  # refused: nothing was written
            out.append(Check("round-trip", FAIL, problem))
            return
    left = await _remove(store, cfg, key)
    problem = problem or left
    if problem is not None:
        out.append(Check("round-trip", FAIL, problem))
    else:
        out.append(Check("round-trip", OK, f"store {cfg.store}: PUT, GET and DELETE of {key}"))


async def _remove(store: Store, cfg: Config, key: str) -> str | None:
    """Delete the test object and make sure it is gone (also when cancelled); what is wrong
    otherwise, in one line."""
    by_hand = f"delete {key} by hand"
    with trio.CancelScope(shield=True):
        try:
            await _step(f"DELETE {key}", lambda: store.delete(key))
            if await _step(f"HEAD {key}", lambda: store.head(key)) is None:
                return None
        except StoreError as e:
            return f"{_failure(cfg, e)}; {by_hand}"
    return f"store {cfg.store}: {key} is still there after its DELETE: {by_hand}"


async def _multipart(store: Store, cfg: Config, out: list[Check]) -> None:
    """The drain uploads files above drain.multipart_threshold in parts: create and abort."""
    key = _key(cfg, "-multipart")
    try:
        upload = await _step(f"CREATE-MULTIPART {key}", lambda: store.create_multipart(key, {}))
    except StoreError as e:
        out.append(Check("multipart", FAIL, _failure(cfg, e)))
        return
    with trio.CancelScope(shield=True):
        try:
            await _step(f"ABORT {key}", lambda: store.abort_multipart(key, upload))
        except StoreError as e:
            out.append(
                Check("multipart", FAIL, f"{_failure(cfg, e)}; upload {upload} of {key} is left")
            )
            return
    out.append(Check("multipart", OK, f"store {cfg.store}: multipart upload (create, abort)"))


async def _lifecycle(store: Store, cfg: Config, out: list[Check]) -> None:
    """Read by ``ckptgw lifecycle rules`` (a mount does not need them: a warning at worst)."""
    try:
        rules = await _step("GET lifecycle", store.get_lifecycle)
    except StoreError as e:
        out.append(
            Check(
                "lifecycle",
                WARN,
                f"store {cfg.store}: {e}: `ckptgw lifecycle rules` needs "
                "s3:GetLifecycleConfiguration (mounts do not)",
            )
        )
        return
    n = f"{len(rules)} rule{'s' if len(rules) != 1 else ''}" if rules else "none set"
    if not any("AbortIncompleteMultipartUpload" in r for r in rules):
        n += "; none aborts stale multipart uploads (ckptgw lifecycle rules --apply adds one)"
    out.append(Check("lifecycle", OK, f"bucket {cfg.store.bucket}: lifecycle rules readable: {n}"))


async def _clock(store: Store) -> Check:
    from ckptgw.store.s3 import S3Store

    if not isinstance(store, S3Store):
        return clock_check(None, time.time())
    before = time.time()
    try:
        server = await _step("reading the store's clock", store.server_date)
    except StoreError as e:
        return Check("clock", WARN, f"the store's clock could not be read: {e}")
    if server is not None:
        server += 0.5  # the Date header is in whole seconds, cut off
    return clock_check(server, (before + time.time()) / 2)

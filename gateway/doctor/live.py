"""``ckptgw doctor MOUNTPOINT`` on a running gateway: check that mount, as its daemon has it.

The daemon is asked over its control socket what it runs with (``config``: the store, the
endpoint, the cache dir), so nothing is taken from this shell's flags or defaults. Then:
this machine's checks on that cache dir (:func:`gateway.doctor.hostcheck.cache_checks`); the store's
checks, made by the daemon itself (``probe_store``: its credentials and endpoint, which this
shell may not have); and what the daemon's status says is wrong now (stalled requests,
store errors, lookups waiting on the store, data only local for long, writes refused for
room). The first line says which gateway is checked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ckptgw.gateway.client import Mount
from ckptgw.gateway.config import Config
from ckptgw.gateway.doctor.hostcheck import FAIL, INFO, OK, WARN, Check, cache_checks
from ckptgw.gateway.errors import UserError
from ckptgw.gateway.render import age, files, size, stalled_text

PROBE_ANSWER = 120.0  # seconds the daemon may take for the store's checks (each step: 5 s)
RECENT_ERROR = 300.0  # a store error this recent is shown as a warning, an older one not
OLD_DIRTY = 600.0  # data only on this node for longer than this is a warning


def checks(mount: Mount) -> Iterator[Check]:
    """Every check of the running gateway, in order, as each is done. A daemon older than
    this doctor (no ``config``) is said so, and its status is still looked at."""
    try:
        cfg = Config.from_running_view(mount.request("config"))
    except UserError as e:
        yield Check("gateway", FAIL, f"the gateway at {mount.mountpoint}: {_old(e)}")
        if not _older(e):
            return
        cfg = None  # an older daemon: what its status says is still worth telling
    if cfg is not None:
        endpoint = f", endpoint {cfg.endpoint_url}" if cfg.endpoint_url else ""
        yield Check(
            "gateway",
            INFO,
            f"checking the running gateway at {cfg.mountpoint} (pid {mount.entry.pid}): store "
            f"{cfg.store}{endpoint}, cache dir {cfg.cache_dir}, log {cfg.log_path}",
        )
        yield from cache_checks(cfg)
        try:
            probed = mount.request("probe_store", answer_within=PROBE_ANSWER)["checks"]
        except UserError as e:
            yield Check("store", FAIL, f"the gateway at {mount.mountpoint}: {_old(e)}")
        else:
            yield from (Check(**c) for c in probed)
    try:
        status = mount.request("status")
    except UserError as e:
        yield Check("status", FAIL, str(e))
        return
    yield from status_checks(status, time.time())


def _older(e: UserError) -> bool:
    """The daemon does not know the request: an older ckptgw than this doctor."""
    return "unknown operation" in str(e)


def _old(e: UserError) -> str:
    if _older(e):
        return (
            f"{e}: it runs an older ckptgw than this one; restart it (ckptgw umount, then "
            "mount) to check it with this doctor"
        )
    return str(e)


def status_checks(st: dict[str, Any], now: float) -> Iterator[Check]:
    """What a running gateway's status says is wrong now; one OK line when nothing is."""
    found = False
    if st.get("mode", "serving") != "serving":
        found = True
        yield Check(
            "gateway",
            WARN,
            f"the gateway is not serving as usual: {st['mode']}"
            + (f" ({st['mode_reason']})" if st.get("mode_reason") else ""),
        )
    path = st["data_path"]
    if path["mode"] != "passthrough" and path.get("reason"):
        yield Check("data-path", INFO, f"every byte goes through the daemon: {path['reason']}")
    req = st.get("store_requests")
    if req is not None:
        if req["stalled"]:
            found = True
            worst = max(
                (r for r in req["requests"] if r["stalled"]),
                key=lambda r: r["idle"],
                default=None,
            )
            which = f"; longest: {stalled_text(worst)}" if worst is not None else ""
            yield Check(
                "requests",
                WARN,
                f"{req['stalled']} of {req['in_flight']} requests to {req['endpoint']} are "
                f"stalled (cancelled and retried at {age(req['deadlines']['stall'])} while "
                f"bytes move, {age(req['deadlines']['first_byte'])} waiting for an answer)"
                f"{which}",
            )
        if not req["expect_continue"]:
            yield Check(
                "requests",
                INFO,
                f"{req['endpoint']} does not answer Expect: 100-continue, so requests go "
                f"without it ({req['no_continue']})",
            )
    if st.get("last_error") and now - (st.get("last_error_at") or 0) < RECENT_ERROR:
        found = True
        yield Check(
            "store-errors",
            WARN,
            f"the store answered with an error {age(now - st['last_error_at'])} ago: "
            f"{st['last_error']} (retried: ckptgw status shows the counts)",
        )
    lookups = st.get("lookups")
    if lookups and lookups.get("stalled_since") is not None:
        found = True
        yield Check(
            "lookups",
            WARN,
            f"lookups wait on the store past {age(lookups['wait'])} and are answered from "
            f"this node's journal ({lookups['stalled_on']})",
        )
    queue = st["queue"]
    oldest = queue.get("oldest_dirty_age")
    if oldest is not None and oldest > OLD_DIRTY:
        found = True
        yield Check(
            "drain",
            WARN,
            f"{files(queue['files'])} ({size(queue['bytes'])}) only on this node, the oldest "
            f"for {age(oldest)}: ckptgw status {st['mountpoint']} shows why",
        )
    if queue.get("lost_wakeups"):
        found = True
        yield Check(
            "drain",
            FAIL,
            f"the drain found {queue['lost_wakeups']} changed files it had not queued (a bug: "
            "they were queued then; please report it with the log)",
        )
    if st["cache"].get("enospc"):
        found = True
        yield Check(
            "cache-space",
            WARN,
            f"{st['cache']['enospc']} writes got ENOSPC (the cache was full of data not yet in "
            "the store): give the cache more room (cache.size) or the drain more time "
            "(cache.write_wait)",
        )
    if not found:
        yield Check(
            "drain",
            OK,
            f"the drain is healthy: {files(queue['files'])} ({size(queue['bytes'])}) queued, "
            "no request stalled, no recent store error",
        )

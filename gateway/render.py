"""Status for people: one screen per mount, readable at a glance; colour on terminals only
(and never with ``NO_COLOR`` set)."""

from __future__ import annotations

import os
import time
from typing import Any, TextIO

_COLOURS = {
    "durable": "32",
    "durable (local store)": "33",
    "draining": "33",
    "local-only": "31",
    "local": "31",
    "bold": "1",
    "keep": "32",
    "transition": "36",
    "delete": "31",
}
MAX_CHECKPOINTS = 12


def use_colour(stream: TextIO) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def plural(n: int, one: str, many: str | None = None) -> str:
    """ "1 file", "2 files"; ``many`` where adding "s" is wrong ("directories")."""
    return f"{n} {one}" if n == 1 else f"{n} {many or one + 's'}"


def files(n: int) -> str:
    return plural(n, "file")


def entries(pending: dict[str, Any]) -> str:
    """A ``pending`` answer's count: "2 files", "1 file and 1 directory"."""
    dirs = int(pending.get("directories", 0))
    rest = int(pending["count"]) - dirs
    parts = [files(rest)] if rest or not dirs else []
    if dirs:
        parts.append(plural(dirs, "directory", "directories"))
    return " and ".join(parts)


def rate(n: float | None) -> str:
    return "-" if n is None else f"{size(n)}/s"


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h"
    return f"{s // 86400} d"


class Painter:
    def __init__(self, colour: bool) -> None:
        self.colour = colour

    def __call__(self, text: str, what: str) -> str:
        code = _COLOURS.get(what)
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour and code else text


def _table(
    rows: list[list[str]], paint: Painter, states: list[str] | None = None, column: int = 2
) -> list[str]:
    """Aligned columns, a bold header, and ``column`` painted by each row's state."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        if n == 0:
            cells = [paint(c, "bold") for c in cells]
        elif states is not None:
            cells[column] = paint(cells[column], states[n - 1])
        out.append("  ".join(cells).rstrip())
    return out


def status_text(st: dict[str, Any], colour: bool = False) -> str:
    paint = Painter(colour)
    now = time.time()
    cache, queue = st["cache"], st["queue"]
    lines = [
        paint(f"{st['mountpoint']}  ->  {st['store']}", "bold")
        + f"   (pid {st['pid']}, up {age(st['uptime'])})",
    ]
    if st.get("store_local"):
        lines.append(paint(f"  {LOCAL_STORE_NOTE.format(store=st['store'])}", "draining"))
    if st["mode"] != "serving":
        left = f", stops in {age(st['deadline'] - now)}" if st.get("deadline") else ""
        lines.append(paint(f"  {st['mode'].upper()}: {st['mode_reason']}{left}", "draining"))
    path = st["data_path"]
    lines.append(
        "  data path passthrough (the kernel reads and writes the cache)"
        if path["mode"] == "passthrough"
        else f"  data path daemon ({path['reason']})"
    )
    limit = f" of {size(cache['limit'])}" if cache["limit"] is not None else ""
    lines.append(
        f"  cache     {size(cache['used'])} used{limit}, {size(cache['free'])} free"
        f"   evictions {cache['evictions']}, writes that waited {cache['write_waits']}"
    )
    lines.append(
        f"  files     cache dir {cache.get('dir', '-')}"
        + (f", log {st['log']}" if st.get("log") else "")
    )
    # dirty: bytes whose content the store lacks, each file once (the checkpoints' NOT
    # DURABLE bytes add up to it); files the store holds under an old name are "moves".
    dirty = f"{size(st['dirty_bytes'])} not in the store"
    lines.append(
        f"  dirty     {paint(dirty, 'local') if st['dirty_bytes'] else dirty}"
        f"   queue {files(queue['files'])}, {size(queue['bytes'])},"
        f" oldest {age(queue['oldest_dirty_age'])}"
        + (f", {queue['open_for_writing']} open for writing" if queue["open_for_writing"] else "")
    )
    if queue.get("replacing"):
        n = queue["replacing"]
        lines.append(
            f"  replacing {files(n)} ({size(queue['replacing_bytes'])}): the store keeps"
            f" {'its' if n == 1 else 'their'} previous version until the new one is there"
        )
    if queue.get("store_ops"):
        moves = queue.get("moves", 0)
        lines.append(
            f"  store ops {queue['store_ops']} pending (moves, deletes, metadata updates)"
            + (
                f"; {files(moves)} ({size(queue.get('moving_bytes', 0))}) in the store,"
                f" to be moved to {'its' if moves == 1 else 'their'} current name"
                if moves
                else ""
            )
        )
    lines += [_upload(u) for u in st["uploads"]]
    lines.append(
        f"  store     {size(st['drained']['bytes'])} drained, {size(st['fetched']['bytes'])} read"
        f"   {retries_text(st, now)}"
    )
    if st["last_error"]:
        lines.append(f"  last error: {st['last_error']}")
    lookups = st.get("lookups")
    if lookups and lookups["stalled_since"] is not None:
        lines.append(
            paint(
                f"  lookups   the store is slow: answered from this node's journal after"
                f" {age(lookups['wait'])} ({lookups['stalled_on']})",
                "local",
            )
        )
    if st.get("store_requests"):
        lines += store_request_lines(st["store_requests"], paint)
    if st.get("part_workers"):
        lines.append(part_workers_line(st["part_workers"], paint))
    lines += [warmup_line(w, paint) for w in st.get("warmups", []) if w["phase"] != "done"]
    if st.get("nfs"):
        lines.append(nfs_line(st["nfs"], paint))
    notice = st.get("preemption", {}).get("notice")
    if notice:
        lines.append(paint(f"  preemption notice: {notice}", "local"))
    lines += checkpoint_lines(st, paint, now)
    return "\n".join(lines)


def store_request_lines(view: dict[str, Any], paint: Painter) -> list[str]:
    """The endpoint, when something is wrong with it: each stalled request (what, for which
    file, doing what, for how long), and Expect: 100-continue turned off."""
    lines = []
    if view["stalled"]:
        lines.append(
            paint(
                f"  endpoint  {view['endpoint']}: {view['stalled']} of "
                f"{plural(view['in_flight'], 'request')} in flight stalled (no progress for "
                f"{age(view['deadlines']['warning'])} or more; cancelled and retried at "
                f"{age(view['deadlines']['stall'])} while bytes move, "
                f"{age(view['deadlines']['first_byte'])} waiting for an answer)",
                "local",
            )
        )
    for r in view["requests"]:
        if r["stalled"]:
            lines.append(paint(f"  STALLED   {stalled_text(r)}", "local"))
    if not view["expect_continue"]:
        lines.append(
            f"  endpoint  {view['endpoint']}: Expect: 100-continue off ({view['no_continue']})"
        )
    if view.get("pacing"):
        lines += pacing_lines(view["pacing"], paint)
    return lines


def pacing_lines(pacing: dict[str, Any], paint: Painter) -> list[str]:
    """The pace of reads and of writes, once the store has refused some as too many:
    "  pacing    writes 6.2/s (the store refused 14 in the last minute; 12 waiting)"."""
    lines = []
    for kind in ("writes", "reads"):
        p = pacing[kind]
        if p["rate"] is None and not p["refused_per_minute"]:
            continue
        rate = "not limited" if p["rate"] is None else f"{p['rate']:g}/s"
        said = [f"the store refused {p['refused_per_minute']} in the last minute"]
        if p["waiting"]:
            said.append(f"{p['waiting']} waiting")
        text = f"  pacing    {kind} {rate} ({'; '.join(said)})"
        lines.append(paint(text, "draining") if p["refused_per_minute"] else text)
    return lines


def stalled_text(r: dict[str, Any]) -> str:
    """ "PART 3 of run/latest.pt (/mnt/ckpt/run/latest.pt): no progress for 12 s (sending,
    3.0 MiB of 16.0 MiB sent)"."""
    path = f" ({r['path']})" if r.get("path") else ""
    if r["phase"] == "sending":
        moved = f", {size(r['sent'])} of {size(r['size'])} sent"
    elif r["phase"] == "receiving":
        moved = f", {size(r['received'])} received"
    else:
        moved = ""
    return f"{r['what']}{path}: no progress for {age(r['idle'])} ({r['phase']}{moved})"


def warmup_line(w: dict[str, Any], paint: Painter) -> str:
    """A warm-up in progress (or its outcome, for ``ckptgw warmup --wait``)."""
    what = "prefetch" if w["origin"] == "open" else "warmup"
    line = (
        f"  {what:9} /{w['path']}: {w['phase']}, {w['fetched_files']}/{w['files']} files, "
        f"{size(w['fetched_bytes'])} of {size(w['bytes'])}"
    )
    if w["cached_files"]:
        line += f"; {files(w['cached_files'])} cached already"
    if w["skipped_files"]:
        line += paint(
            f"; {files(w['skipped_files'])} ({size(w['skipped_bytes'])}) did not fit", "draining"
        )
    if w["failed_files"]:
        line += paint(f"; {files(w['failed_files'])} could not be read", "local")
    if w.get("held_files"):
        line += paint(
            f"; {files(w['held_files'])} left to be fetched when read (the store refuses reads "
            "as too many)",
            "draining",
        )
    if w["error"]:
        line += paint(f"; failed: {w['error']}", "local")
    return line


def part_workers_line(pool: dict[str, Any], paint: Painter) -> str:
    """ "part workers 4 of 4 running, 1 replaced, 812 parts sent"."""
    if not pool["in_use"]:
        return paint(
            "  part workers failed to start: the daemon sends the parts (see the log)", "local"
        )
    replaced = f", {pool['replaced']} replaced" if pool["replaced"] else ""
    return (
        f"  part workers {pool['running']} of {pool['configured']} running{replaced}, "
        f"{plural(pool['parts'], 'part')} sent"
    )


def nfs_line(nfs: dict[str, Any], paint: Painter) -> str:
    """The mount's NFS export: what is served to whom, or why it is not served now."""
    versions = "/".join(f"NFSv{v}" for v in nfs["protocols"])
    squash = "root squashed" if nfs["root_squash"] else "root NOT squashed"
    what = f"{nfs['export']} on {nfs['listen']} ({versions}) to {', '.join(nfs['clients'])}"
    connected = nfs["connected"]
    line = f"  nfs       {what}, {squash}; " + (
        f"{len(connected)} connected: {', '.join(connected)}" if connected else "no client"
    )
    if nfs["restarts"]:
        line += f"; NFS-Ganesha restarted {nfs['restarts']}x"
    if nfs["state"] != "serving":
        line += "\n" + paint(
            f"  nfs       {nfs['state'].upper()}: {nfs.get('reason') or ''}", "draining"
        )
    return line


LOCAL_STORE_NOTE = (
    "local store: {store} is on this node's own disk; what is in it is durable (local store)"
    " only, and is lost with the node"
)
_WHERE = {"local": "this node", "store": "store", "both": "both"}


def state_text(state: str, store_local: bool) -> str:
    """A state for people: data in a store on this node is never plain "durable"."""
    return f"{state} (local store)" if store_local and state == "durable" else state


def checkpoint_lines(st: dict[str, Any], paint: Painter, now: float) -> list[str]:
    """The pins, the store's listing, and the checkpoints table (this node's and the
    store's, newest first), with where each is and whether it is complete."""
    lines = []
    mp = st["mountpoint"].rstrip("/") + "/"
    pins = st.get("pins")
    if pins and pins["items"]:
        names = [p["path"].removeprefix(mp) for p in pins["items"]]
        shown = ", ".join(names[:5]) + (f", ... ({len(names) - 5} more)" if len(names) > 5 else "")
        lines.append(f"  pins      {len(names)}: {shown}")
    listing = st.get("store_listing")
    if listing:
        at = listing["listed_at"]
        # What the store holds: the listing's checkpoints and those this node drained since.
        stored = sum(c.get("where") in ("store", "both") for c in st["checkpoints"])
        what = plural(stored + listing["omitted"], "checkpoint")
        if at is None:
            what += " (the store not listed yet)"
        else:
            scope = f" of the first {listing['keys']} keys" if listing["truncated"] else ""
            what += f" (the store listed{scope} {age(max(0.0, now - at))} ago)"
        if listing["error"]:
            what += f"; the last listing failed: {listing['error']}"
        lines.append(f"  in store  {what}")
    cps = st["checkpoints"]
    if not cps:
        lines.append("  no files yet")
        return lines
    rows = [
        ["CHECKPOINT", "STEP", "STATE", "WHERE", "FILES", "SIZE", "NOT DURABLE", "AGE", "COMPLETE"]
    ]
    states = []
    for c in cps[:MAX_CHECKPOINTS]:
        name = c["path"] if c["step"] is not None else c["path"].rstrip("/") + "/*"
        states.append(state_text(c["state"], bool(st.get("store_local"))))
        rows.append(
            [
                name + (" (pinned)" if c.get("pinned") else ""),
                "-" if c["step"] is None else str(c["step"]),
                states[-1],
                _WHERE.get(c.get("where", "local"), "-"),
                str(c["files"]),
                size(c["bytes"]),
                _not_durable(c),
                age(now - c["mtime"]),
                _complete(c),
            ]
        )
    lines.append("")
    lines += ["  " + r for r in _table(rows, paint, states)]
    if len(cps) > MAX_CHECKPOINTS:
        lines.append(f"  ... and {len(cps) - MAX_CHECKPOINTS} older (--json lists all)")
    if any(_complete(c) == UNKNOWN for c in cps[:MAX_CHECKPOINTS]):
        lines.append(UNKNOWN_NOTE)
    if listing and listing["omitted"]:
        lines.append(
            f"  ... and {listing['omitted']} older only in the store (the newest"
            f" {listing['per_directory']} of each directory are listed)"
        )
    return lines


def _complete(c: dict[str, Any]) -> str:
    """A checkpoint's COMPLETE cell. Outside every retention run nothing says whether all its
    files were written: for one only in the store (a node may have died part-way through its
    drain) that is "unknown", said out loud, never left blank."""
    if c.get("complete") is None:
        return UNKNOWN if c.get("where") == "store" else "-"
    return "yes" if c["complete"] else f"no: {c['waiting']}"


UNKNOWN = "unknown"
UNKNOWN_NOTE = (
    "  COMPLETE unknown: no [[retention]] run covers it, so nothing says whether all its files "
    "were written (set\n  retention.marker, e.g. .metadata for DCP, or quiet)"
)


def _not_durable(c: dict[str, Any]) -> str:
    """A checkpoint's NOT DURABLE cell: bytes the store lacks, and files waiting for a move
    (their bytes are in the store: not counted again)."""
    parts = []
    if c["local_bytes"]:  # only on this node, and for how long (the exposure window)
        held = c.get("local_age")
        parts.append(size(c["local_bytes"]) + (f" for {age(held)}" if held is not None else ""))
    if c.get("moves"):
        parts.append(f"{plural(c['moves'], 'move')} pending")
    return ", ".join(parts) or "-"


def _upload(u: dict[str, Any]) -> str:
    """One upload: its current path, how far, how fast, how long still."""
    pct = 100 * u["sent"] / u["size"] if u["size"] else 100.0
    line = f"  upload    {u['path']}  {pct:3.0f}%  {size(u['sent'])} of {size(u['size'])}"
    phase = u.get("phase", "sending")
    if phase == "checksum":
        line += "  checksumming"
    elif phase == "completing":
        line += "  completing"
    else:
        line += f"  {rate(u['throughput'] or None)}"
        if u.get("eta") is not None:
            line += f"  ETA {age(u['eta'])}"
    if u.get("sent_as"):
        line += f"  (sent under its old name {u['sent_as']}, then moved)"
    return line


def retries_text(st: dict[str, Any], now: float) -> str:
    """Store calls that failed, by kind, and how many of them were tried again:
    "retries 13; errors: 16 transport (last 3 s ago)". Errors count every failed call; those
    not retried were permanent or ran out of attempts."""
    kinds = sorted(st["errors"].items(), key=lambda kv: (-kv[1], kv[0]))
    if not kinds:
        return f"retries {st['retries']}; no errors"
    named = ", ".join(f"{n} {_KINDS.get(k, k)}" for k, n in kinds)
    when = f" (last {age(now - st['last_error_at'])} ago)" if st.get("last_error_at") else ""
    return f"retries {st['retries']}; errors: {named}{when}"


# Error kinds of our own making, in words; S3's error codes (SlowDown, ...) stay as they are.
_KINDS = {
    "Transport": "transport",
    "Cancelled": "cancelled",
    "NoCredentials": "no credentials",
    "Stalled": "stalled",
    "Timeout": "no answer",
}


def plan_text(
    plan: list[dict[str, Any]], mountpoint: object, colour: bool = False, store_local: bool = False
) -> str:
    """A retention plan as a table: one line per checkpoint, newest first, with the reason.
    With a store on this node (``store_local``) a first line says so: what the plan calls "in
    the store" is durable (local store) only."""
    note = [LOCAL_STORE_NOTE.format(store="the store")] if store_local else []
    if not plan:
        return "\n".join([*note, "no checkpoints under any run with a retention policy"])
    paint = Painter(colour)
    rows = [["RUN", "CHECKPOINT", "ACTION", "STEP", "FILES", "SIZE", "REASON"]]
    for p in plan:
        rows.append(
            [
                p["run"],
                p["path"],
                p["action"],
                str(p["step"]),
                str(p["files"]),
                size(p["bytes"]),
                p["reason"],
            ]
        )
    return "\n".join(note + _table(rows, paint, [p["action"] for p in plan], column=2))

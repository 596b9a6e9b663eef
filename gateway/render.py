"""Status for people: one screen per mount, readable at a glance; colour on terminals only
(and never with ``NO_COLOR`` set)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

_COLOURS = {
    "durable": "32",
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
    dirty = f"{size(st['dirty_bytes'])} not in the store"
    lines.append(
        f"  dirty     {paint(dirty, 'local') if st['dirty_bytes'] else dirty}"
        f"   queue {queue['files']} files, {size(queue['bytes'])},"
        f" oldest {age(queue['oldest_dirty_age'])}"
        + (f", {queue['open_for_writing']} open for writing" if queue["open_for_writing"] else "")
        + (f", {queue['store_ops']} renames/deletes" if queue["store_ops"] else "")
    )
    for u in st["uploads"]:
        pct = 100 * u["sent"] / u["size"] if u["size"] else 100.0
        lines.append(
            f"  upload    {u['path']}  {pct:3.0f}%  {size(u['sent'])} of {size(u['size'])}"
            f"  {size(u['throughput'])}/s"
        )
    errors = ", ".join(f"{k} {v}" for k, v in sorted(st["errors"].items()))
    lines.append(
        f"  store     {size(st['drained']['bytes'])} drained, {size(st['fetched']['bytes'])} read"
        f"   retries {st['retries']}" + (f" ({errors})" if errors else "")
    )
    if st["last_error"]:
        when = f" ({age(now - st['last_error_at'])} ago)" if st["last_error_at"] else ""
        lines.append(f"  last error{when}: {st['last_error']}")
    notice = st.get("preemption", {}).get("notice")
    if notice:
        lines.append(paint(f"  preemption notice: {notice}", "local"))
    cps = st["checkpoints"]
    if cps:
        rows = [["CHECKPOINT", "STEP", "STATE", "FILES", "SIZE", "NOT DURABLE", "AGE"]]
        for c in cps[:MAX_CHECKPOINTS]:
            rows.append(
                [
                    c["path"] if c["step"] is not None else c["path"].rstrip("/") + "/*",
                    "-" if c["step"] is None else str(c["step"]),
                    c["state"],
                    str(c["files"]),
                    size(c["bytes"]),
                    size(c["local_bytes"]) if c["local_bytes"] else "-",
                    age(now - c["mtime"]),
                ]
            )
        lines.append("")
        lines += ["  " + r for r in _table(rows, paint, [c["state"] for c in cps])]
        if len(cps) > MAX_CHECKPOINTS:
            lines.append(f"  ... and {len(cps) - MAX_CHECKPOINTS} older (--json lists all)")
    else:
        lines.append("  no files yet")
    return "\n".join(lines)


def plan_text(plan: list[dict[str, Any]], mountpoint: object, colour: bool = False) -> str:
    """A retention plan as a table: one line per checkpoint, newest first, with the reason."""
    if not plan:
        return "no checkpoints under any run with a retention policy"
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
    return "\n".join(_table(rows, paint, [p["action"] for p in plan], column=2))


class ProgressBar:
    """``flush --wait`` progress on a terminal; silent otherwise."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.enabled = stream.isatty()
        self.total: int | None = None

    def __call__(self, pending: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self.total is None:
            self.total = max(1, pending["bytes"])
        done = max(0, self.total - pending["bytes"])
        frac = min(1.0, done / self.total)
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        self.stream.write(
            f"\r[{bar}] {100 * frac:3.0f}%  {size(done)} of {size(self.total)}"
            f"  {pending['count']} left   "
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.total is not None:
            self.stream.write("\n")
            self.stream.flush()

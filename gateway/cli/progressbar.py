"""The progress bar of ``flush --wait``, ``wait`` and ``umount``, and their summary line."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from ckptgw.gateway.render import age, entries, plural, rate, size, state_text


class ProgressBar:
    """Progress of ``flush --wait``, ``wait`` and ``umount``, fed each ``pending`` answer.

    Done is what the store has of everything seen pending: the parts each upload finished, a
    file waiting only for a move in full (a move sends nothing), a file that left the set in
    full. Each entry counts once, by inode, so a rename during the wait adds nothing. The rate
    is measured over the last ``WINDOW`` seconds of answers, the ETA is what is left at that
    rate; neither is shown before two answers a second apart. The bar is drawn on terminals
    only; :meth:`close` ends with a summary line on any stream once everything is durable."""

    WINDOW = 10.0  # seconds of samples behind the rate
    WIDTH = 30

    def __init__(
        self, stream: TextIO = sys.stderr, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stream = stream
        self.clock = clock
        self.enabled = stream.isatty()
        self.sizes: dict[object, int] = {}  # every entry seen pending: its latest size
        self.dirs: set[object] = set()
        self.samples: deque[tuple[float, int]] = deque()
        self.first: tuple[float, int] | None = None
        self.last: dict[str, Any] | None = None
        self._drawn = 0  # length of the line on screen

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    def done(self, pending: dict[str, Any]) -> int:
        left = int(pending["bytes"]) - int(pending.get("bytes_sent", 0))
        return max(0, self.total - left)

    def rate(self) -> float | None:
        """Bytes per second over the window; None until it spans a second."""
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return max(0.0, (d1 - d0) / (t1 - t0)) if t1 - t0 >= 1.0 else None

    def __call__(self, pending: dict[str, Any]) -> None:
        now = self.clock()
        for f in pending["files"]:
            ident = f.get("inode", f["path"])
            self.sizes[ident] = int(f["size"])
            if f.get("directory"):
                self.dirs.add(ident)
        done = self.done(pending)
        self.samples.append((now, done))
        while now - self.samples[0][0] > self.WINDOW and len(self.samples) > 2:
            self.samples.popleft()
        if self.first is None:
            self.first = (now, done)
        self.last = pending
        if self.enabled:
            self._draw(self.line(pending, done))

    def line(self, pending: dict[str, Any], done: int) -> str:
        total = max(self.total, 1)
        frac = min(1.0, done / total) if self.total else 1.0
        filled = int(self.WIDTH * frac)
        text = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {100 * frac:3.0f}%"
        text += f"  {size(done)} of {size(self.total)}"
        speed = self.rate()
        if done < self.total:
            text += f"  {rate(speed)}"
            if speed:
                text += f"  ETA {age((self.total - done) / speed)}"
        elif pending["count"]:  # every byte is there: a CompleteMultipartUpload or a move
            moves = int(pending.get("moves", 0))
            text += f"  {plural(moves, 'move')} pending" if moves else "  completing"
        if pending["count"]:
            text += f"  {entries(pending)} left"
        return text

    def _draw(self, text: str) -> None:
        self.stream.write("\r" + text.ljust(self._drawn))
        self.stream.flush()
        self._drawn = len(text)

    def summary(self) -> str | None:
        """ "1 file, 500.0 MiB durable in 12 s (41.7 MiB/s)" once nothing is pending; None
        while something is (the caller says what), or when nothing ever was."""
        if self.last is None or self.last["count"] or not self.sizes or self.first is None:
            return None
        t0, d0 = self.first
        elapsed = self.clock() - t0
        dirs = len(self.dirs)
        count = entries({"count": len(self.sizes), "directories": dirs})
        speed = f" ({rate((self.total - d0) / elapsed)})" if elapsed >= 1.0 and self.total else ""
        durable = state_text("durable", bool(self.last.get("store_local")))
        return f"{count}, {size(self.total)} {durable} in {age(elapsed)}{speed}"

    def close(self) -> None:
        line = self.summary()
        if self.enabled and self._drawn:
            if line is not None:  # the summary takes the bar's place
                self._draw("")
                self.stream.write("\r")
            else:  # the bar stays: the caller says what is left
                self.stream.write("\n")
        if line is not None:
            self.stream.write(f"ckptgw: {line}\n")
        self.stream.flush()

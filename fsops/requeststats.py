"""What the kernel asked of the mount: FUSE requests by kind, with the time spent answering
them (status, metrics, and the tests that count requests per file)."""

from __future__ import annotations

import os
import select
from collections import Counter, defaultdict


class RequestStats:
    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.in_flight = 0  # requests being answered now
        self._queue: select.poll | None = None  # the mount's /dev/fuse: requests not yet read

    def watch_queue(self) -> None:
        """Find the mount's /dev/fuse descriptor (pyfuse3 does not give it out), so that
        :meth:`alone` can see requests the kernel holds that no handler has read yet (pyfuse3
        reads the next one only when a handler awaits)."""
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == "/dev/fuse":
                    self._queue = select.poll()
                    self._queue.register(int(fd), select.POLLIN)
                    return
            except OSError:
                continue

    def alone(self) -> bool:
        """Whether the request calling this is the only one: none other being answered, and
        none waiting in the kernel's queue."""
        if self.in_flight != 1:
            return False
        waiting = self._queue.poll(0) if self._queue is not None else []
        return not any(events & select.POLLIN for _, events in waiting)

    def add(self, op: str, seconds: float) -> None:
        self.count[op] += 1
        self.seconds[op] += seconds

    def view(self) -> dict[str, dict[str, float]]:
        return {
            op: {"count": n, "seconds": round(self.seconds[op], 6)}
            for op, n in sorted(self.count.items())
        }

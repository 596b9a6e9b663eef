"""What the kernel asked of the mount: FUSE requests by kind, with the time spent answering
them (status, metrics, and the tests that count requests per file)."""

from __future__ import annotations

import logging
import os
import select
from collections import Counter, defaultdict

log = logging.getLogger(__name__)


class RequestStats:
    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.in_flight = 0  # requests being answered now
        self._queue: select.poll | None = None  # the mount's /dev/fuse: requests not yet read
        self.queue_fd = -1

    def watch_queue(self) -> None:
        """Find the mount's /dev/fuse descriptor (pyfuse3 does not give it out), so that
        :meth:`alone` can see requests the kernel holds that no handler has read yet (pyfuse3
        reads the next one only when a handler awaits). Called at INIT: the one connected
        /dev/fuse of this process is the session's (an unconnected one polls POLLERR)."""
        try:
            fds = os.listdir("/proc/self/fd")
        except OSError as e:
            log.warning("no view of the FUSE request queue (%s): fsyncs judge by count", e)
            return
        for name in fds:
            try:
                if os.readlink(f"/proc/self/fd/{name}") != "/dev/fuse":
                    continue
            except OSError:  # closed meanwhile
                continue
            queue = select.poll()
            queue.register(int(name), select.POLLIN)
            if any(ev & (select.POLLERR | select.POLLNVAL) for _, ev in queue.poll(0)):
                continue  # not connected to a mount
            self._queue, self.queue_fd = queue, int(name)
            log.info("watching the FUSE request queue (descriptor %d)", self.queue_fd)
            return
        log.warning("no connected /dev/fuse found: fsyncs judge by count alone")

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

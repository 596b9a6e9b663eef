"""Buffers for the parts of multipart uploads, reused from one part to the next.

A part read into a fresh 16 MiB ``bytes`` costs page faults for every page, and once freed
glibc keeps it in the arena of the thread that read it, so the daemon's peak memory grows
with the reading threads (measured: docs/benchmarks.md). Here a part is read into a buffer of
private anonymous memory (``mmap``, transparent huge pages asked for) taken from a free
list, and given back when its request has ended. Buffers in use are bounded by the parts in
flight; free ones by ``keep``, and they are let go (returned to the system at once: no arena
keeps ``mmap`` memory) once no buffer has been in use for :data:`IDLE` seconds, so an idle
daemon holds none, while a drain that pauses between parts or files does not fault its
buffers in again each time.

A buffer whose request may still be sending from it (the caller was cancelled or
interrupted, and the asyncio side may not have ended yet) is not given back but dropped
(:meth:`PartBuffers.lost`): reusing it could change bytes on their way. A dropped buffer's
memory lives on while any view of it does. Take and give run on one thread (the trio
thread, or a part worker's loop); the read into a taken buffer may run on any.
"""

from __future__ import annotations

import contextlib
import mmap

import trio

KEEP = 8  # free buffers kept, at most (the default max_parts)
IDLE = 5.0  # seconds without a buffer in use before the free ones are let go


class PartBuffers:
    def __init__(self, keep: int = KEEP, idle: float = IDLE) -> None:
        self.keep = keep
        self.idle = idle
        self._free: list[mmap.mmap] = []
        self.in_use = 0
        self.made = 0  # buffers made so far (reuse shows as fewer made than parts read)
        self._idle_since = 0.0  # trio time the last buffer in use was given back
        self._releasing = False  # a task lets the free buffers go once idle long enough

    def take(self, length: int) -> mmap.mmap:
        """A buffer of at least ``length`` bytes (its content is whatever was there): the
        smallest free one that fits, else a new one. OSError or MemoryError if none can be
        made (nothing is counted in use then)."""
        fits = [b for b in self._free if len(b) >= length]
        if fits:
            buf = min(fits, key=len)
            self._free.remove(buf)
        else:
            buf = mmap.mmap(-1, max(length, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                with contextlib.suppress(OSError):  # fewer faults where the kernel allows it
                    buf.madvise(mmap.MADV_HUGEPAGE)
            self.made += 1
        self.in_use += 1
        return buf

    def give(self, buf: mmap.mmap) -> None:
        """``buf``'s request has ended: it may be reused."""
        self.in_use -= 1
        self._free.append(buf)
        if len(self._free) > self.keep:
            self._free.remove(min(self._free, key=len))
        if not self.in_use:
            self._went_idle()

    def lost(self, buf: mmap.mmap) -> None:
        """``buf`` may still be read by a request that was given up: never reuse it."""
        self.in_use -= 1
        if not self.in_use:
            self._went_idle()

    @property
    def free(self) -> int:
        return len(self._free)

    def _went_idle(self) -> None:
        try:
            self._idle_since = trio.current_time()
            if not self._releasing:
                trio.lowlevel.spawn_system_task(self._let_go_when_idle)
                self._releasing = True
        except RuntimeError:  # not in a trio run (a tool): at once
            self._free.clear()

    async def _let_go_when_idle(self) -> None:
        try:
            while not self.in_use and self._free:
                left = self._idle_since + self.idle - trio.current_time()
                if left <= 0:
                    self._free.clear()
                    return
                await trio.sleep(left)
        finally:
            self._releasing = False

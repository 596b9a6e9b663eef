"""Buffers for the parts of multipart uploads, reused from one part to the next.

A part read into a fresh 16 MiB ``bytes`` costs page faults for every page, and once freed
glibc keeps it in the arena of the thread that read it: the daemon's peak memory grew with
the reading threads, to 6-8x boto3's for one upload. Here a part is read into a buffer of
anonymous memory (``mmap``) taken from a free list, and given back when its request has
ended. Buffers in use are bounded by the parts in flight; free ones by :data:`KEEP`, and
they are let go (returned to the system at once: no arena keeps ``mmap`` memory) whenever
no buffer is in use, so an idle daemon holds none.

A buffer whose request may still be sending from it (the caller was cancelled, and the
asyncio side may not have ended yet) is not given back but dropped (:meth:`PartBuffers.lost`):
reusing it could change bytes on their way. Take and give run on one thread (the trio
thread, or a part worker's loop); the read into a taken buffer may run on any.
"""

from __future__ import annotations

import mmap

KEEP = 16  # free buffers kept, at most


class PartBuffers:
    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._free: list[mmap.mmap] = []
        self.in_use = 0
        self.made = 0  # buffers made so far (reuse shows as fewer made than parts read)

    def take(self, length: int) -> mmap.mmap:
        """A buffer of at least ``length`` bytes (its content is whatever was there)."""
        self.in_use += 1
        for i, buf in enumerate(self._free):
            if len(buf) >= length:
                return self._free.pop(i)
        self.made += 1
        return mmap.mmap(-1, max(length, 1))

    def give(self, buf: mmap.mmap) -> None:
        """``buf``'s request has ended: it may be reused."""
        self.in_use -= 1
        if self.in_use == 0:
            self._free.clear()  # idle: the memory goes back now
        elif len(self._free) < self.keep:
            self._free.append(buf)

    def lost(self, buf: mmap.mmap) -> None:
        """``buf`` may still be read by a request that was given up: never reuse it."""
        self.in_use -= 1
        if self.in_use == 0:
            self._free.clear()

    @property
    def free(self) -> int:
        return len(self._free)

"""What the drain has done and is doing: counters for the metrics, and per-upload progress for
``ckptgw status``. Plain data, written on the trio thread, read by the status and metrics code
on the same thread."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

# Seconds: a 16 MiB part takes ~0.1 s on a fast link and minutes on a throttled one.
PART_SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass
class Histogram:
    """Cumulative-bucket histogram in the Prometheus sense (``le`` upper bounds)."""

    bounds: tuple[float, ...] = PART_SECONDS_BUCKETS
    counts: list[int] = field(default_factory=list)  # per bound, not cumulative; last: +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass
class DrainStats:
    bytes: int = 0  # bytes sent to the store (parts and single PUTs that succeeded)
    files: int = 0  # uploads completed
    # Bytes read from cache files for uploads: each byte once per upload. A part counts
    # when its send returns (in a part worker the daemon learns of the read only then); a
    # retried send reads its part again and is not counted twice.
    read: int = 0
    part_seconds: Histogram = field(default_factory=Histogram)  # per part or single PUT


# What an upload is doing (UploadProgress.phase), in order.
CHECKSUM = "checksum"  # a single PUT's file read for its body and xxh3 (the metadata's)
SENDING = "sending"  # single PUT or parts
COMPLETING = "completing"  # every part is there; CompleteMultipartUpload is under way


@dataclass
class UploadProgress:
    """One upload in progress. ``key`` is where it writes: the file's key when it began, which
    a rename meanwhile does not change (the object is moved once complete)."""

    inode: int
    key: str
    size: int = 0
    sent: int = 0  # bytes in the store for this upload, including resumed parts
    resumed: int = 0  # of those, sent before this attempt (by an earlier run or attempt)
    in_flight: int = 0  # bytes of parts (or the PUT) being sent now, not counted in ``sent``
    phase: str = CHECKSUM
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def throughput(self) -> float:
        """Bytes per second sent by this attempt."""
        return (self.sent - self.resumed) / max(self.elapsed, 1e-3)

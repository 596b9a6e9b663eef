"""What the kernel asked of the mount: FUSE requests by kind, with the time spent answering
them (status, metrics, and the tests that count requests per file)."""

from __future__ import annotations

from collections import Counter, defaultdict


class RequestStats:
    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.in_flight = 0  # requests being answered now

    def add(self, op: str, seconds: float) -> None:
        self.count[op] += 1
        self.seconds[op] += seconds

    def view(self) -> dict[str, dict[str, float]]:
        return {
            op: {"count": n, "seconds": round(self.seconds[op], 6)}
            for op, n in sorted(self.count.items())
        }

"""How fast this gateway sends requests to the store, learned from the store's refusals.

A store asked for more than it allows refuses the surplus: S3 answers 503 SlowDown above about
3,500 writes and 5,500 reads per second per prefix, and many gateways that save the same step
at once ask for far more. A retry with backoff keeps the data safe, but a fleet in which every
gateway keeps its full speed keeps being refused: each gateway must learn its share.

Each gateway keeps two :class:`Pace` (reads: GET, HEAD, LIST; writes: PUT, POST, DELETE and
copies), unlimited until the store first refuses one of its requests:

* **Cut.** A refusal (:data:`THROTTLED`) of a request sent since the last cut sets the rate to
  ``BETA`` times the rate (the first time: ``BETA`` times what this gateway sent in the last
  ``WINDOW`` seconds). Refusals of requests sent before the cut do not cut again: the cut
  answered them (a burst refused at once costs one cut, not one per request).
* **Growth.** Each accepted request lets the rate grow back along a cubic curve, as CUBIC
  (RFC 9438) and the AWS SDKs' adaptive retry mode do: quickly while far below the rate of the
  last cut, flat near it, then faster above it, probing for more. The curve's clock runs only
  while requests are accepted (a gap of more than ``IDLE`` seconds does not count): idle time
  is no evidence that the store would take more, so the next save starts at the rate learned.
* **Resume.** The first request after a quiet second resumes at the rate of the last cut, if
  the rate grew beyond it: what it grew to while others were quiet says nothing of a fleet
  that starts its next save at once.
* **Jitter.** The time to grow back to the rate of the last cut is drawn for each cut
  (``K`` times 0.8 to 1.2), and each gap between two requests is drawn around ``1 / rate``
  (0.5 to 1.5 times), so the gateways of a fleet do not cut and grow in lock-step.
* **Floor.** The rate never goes below ``min_rate`` per second.

Requests wait for their turn here, in order, one at a time; a waiting request holds no
connection and no part buffer. This module only counts and decides; the one place that sends
and retries (:mod:`ckptgw.store.retry`) asks it for a turn and tells it each answer. Time is trio's,
so tests run it on a fake clock.
"""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

BETA = 0.7  # the rate after a cut, as a share of the rate accepted
GROWTH = 0.4  # the cubic's constant C: requests/s per s^3
WINDOW = 1.0  # seconds over which the rate sent is measured
IDLE = 1.0  # a gap between accepted requests longer than this does not grow the rate
MINUTE = 60.0
# The store's refusals that mean "too fast" (others, a 500 or a reset, say nothing of the rate).
THROTTLED = frozenset(
    {
        "SlowDown",
        "503",
        "ServiceUnavailable",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "429",
    }
)

READ = "reads"
WRITE = "writes"


@dataclass(frozen=True)
class PacingConfig:
    adaptive_rate: bool = True  # False: never limit (refusals are still counted)
    min_rate: float = 0.5  # requests per second, per kind


class Pace:
    """The pace of one kind of request (reads or writes)."""

    def __init__(
        self,
        kind: str,
        config: PacingConfig = PacingConfig(),
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.kind = kind
        self.config = config
        self._rng = rng or random.Random()
        self._clock = clock
        self.rate: float | None = None  # requests per second; None: unlimited
        self._lock = trio.Lock()  # FIFO: requests take their turns in order
        self._next = -math.inf  # the earliest time of the next request
        self._cuts = 0
        self._last_cut = -math.inf
        self._peak = 0.0  # the rate at the last cut (the cubic's W_max)
        self._k = 0.0  # seconds of growth back to ``_peak`` after the last cut
        self._grown = 0.0  # seconds of growth since the last cut
        self._last_ok = -math.inf
        self._sent: collections.deque[float] = collections.deque()  # the last WINDOW
        self._refused: collections.deque[float] = collections.deque()  # the last MINUTE
        self.sent = 0
        self.refused = 0
        self.waiting = 0
        self.waited = 0.0  # seconds requests spent waiting for their turn, all together

    # -- a request's turn ------------------------------------------------------------------------

    async def turn(self) -> float:
        """Wait for this request's turn; returns its ticket (for :meth:`refusal`): the time
        it was sent."""
        self._trim(self._clock())  # what was sent a WINDOW ago is out: quiet, or not
        if self.rate is not None and not self._sent and not self._lock.locked():
            self._resume()
        if self.rate is not None or self._lock.locked():
            start = self._clock()
            self.waiting += 1
            try:
                async with self._lock:
                    while self.rate is not None and self._clock() < self._next:
                        await trio.sleep_until(self._next)  # a cut meanwhile moves it on
                    if self.rate is not None:
                        gap = self._rng.uniform(0.5, 1.5) / self.rate
                        self._next = self._clock() + gap
            finally:
                self.waiting -= 1
                self.waited += self._clock() - start
        self.sent += 1
        now = self._clock()
        self._sent.append(now)
        return now

    def _resume(self) -> None:
        """The first request after ``WINDOW`` seconds without any: what the rate grew to since
        the last cut (while other gateways were done, say) says nothing of now, when a fleet
        may start its next save at once. Resume at the rate of the last cut, on the curve's
        plateau (CUBIC's K), and probe from there."""
        assert self.rate is not None
        if self.rate > self._peak:
            self.rate = self._peak
            self._grown = self._k

    def accepted(self) -> None:
        """The store answered a request (not a refusal): the rate grows along the curve."""
        now = self._clock()
        if self.rate is None:
            self._last_ok = now
            return
        gap = now - self._last_ok
        if 0 < gap <= max(IDLE, 2 / self.rate):  # busy: a gap of a few turns at most
            self._grown += gap
        self._last_ok = now
        curve = self._peak + GROWTH * (self._grown - self._k) ** 3
        self.rate = max(self.config.min_rate, curve)

    def refusal(self, ticket: float) -> None:
        """The store refused a request sent at ``ticket`` as too many: cut the rate, unless
        the request went before the last cut (that cut answered it)."""
        now = self._clock()
        self.refused += 1
        self._refused.append(now)
        self._trim(now)
        if not self.config.adaptive_rate or ticket <= self._last_cut:
            return
        # The first cut starts from what this gateway sent in the last WINDOW (a burst, all
        # at once); later ones from the rate.
        base = len(self._sent) / WINDOW if self.rate is None else self.rate
        self._peak = max(self.config.min_rate, base)
        self.rate = max(self.config.min_rate, BETA * base)
        k = (self._peak * (1 - BETA) / GROWTH) ** (1 / 3)
        self._k = k * self._rng.uniform(0.8, 1.2)
        self._grown = 0.0
        self._last_cut = now
        self._cuts += 1
        self._next = max(self._next, now + 1 / self.rate)

    def pushing_back(self) -> bool:
        """Whether the store refused one of these requests as too many in the last minute
        (speculative requests, a warm-up's, wait until it has not)."""
        self._trim(self._clock())
        return bool(self._refused)

    def _trim(self, now: float) -> None:
        while self._sent and self._sent[0] <= now - WINDOW:
            self._sent.popleft()
        while self._refused and self._refused[0] <= now - MINUTE:
            self._refused.popleft()

    # -- what status shows -----------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        self._trim(self._clock())
        return {
            "rate": None if self.rate is None else round(self.rate, 2),
            "refused_per_minute": len(self._refused),
            "refused": self.refused,
            "sent": self.sent,
            "cuts": self._cuts,
            "waiting": self.waiting,
            "waited": round(self.waited, 3),
        }


class Pacing:
    """The two paces of one gateway's store requests."""

    def __init__(
        self,
        config: PacingConfig = PacingConfig(),
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.config = config
        self.reads = Pace(READ, config, rng=rng, clock=clock)
        self.writes = Pace(WRITE, config, rng=rng, clock=clock)

    def of(self, kind: str) -> Pace:
        return self.reads if kind == READ else self.writes

    def view(self) -> dict[str, Any]:
        return {
            "adaptive": self.config.adaptive_rate,
            READ: self.reads.view(),
            WRITE: self.writes.view(),
        }

"""The one place where store calls are retried.

Temporary errors (503 SlowDown, 500, throttling, connection resets, timeouts) are retried with
exponential backoff and full jitter, never sooner than a ``Retry-After`` the server sent, up to
``attempts`` tries; then the last error is raised. Permanent errors (403, a missing bucket, a
bad request) are raised at once: retrying cannot fix them, and the caller keeps the data dirty
and tries again later (e.g. after the credentials were refreshed).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from drain.store import StoreError

log = logging.getLogger(__name__)
T = TypeVar("T")
_JITTER = random.Random()


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    base: float = 0.1  # seconds before the first retry (before jitter)
    cap: float = 20.0  # the longest single wait


@dataclass
class RetryStats:
    """What went wrong with store calls: shown by ``ckptgw status`` and the metrics."""

    retries: int = 0
    last_error: str = ""
    last_error_at: float = 0.0  # seconds since the epoch
    errors: dict[str, int] = field(default_factory=dict)  # by kind: the error code

    def failed(self, what: str, e: StoreError) -> None:
        """Count one failed store call (retried or not)."""
        kind = e.code or ("temporary" if e.temporary else "permanent")
        self.errors[kind] = self.errors.get(kind, 0) + 1
        self.last_error = f"{what}: {e}" if what and not str(e).startswith(what) else str(e)
        self.last_error_at = time.time()


async def retrying(
    what: str,
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy = RetryPolicy(),
    stats: RetryStats | None = None,
    *,
    rng: random.Random = _JITTER,
) -> T:
    """Run ``call`` until it succeeds, fails permanently or runs out of attempts."""
    for attempt in range(1, policy.attempts + 1):
        try:
            return await call()
        except StoreError as e:
            if stats is not None:
                stats.failed(what, e)
            if not e.temporary or attempt == policy.attempts:
                raise
            delay = rng.uniform(0, min(policy.cap, policy.base * 2 ** (attempt - 1)))
            if e.retry_after is not None:
                delay = max(delay, min(e.retry_after, policy.cap))
            if stats is not None:
                stats.retries += 1
            log.info("%s: %s; retry %d in %.2f s", what, e, attempt, delay)
            await trio.sleep(delay)
    raise AssertionError("unreachable")

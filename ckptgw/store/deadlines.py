"""Every request to an S3 store has a deadline, and a request that stops moving is seen.

Why this exists: the HTTP layer bounds only part of a request. aiohttp waits for a ``100
Continue`` without limit (botocore asks for one on every PUT and part), its read timeout
starts only once the body is written, and a body the server stops reading waits in the
socket for ever. So each request (each attempt) has a :class:`RequestWatch`, and a sweeper on
the client's asyncio loop (:class:`Watchdog`) holds it to :class:`Deadlines`:

* until the request is sent (signing, a connection, its head) and then until the first byte
  of the answer: ``first_byte_timeout`` seconds (ten times that, :data:`SLOW_ANSWER`, for the calls
  that make the store work on a whole object first: CompleteMultipartUpload and copies);
* while bytes move, either way: ``stall_timeout`` seconds without one of them moving;
* a request sent with ``Expect: 100-continue``: ``continue_wait`` seconds for the 100, after
  which the store (:class:`ckptgw.store.s3.S3Store`) stops asking that endpoint for it.

Past ``stall_warning`` seconds without progress a request is *stalled*: said once in the log (the
store's ``on_stall``), and listed by ``ckptgw status`` and the metrics until it moves again;
past its deadline the attempt is cancelled and fails with a temporary StoreError (code
:data:`STALLED` or :data:`TIMEOUT`), which :mod:`ckptgw.store.retry` retries like any transport
error. The TCP connect itself is aiohttp's (``connect_timeout``, its ``sock_connect``).

What it costs: a watch is written only on the asyncio thread, by plain attribute stores (a
body's progress is a time and a byte count per 1 MiB chunk, no call across threads). One
sweeper per store looks at every request in flight each :data:`TICK` seconds (it runs only
while there are some), so a request costs no timer of its own (a timer per request, re-armed
at each phase change, costs more: docs/benchmarks.md). The deadlines are kept to within a
tick. The trio side reads the watches when status asks
(:meth:`Watchdog.views`). :func:`judge` is the whole rule, a pure function of a watch and the
time, tested alone.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from ckptgw.store.interface import StoreError

log = logging.getLogger(__name__)
T = TypeVar("T")

# What a request is doing (RequestWatch.phase), in order.
PREPARING = "preparing"  # signing it, finding credentials
CONNECTING = "connecting"  # a connection (from the pool or new) and the request's head
CONTINUE = "waiting for 100 Continue"  # the head went with Expect: 100-continue
SENDING = "sending"  # the body
ANSWER = "waiting for the answer"  # all of it sent
RECEIVING = "receiving"  # the body of the answer (GETs)
MOVING = (SENDING, RECEIVING)  # the phases where bytes move: ``stall_timeout`` applies

# Error codes of the attempts the watchdog cancels (temporary StoreErrors).
STALLED = "Stalled"  # no byte moved for ``stall_timeout`` seconds
TIMEOUT = "Timeout"  # no answer within ``first_byte_timeout`` seconds
NO_CONTINUE = "NoContinue"  # no 100 Continue: the store sends it again without Expect

#: The store check (a HEAD of the bucket, before a mount) waits at most this many seconds
#: for its answer: any store that works answers it in milliseconds, and a mount waits on it.
CHECK_ANSWER = 10.0

#: The calls whose answer comes after the store has worked on the whole object
#: (CompleteMultipartUpload, CopyObject, UploadPartCopy: S3 says minutes for the largest)
#: wait this many times ``first_byte_timeout`` for it, and warn this many times later.
SLOW_ANSWER = 10

#: Seconds between two looks of the sweeper at the requests in flight: how late a deadline
#: may be noticed (the 100-continue wait is 1 s).
TICK = 0.1


@dataclass(frozen=True)
class Deadlines:
    """Seconds; the defaults are the settings table's (``store.*_timeout``)."""

    connect_timeout: float = 10.0  # a TCP (and TLS) connection
    first_byte_timeout: float = 30.0  # the request sent: the first byte of the answer
    stall_timeout: float = 30.0  # no byte moved while a body is sent or received
    stall_warning: float = 10.0  # no progress this long: stalled (a warning; status lists it)
    continue_wait: float = 1.0  # Expect: 100-continue unanswered this long: not spoken here

    @property
    def read_timeout(self) -> float:
        """aiohttp's own read timeout: a backstop behind the watchdog, never before it."""
        return max(self.first_byte_timeout * SLOW_ANSWER, self.stall_timeout) + self.connect_timeout

    def message(self) -> dict[str, float]:
        """For a part worker's opening message."""
        return asdict(self)

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> Deadlines:
        return cls(**{k: float(v) for k, v in msg.items() if k in cls.__dataclass_fields__})


class RequestWatch:
    """One attempt of one store request: what it is, and what it is doing since when.

    Written only on the client's asyncio thread; read from trio (plain attributes)."""

    _ids = itertools.count(1)

    def __init__(
        self,
        what: str,
        key: str = "",
        *,
        size: int = 0,
        answer: float = 30.0,
        warn: float = 10.0,
        now: float = 0.0,
    ) -> None:
        self.id = next(self._ids)
        self.what = what  # "PART 3 of run/latest.pt"
        self.key = key
        self.size = size  # the request body's bytes (0: none)
        self.answer = answer  # seconds allowed while not moving bytes (see judge)
        self.warn = warn  # seconds without progress before it counts as stalled
        self.started = now
        self.phase = PREPARING
        self.progress_at = now  # the last phase change or byte moved
        self.sent = 0
        self.received = 0
        self.expect = False  # sent with Expect: 100-continue
        self.stalled = False  # past ``warn`` when the watchdog last looked (its reports)
        self.warn_after = warn  # the current phase's ``warn`` (the watchdog's, as it looks)
        self.warned = False  # said so in the log (once per request)
        self.ended_by: str | None = None  # STALLED, TIMEOUT or NO_CONTINUE: cancelled
        self.task: asyncio.Task[Any] | None = None  # the attempt's, while the watchdog holds it

    def to(self, phase: str, now: float) -> None:
        """A new phase: progress, and (possibly) another deadline, which the sweeper's next
        look applies."""
        self.phase = phase
        self.progress_at = now

    def moved(self, now: float, *, sent: int = 0, received: int = 0) -> None:
        """Bytes moved (a body's chunk): progress, the deadline unchanged."""
        self.sent += sent
        self.received += received
        self.progress_at = now

    def restart(self, now: float) -> None:
        """The same request again (sent without Expect)."""
        self.phase, self.progress_at = PREPARING, now
        self.sent = self.received = 0
        self.expect = self.stalled = False
        self.ended_by = None

    def idle(self, now: float) -> float:
        return max(0.0, now - self.progress_at)

    def view(self, now: float) -> dict[str, Any]:
        """What ``ckptgw status`` shows of it."""
        return {
            "what": self.what,
            "key": self.key,
            "phase": self.phase,
            "age": round(max(0.0, now - self.started), 3),
            "idle": round(self.idle(now), 3),
            "sent": self.sent,
            "size": self.size,
            "received": self.received,
            # Seen now, not when the watchdog last looked (each tick). (A request waiting for
            # its 100 Continue ends within continue_wait, far below warn_after, unless the
            # pool is full: then it may wait for a connection, and is stalled as any other.)
            "stalled": self.idle(now) >= self.warn_after,
        }

    def error(self, endpoint: str, d: Deadlines) -> StoreError:
        """The StoreError of an attempt the watchdog cancelled (``ended_by``)."""
        if self.ended_by == NO_CONTINUE:
            return StoreError(
                f"{self.what}: {endpoint} did not answer Expect: 100-continue in "
                f"{d.continue_wait:g} s",
                temporary=True,
                code=NO_CONTINUE,
            )
        _, limit = limits(self, d)
        if self.ended_by == STALLED:
            moved = (
                f"{self.sent} of {self.size} bytes sent"
                if self.phase == SENDING
                else f"{self.received} bytes received"
            )
            return StoreError(
                f"{self.what}: stalled: no progress for {limit:g} s while {self.phase} "
                f"({moved}) at {endpoint}; cancelled",
                temporary=True,
                code=STALLED,
            )
        return StoreError(
            f"{self.what}: no answer from {endpoint} in {limit:g} s ({self.phase}); cancelled",
            temporary=True,
            code=TIMEOUT,
        )


def limits(watch: RequestWatch, d: Deadlines) -> tuple[float, float]:
    """Seconds without progress in the watch's phase before it is stalled, and before it is
    cancelled."""
    limit = d.stall_timeout if watch.phase in MOVING else watch.answer
    return min(watch.warn, limit), limit


# What judge() says: nothing to do yet, or what to do now.
WAIT = "wait"
STALL = "stall"  # it just became stalled
RESUME = "resume"  # it moved again after it was stalled
EXPIRE = "expire"  # cancel it: ended_by says why


def judge(
    watch: RequestWatch, now: float, d: Deadlines, pool_full: bool = False
) -> tuple[str, str | None, float]:
    """The rule: (what to do, why it ends if it does, when to look again).

    A request sent with Expect whose body has not started after ``continue_wait`` seconds
    got no 100 Continue, unless every connection of the pool may be taken (``pool_full``):
    then it may still be waiting for one, and only the answer's deadline applies."""
    idle = now - watch.progress_at
    if watch.phase == CONTINUE and not pool_full:
        if idle >= d.continue_wait:
            return EXPIRE, NO_CONTINUE, now
        return WAIT, None, watch.progress_at + d.continue_wait
    warn, limit = limits(watch, d)
    if idle >= limit:
        return EXPIRE, STALLED if watch.phase in MOVING else TIMEOUT, now
    if idle >= warn:
        return (WAIT if watch.stalled else STALL), None, watch.progress_at + limit
    if watch.stalled:
        return RESUME, None, watch.progress_at + warn
    return WAIT, None, watch.progress_at + warn


#: The request the current asyncio task (and the tasks it starts) is making: how botocore's
#: event handlers find it.
CURRENT: contextvars.ContextVar[RequestWatch | None] = contextvars.ContextVar(
    "ckptgw_request", default=None
)

#: ``on_stall(watch, stalled)``: a request became stalled (True) or moved again (False).
#: Called on the asyncio thread: it must be quick and must not raise.
OnStall = Callable[[RequestWatch, bool], None]


class Watchdog:
    """One store's deadlines and its requests in flight.

    ``requests`` is changed only on the trio thread (:meth:`add`, :meth:`remove`); the
    asyncio side reads its size (is the connection pool full?)."""

    def __init__(
        self, deadlines: Deadlines, endpoint: str, pool_size: int, on_stall: OnStall
    ) -> None:
        self.deadlines = deadlines
        self.endpoint = endpoint
        self.pool_size = pool_size
        self.on_stall = on_stall
        self.requests: dict[int, RequestWatch] = {}
        self.stalls = 0  # requests that became stalled (counted once each)
        self.cancelled = 0  # attempts cancelled at their deadline
        # The attempts the sweeper holds to their deadlines: asyncio side only.
        self._held: dict[int, RequestWatch] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def watch(
        self,
        what: str,
        key: str = "",
        *,
        size: int = 0,
        slow: bool = False,
        answer: float | None = None,
        now: float,
    ) -> RequestWatch:
        """A watch for one request: ``size``, its body's bytes; ``slow``, the store works on
        a whole object before it answers; ``answer``, another first-byte deadline."""
        d = self.deadlines
        scale = SLOW_ANSWER if slow else 1
        return RequestWatch(
            what,
            key,
            size=size,
            answer=(d.first_byte_timeout * scale) if answer is None else answer,
            warn=d.stall_warning * scale,
            now=now,
        )

    def add(self, watch: RequestWatch) -> None:
        self.requests[watch.id] = watch

    def remove(self, watch: RequestWatch) -> None:
        self.requests.pop(watch.id, None)

    def pool_full(self) -> bool:
        return len(self.requests) >= self.pool_size

    def views(self, now: float) -> list[dict[str, Any]]:
        """Every request in flight, the longest without progress first (trio side)."""
        watches = list(self.requests.values())
        return sorted((w.view(now) for w in watches), key=lambda v: -v["idle"])

    async def watched(self, watch: RequestWatch, make: Callable[[], Awaitable[T]]) -> T:
        """``make()`` on the asyncio loop, held to the deadlines; an attempt cancelled at one
        raises its StoreError."""
        task = asyncio.current_task()
        assert task is not None
        watch.task = task
        self._held[watch.id] = watch
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        token = CURRENT.set(watch)
        try:
            return await make()
        except BaseException:
            if watch.ended_by is None:
                raise
            # Ours: the cancel (or whatever the HTTP layer made of it) ends as its error.
            task.uncancel()
            raise watch.error(self.endpoint, self.deadlines) from None
        finally:
            self._held.pop(watch.id, None)
            watch.task = None
            CURRENT.reset(token)

    async def _sweep(self) -> None:
        """Every :data:`TICK` seconds while attempts are held: judge each (asyncio side)."""
        loop = asyncio.get_running_loop()
        try:
            while self._held:
                await asyncio.sleep(TICK)
                for watch in list(self._held.values()):
                    self._look(watch, loop.time())
        finally:
            self._sweeper = None

    def _look(self, watch: RequestWatch, now: float) -> None:
        watch.warn_after = limits(watch, self.deadlines)[0]
        action, why, _ = judge(watch, now, self.deadlines, self.pool_full())
        if action == EXPIRE:
            if watch.ended_by is None and watch.task is not None:
                watch.ended_by = why
                self.cancelled += why != NO_CONTINUE
                watch.task.cancel()
            return
        if action in (STALL, RESUME):
            watch.stalled = action == STALL
            self.stalls += watch.stalled and not watch.warned
            try:
                self.on_stall(watch, watch.stalled)
            except Exception:  # a report must never end the request
                log.exception("reporting a stalled request failed")
            watch.warned = watch.warned or watch.stalled

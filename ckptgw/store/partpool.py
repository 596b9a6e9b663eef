"""A pool of part workers: the processes that read and send multipart parts for the daemon.

One interpreter reads, checksums and sends every part otherwise; on a node with many cores
that one core is the drain's ceiling. With ``drain.part_workers`` > 0, :class:`S3Store`
hands each part (the cache file's descriptor, an offset and a length) to the least busy of
that many :mod:`ckptgw.store.partworker` processes, which reads it once, computes its CRC32, sends
it and answers with the ETag and the CRC32. The daemon only schedules and journals.

A worker that dies (kill -9, out of memory) fails the parts it had in flight with a
temporary StoreError (code ``PartWorker``), which :class:`ckptgw.store.retry.RetryingStore` retries
like any other, and is replaced at once. A worker that ends before it is ready counts as a
failed start; after :data:`FAILED_STARTS` in a row, or :data:`DEATHS` workers ending within
:data:`DEATH_WINDOW` seconds, the pool stops (``usable`` is False) and parts go from the
daemon again, with the reason logged (a worker that fails says why on its socket before it
exits). Cancelling a part tells its worker to stop sending it and waits (up to
:data:`CANCEL_WAIT`) until it has, as the in-process client does; a worker that has not by
then is killed (and replaced), so the part is never still in flight when the cancel returns.
Closing the pool closes the sockets (the workers see end of file and exit), then kills what
is still there after :data:`STOP_WAIT`.

Workers hold their requests to the same :class:`ckptgw.store.deadlines.Deadlines` as the daemon
(given in the opening message). A part that stalls in a worker is told to the daemon as it
happens (``{"id", "stalled": view}``, and ``"stalled": null`` once it moves again): the pool
logs it once and lists it in :meth:`in_flight`. Each part request says whether to ask Expect:
100-continue, and each answer whether the worker still does, so that the daemon and every
worker learn it of the endpoint from whichever found out first.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import trio

from ckptgw.store.deadlines import Deadlines
from ckptgw.store.interface import StoreError
from ckptgw.store.partwire import Message, encode, error_of, receive, send

log = logging.getLogger(__name__)

FAILED_STARTS = 3
# Workers that end while serving, this many within DEATH_WINDOW seconds: something kills
# them (memory, a bug); the pool stops rather than start them for ever.
DEATHS = 5
DEATH_WINDOW = 60.0
CANCEL_WAIT = 5.0
STOP_WAIT = 5.0
WORKER_DIED = "PartWorker"


@dataclass
class _Call:
    what: str = ""
    key: str = ""
    size: int = 0
    started: float = field(default_factory=time.monotonic)
    done: trio.Event = field(default_factory=trio.Event)
    reply: Message | None = None
    error: StoreError | None = None
    stalled: Message | None = None  # the worker's view of it while it is stalled
    stalled_at: float = 0.0  # when that view came
    warned: bool = False


class _Worker:
    def __init__(self, proc: subprocess.Popen[bytes], sock: trio.socket.SocketType) -> None:
        self.proc = proc
        self.sock = sock
        self.calls: dict[int, _Call] = {}
        self.ready = False
        self.alive = True
        self.fatal = ""  # what it said before it ended, if it could
        self.sending = trio.Lock()

    async def send(self, msg: Message, fd: int | None = None) -> None:
        async with self.sending:
            await send(self.sock, msg, fd)


class PartPool:
    def __init__(self, size: int, opening: Message, nursery: trio.Nursery) -> None:
        self.size = size
        self._opening = opening
        self._nursery = nursery
        self._workers: list[_Worker] = []
        self._ids = itertools.count(1)
        self._failed_starts = 0
        self.usable = True
        self.closing = False
        self.replaced = 0  # workers started again after one ended
        self.answered = 0  # answers the workers gave (sent, failed or cancelled)
        self.sent = 0  # parts the workers sent
        self.stalls = 0  # parts that stalled in a worker (each counted once)
        # Why the workers no longer ask Expect: 100-continue (None while they do).
        self.no_continue: str | None = None
        self._deaths: collections.deque[float] = collections.deque(maxlen=DEATHS)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        size: int,
        *,
        url: str,
        endpoint_url: str | None,
        deadlines: Deadlines,
        max_connections: int,
    ) -> AsyncIterator[PartPool]:
        opening = {
            "op": "open",
            "url": url,
            "endpoint_url": endpoint_url,
            "deadlines": deadlines.message(),
            "max_connections": max_connections,
        }
        try:
            async with trio.open_nursery() as nursery:
                pool = cls(size, opening, nursery)
                for _ in range(size):
                    pool._start()
                log.info("%d part workers started", size)
                try:
                    yield pool
                finally:
                    with trio.CancelScope(shield=True):
                        await pool._close()
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The readers end quietly: what comes out is the caller's own error, unwrapped
            # (the nursery is this pool's business, not the caller's).
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    def view(self) -> dict[str, object]:
        """What ``ckptgw status`` shows of the pool."""
        return {
            "configured": self.size,
            "running": len(self.pids),
            "replaced": self.replaced,
            "parts": self.sent,
            "in_use": self.usable,
        }

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]  # a worker leaves the list as it ends

    def _start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with theirs:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "ckptgw.store.partworker",
                        str(theirs.fileno()),
                        str(os.getpid()),
                    ],
                    pass_fds=[theirs.fileno()],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,  # a ^C for the daemon (it drains) is not theirs
                )
            # The first message fits the empty socket buffer: sent before the worker reads.
            mine.send(encode(self._opening))
        except OSError as e:
            mine.close()
            self._failed(f"could not start one: {e}")
            return
        mine.setblocking(False)
        worker = _Worker(proc, trio.socket.from_stdlib_socket(mine))
        self._workers.append(worker)
        self._nursery.start_soon(self._serve, worker)

    def _failed(self, why: str) -> None:
        self._failed_starts += 1
        if self._failed_starts >= FAILED_STARTS:
            self.usable = False
            log.error(
                "part workers: %s; %d failed starts in a row, so parts are sent "
                "from the daemon from now on",
                why,
                self._failed_starts,
            )
        else:
            log.warning("part workers: %s; starting another", why)
            self._start()

    async def _serve(self, worker: _Worker) -> None:
        """Hand each answer to its caller until the worker's end closes."""
        try:
            while True:
                msg, fds = await receive(worker.sock)
                for fd in fds:
                    os.close(fd)
                if msg is None:
                    break
                if msg.get("ready"):
                    worker.ready = True
                    self._failed_starts = 0
                    continue
                if "fatal" in msg:
                    worker.fatal = str(msg["fatal"])
                    continue
                call = worker.calls.get(msg.get("id", 0))
                if call is not None and "stalled" in msg:
                    self._stalled(worker, call, msg["stalled"])
                    continue
                if call is not None:
                    if msg.get("expect") is False and self.no_continue is None:
                        self.no_continue = str(msg.get("no_continue") or "")
                    self.answered += 1
                    if "etag" in msg:
                        self.sent += 1
                    call.reply = msg
                    call.done.set()
        except OSError:
            pass
        except Exception:  # an answer that is not the protocol's: the worker is not trusted
            log.exception("part worker %d answered garbage: stopping it", worker.proc.pid)
            with contextlib.suppress(OSError):
                worker.proc.kill()
        finally:
            with trio.CancelScope(shield=True):
                await self._ended(worker)

    async def _ended(self, worker: _Worker) -> None:
        worker.alive = False
        self._workers.remove(worker)
        worker.sock.close()
        # A worker that was serving is replaced before its callers hear of it, so that their
        # retries find the replacement (its socket takes requests before it is ready).
        replace = worker.ready and not self.closing
        if replace:
            now = trio.current_time()
            self._deaths.append(now)
            if len(self._deaths) == DEATHS and now - self._deaths[0] < DEATH_WINDOW:
                replace = False
                self.usable = False
                log.error(
                    "part workers: %d ended within %.0f s (the last: %s), so parts are sent "
                    "from the daemon from now on",
                    DEATHS,
                    now - self._deaths[0],
                    worker.fatal or "no reason given",
                )
        if replace:
            self.replaced += 1
            self._start()
        pending = list(worker.calls.values())
        for call in pending:
            call.error = StoreError(
                f"part worker {worker.proc.pid} ended with the part in flight",
                temporary=True,
                code=WORKER_DIED,
            )
            call.done.set()
        status = await _reap(worker.proc)
        how = f"ended ({_status_text(status)}{': ' + worker.fatal if worker.fatal else ''})"
        if replace:
            log.warning(
                "part worker %d %s with %d parts in flight (they are sent again); started another",
                worker.proc.pid,
                how,
                len(pending),
            )
        elif not worker.ready and not self.closing and self.usable:
            self._failed(f"worker {worker.proc.pid} {how} before it was ready")

    def _stalled(self, worker: _Worker, call: _Call, view: Message | None) -> None:
        """A worker's part stalled (``view``: how it looks there) or moved again (None)."""
        call.stalled = view
        call.stalled_at = time.monotonic()
        if view is not None and not call.warned:
            call.warned = True
            self.stalls += 1
            log.warning("%s (in part worker %d)", view.get("text", call.what), worker.proc.pid)

    def in_flight(self) -> list[dict[str, Any]]:
        """The parts in the workers, as :meth:`ckptgw.store.s3.S3Store.in_flight` lists
        requests: a stalled one as its worker last described it, aged since."""
        now = time.monotonic()
        out = []
        for worker in self._workers:
            for call in worker.calls.values():
                view: dict[str, Any] = {
                    "what": call.what,
                    "key": call.key,
                    "phase": "in a part worker",
                    "age": round(now - call.started, 3),
                    "idle": 0.0,
                    "sent": 0,
                    "size": call.size,
                    "received": 0,
                    "stalled": False,
                }
                if call.stalled is not None:  # as the worker saw it, aged since
                    later = now - call.stalled_at
                    view |= {k: call.stalled[k] for k in ("phase", "sent", "received")}
                    view |= {"idle": round(float(call.stalled["idle"]) + later, 3)}
                    view["stalled"] = True
                out.append(view)
        return out

    def _pick(self) -> _Worker | None:
        return min(self._workers, key=lambda w: len(w.calls)) if self._workers else None

    async def upload_part(
        self,
        key: str,
        upload_id: str,
        number: int,
        fd: int,
        offset: int,
        length: int,
        *,
        checksum: bool,
        expect: bool = True,
    ) -> tuple[str, int]:
        """What :meth:`Store.upload_part_from` returns, from a worker; ``checksum``: whether the
        part carries its CRC32 (the upload was made with that algorithm); ``expect``: whether
        it may ask Expect: 100-continue (the daemon's store has not found it unanswered)."""
        what = f"PART {number} of {key}"
        worker = self._pick()
        if worker is None:
            raise StoreError(f"{what}: no part worker is running", temporary=True, code=WORKER_DIED)
        rid = next(self._ids)
        call = _Call(what, key, length)
        worker.calls[rid] = call
        request = {
            "op": "part",
            "id": rid,
            "key": key,
            "upload_id": upload_id,
            "number": number,
            "offset": offset,
            "length": length,
            "checksum": checksum,
            "expect": expect and self.no_continue is None,
        }
        try:
            try:
                await worker.send(request, fd)
            except (OSError, trio.ClosedResourceError) as e:
                raise StoreError(
                    f"{what}: part worker {worker.proc.pid} is gone ({e})",
                    temporary=True,
                    code=WORKER_DIED,
                ) from None
            try:
                await call.done.wait()
            except BaseException:  # cancelled: the part is no longer sent when this returns
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(CANCEL_WAIT):
                        if worker.alive:
                            with contextlib.suppress(OSError, trio.ClosedResourceError):
                                await worker.send({"op": "cancel", "id": rid})
                            await call.done.wait()
                    if not call.done.is_set() and worker.alive:  # it did not stop: it goes
                        log.warning(
                            "part worker %d did not stop a cancelled part: killing it",
                            worker.proc.pid,
                        )
                        with contextlib.suppress(OSError):
                            worker.proc.kill()
                        await call.done.wait()  # its end fails the call (the socket closes)
                raise
        finally:
            del worker.calls[rid]
        if call.error is not None:
            raise call.error
        reply = call.reply or {}
        if "error" in reply:
            raise error_of(reply)
        if reply.get("cancelled"):
            raise StoreError(f"{what}: cancelled", temporary=True, code="Cancelled")
        try:
            return str(reply["etag"]), int(reply["crc"])
        except (KeyError, TypeError, ValueError):
            raise StoreError(
                f"{what}: the part worker's answer has no ETag and CRC32: {reply!r}",
                temporary=True,
                code=WORKER_DIED,
            ) from None

    async def _close(self) -> None:
        self.closing = True
        for worker in self._workers:
            with contextlib.suppress(OSError):
                worker.sock.shutdown(socket.SHUT_WR)  # end of file: the worker exits
        with trio.move_on_after(STOP_WAIT):
            while self._workers:
                await trio.sleep(0.02)
        for worker in self._workers:
            log.warning("part worker %d did not exit: killing it", worker.proc.pid)
            with contextlib.suppress(OSError):
                worker.proc.kill()


async def _reap(proc: subprocess.Popen[bytes]) -> int:
    """The worker's exit status, once it has exited; killed if it lingers past STOP_WAIT."""
    with trio.move_on_after(STOP_WAIT):
        while proc.poll() is None:
            await trio.sleep(0.02)
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.kill()
        return await trio.to_thread.run_sync(proc.wait)
    return proc.returncode


def _status_text(status: int) -> str:
    if status < 0:
        return f"killed by signal {-status}"
    return f"exit status {status}"

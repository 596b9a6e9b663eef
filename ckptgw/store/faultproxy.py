"""An HTTP/1.1 proxy on loopback that injects faults between the gateway and the S3 server.

Faults apply to the next ``count`` requests whose method and path match:

* ``slowdown``: answer 503 SlowDown with ``Retry-After`` instead of forwarding;
* ``reset``: read the request head and half the body, then reset the connection;
* ``stall``: hold the request for ``seconds`` before forwarding it (beyond a client timeout,
  the client gives up and retries);
* ``hold``: hold the request (its body read) until the test calls ``release()``, or for
  ``seconds`` (default 50, under the client's read timeout): an upload seen mid-way without
  depending on timing; with ``drop``, the held request is then dropped, not forwarded (its
  client gave up on it: it must never reach the server after the client's retry);
* ``corrupt``: flip one byte in the middle of the body on the way (a damaged network path);
* ``silent``: accept the request and never answer: read its head, send nothing (no 100
  Continue either) until the test calls ``release()`` or ``seconds`` pass (default 600),
  then close the connection;
* ``stop-reading``: read the head (answering a 100 Continue) and ``after`` bytes of the body
  (default 1 MiB), then stop reading (the client's writes back up) until released;
* ``stop-sending``: forward the request, then send the head of the answer and half its body,
  and nothing more until released.

``ignore_expect``: the proxy never answers ``Expect: 100-continue`` (as some proxies, load
balancers and S3-compatible servers do not): it waits for the body without a 100, as RFC 9110
lets a server do. ``expected`` lists the paths of the requests that asked for one.

``limit`` (a :class:`RateLimit`): token buckets for reads and writes, as S3 limits the
requests per second of a prefix: a request that finds its bucket empty is answered 503
SlowDown at once, without ``Retry-After`` (as S3 answers a burst), and is not forwarded.

A request with an ``x-amz-checksum-crc32`` header has its body checked against it, as S3 does
and moto does not: a mismatch is answered 400 ``BadDigest`` and not forwarded. ``checked``
lists the paths whose checksum matched.
"""

from __future__ import annotations

import base64
import re
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field


@dataclass
class Fault:
    kind: str
    method: str = ".*"
    path: str = ".*"
    count: int = 1
    seconds: float = 0.0
    drop: bool = False  # "hold": never forward the held request
    after: int = 1 << 20  # "stop-reading": body bytes read before it stops
    hits: int = 0
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()

    def matches(self, method: str, path: str) -> bool:
        return (
            self.hits < self.count
            and re.fullmatch(self.method, method) is not None
            and re.search(self.path, path) is not None
        )


SLOWDOWN = (
    b"HTTP/1.1 503 Slow Down\r\nRetry-After: 1\r\nContent-Type: application/xml\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
)
BAD_DIGEST = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/xml\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
)
BAD_DIGEST_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>BadDigest</Code>'
    b"<Message>The CRC32 you specified did not match the calculated checksum.</Message></Error>"
)
SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


THROTTLED = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n%s\r\n"
)
WRITES = ("PUT", "POST", "DELETE")


@dataclass
class RateLimit:
    """Requests per second the store takes: reads (GET, HEAD) and writes (PUT, POST, DELETE)
    each from a bucket of ``burst`` seconds' worth of tokens, refilled continuously (0: no
    limit of that kind). Counts what it accepted and refused, by kind."""

    reads: float = 0.0
    writes: float = 0.0
    burst: float = 1.0  # seconds of the rate a bucket holds (the burst taken at once)
    accepted: dict[str, int] = field(default_factory=lambda: {"reads": 0, "writes": 0})
    refused: dict[str, int] = field(default_factory=lambda: {"reads": 0, "writes": 0})

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        now = time.monotonic()
        self._tokens = {"reads": self.reads * self.burst, "writes": self.writes * self.burst}
        self._at = {"reads": now, "writes": now}

    def take(self, method: str) -> bool:
        """Whether a request of ``method`` may go now (its token taken) or is refused."""
        kind = "writes" if method in WRITES else "reads"
        rate = self.writes if kind == "writes" else self.reads
        with self._lock:
            if rate <= 0:
                self.accepted[kind] += 1
                return True
            now = time.monotonic()
            room = rate * self.burst
            self._tokens[kind] = min(room, self._tokens[kind] + (now - self._at[kind]) * rate)
            self._at[kind] = now
            if self._tokens[kind] >= 1:
                self._tokens[kind] -= 1
                self.accepted[kind] += 1
                return True
            self.refused[kind] += 1
            return False

    def reset(self) -> None:
        """Full buckets and no counts (between two rounds of a benchmark), under the lock
        the proxy's threads take."""
        with self._lock:
            now = time.monotonic()
            for kind in ("reads", "writes"):
                self.accepted[kind] = self.refused[kind] = 0
                rate = self.writes if kind == "writes" else self.reads
                self._tokens[kind] = rate * self.burst
                self._at[kind] = now


def _read_head(sock: socket.socket, buf: bytearray) -> bytes | None:
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end])
    del buf[:end]
    return head


def _headers(head: bytes) -> dict[str, str]:
    out = {}
    for line in head.split(b"\r\n")[1:]:
        if b":" in line:
            k, v = line.split(b":", 1)
            out[k.strip().lower().decode()] = v.strip().decode()
    return out


def _read_body(sock: socket.socket, buf: bytearray, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out = bytearray()
        while True:
            while b"\r\n" not in buf:
                buf += sock.recv(65536)
            line_end = buf.index(b"\r\n")
            size = int(bytes(buf[:line_end]).split(b";")[0], 16)
            need = line_end + 2 + size + 2
            while len(buf) < need:
                buf += sock.recv(65536)
            out += buf[line_end + 2 : line_end + 2 + size]
            del buf[:need]
            if size == 0:  # no trailers: our clients send none
                return bytes(out)
    n = int(headers.get("content-length", "0"))
    while len(buf) < n:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    body = bytes(buf[:n])
    del buf[:n]
    return body


@dataclass
class FaultProxy:
    upstream_port: int
    faults: list[Fault] = field(default_factory=list)
    log: list[tuple[str, str, str]] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    ignore_expect: bool = False
    expected: list[str] = field(default_factory=list)
    limit: RateLimit | None = None

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closing = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def close(self) -> None:
        self._closing = True
        self._listener.close()
        with self._lock:
            for f in self.faults:  # connections held by a fault end now
                f.release()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.matches(method, path):
                    f.hits += 1
                    return f
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        buf = bytearray()
        try:
            while True:
                head = _read_head(client, buf)
                if head is None:
                    return
                method, path = head.split(b" ", 2)[:2]
                m, p = method.decode(), path.decode()
                fault = self._take(m, p)
                headers = _headers(head)
                if self.limit is not None and not self.limit.take(m):
                    self.log.append((m, p, "throttled"))
                    if not self._refuse(client, buf, m, headers):
                        return
                    continue
                if fault is not None and fault.kind == "silent":
                    self.log.append((m, p, "silent"))
                    fault.released.wait(fault.seconds or 600.0)
                    return
                if headers.get("expect", "").lower() == "100-continue":
                    self.expected.append(p)
                    if self.ignore_expect:  # wait for the body without a 100
                        self.log.append((m, p, "no-100"))
                    else:
                        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")  # as S3 does
                if fault is not None and fault.kind == "stop-reading":
                    # No receive window growing beyond this: the client's writes back up.
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
                    while len(buf) < fault.after:
                        chunk = client.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    self.log.append((m, p, "stop-reading"))
                    fault.released.wait(fault.seconds or 600.0)
                    return
                if fault is not None and fault.kind == "reset":
                    n = int(headers.get("content-length", "0"))
                    while len(buf) < n // 2:
                        buf += client.recv(65536)
                    self.log.append((m, p, "reset"))
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                body = _read_body(client, buf, headers)
                if len(body) < int(headers.get("content-length", "0")):
                    self.log.append((m, p, "gone"))  # the client gave up before its body
                    return
                if fault is not None and fault.kind == "corrupt" and body:
                    damaged = bytearray(body)
                    damaged[len(body) // 2] ^= 0xFF
                    body = bytes(damaged)
                crc = headers.get("x-amz-checksum-crc32")
                if crc is not None:
                    if base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode() != crc:
                        self.log.append((m, p, "bad-digest"))
                        client.sendall(BAD_DIGEST % (len(BAD_DIGEST_BODY), BAD_DIGEST_BODY))
                        return
                    self.checked.append(p)
                if fault is not None and fault.kind == "slowdown":
                    self.log.append((m, p, "slowdown"))
                    client.sendall(SLOWDOWN % (len(SLOWDOWN_BODY), SLOWDOWN_BODY))
                    return
                if fault is not None and fault.kind == "stall":
                    self.log.append((m, p, "stall"))
                    time.sleep(fault.seconds)
                elif fault is not None and fault.kind == "hold":
                    self.log.append((m, p, "hold"))
                    fault.released.wait(fault.seconds or 50.0)
                    if fault.drop:
                        return
                elif fault is not None and fault.kind == "corrupt":
                    self.log.append((m, p, "corrupt"))
                elif fault is not None and fault.kind == "stop-sending":
                    self.log.append((m, p, "stop-sending"))
                else:
                    self.log.append((m, p, "ok"))
                if upstream is None:
                    upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
                # The body is already here: no 100-continue dance, and no chunking upstream.
                lines = [
                    ln
                    for ln in head.split(b"\r\n")[:-2]
                    if not ln.lower().startswith(
                        (b"transfer-encoding", b"expect", b"content-length")
                    )
                ]
                if (method != b"HEAD" and method != b"GET") or body:
                    lines.append(b"Content-Length: %d" % len(body))
                upstream.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
                self._relay_response(upstream, client, m, fault)
                if fault is not None and fault.kind == "stop-sending":
                    return
        except OSError:
            return
        finally:
            client.close()
            if upstream is not None:
                upstream.close()

    @staticmethod
    def _refuse(
        client: socket.socket, buf: bytearray, method: str, headers: dict[str, str]
    ) -> bool:
        """Answer 503 SlowDown; whether the connection can go on (its body was read: a request
        that waits for a 100 Continue gets the answer instead, and the connection closes)."""
        waits = headers.get("expect", "").lower() == "100-continue"
        if not waits:
            _read_body(client, buf, headers)
        body = b"" if method == "HEAD" else SLOWDOWN_BODY
        close = b"Connection: close\r\n" if waits else b""
        client.sendall(THROTTLED % (len(body), close) + body)
        return not waits

    @staticmethod
    def _relay_response(
        upstream: socket.socket, client: socket.socket, method: str, fault: Fault | None = None
    ) -> None:
        ubuf = bytearray()
        while True:
            head = _read_head(upstream, ubuf)
            if head is None:
                raise OSError("upstream closed")
            if not head.split(b" ", 2)[1].startswith(b"1"):
                break  # skip interim 1xx responses
        headers = _headers(head)
        status = int(head.split(b" ", 2)[1])
        if method == "HEAD" or status in (204, 304):
            client.sendall(head)
            return
        body = _read_body(upstream, ubuf, headers)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            lines = [
                ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"transfer-encoding")
            ]
            head = b"\r\n".join(lines[:-2]) + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
        if fault is not None and fault.kind == "stop-sending":  # half of it, then nothing
            client.sendall(head + body[: len(body) // 2])
            fault.released.wait(fault.seconds or 600.0)
            return
        client.sendall(head + body)

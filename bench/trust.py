"""What a user trusts the gateway for, measured: the overwrite window and a store that does
not answer ``Expect: 100-continue`` (``make bench`` sections ``overwrite`` and ``expect``).

Overwrite window: ``latest.pt`` is durable in the bucket; it is saved again under the same
name (temp file, fsync, rename), and a thread HEADs the key every 20 ms until the new version
is durable. The window is the time the key was missing (the polls that found no object, each
counted for the time since the poll before it). Target: 0 (ARCHITECTURE.md, invariant 9).

Expect: the same file made durable through a proxy in front of the store that answers
``Expect: 100-continue``, and through one that ignores it, as some proxies, load balancers and
S3-compatible servers do (``ckptgw.store.faultproxy``): the gateway stops asking for it after its
first request there waits a second. Each side has its own gateway for all its runs, so the
rows are the steady state; what the first request cost is printed and kept in the samples.
Target: at most 1.2x.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from bench.common import BUCKET, Bench, say
from ckptgw.store.faultproxy import FaultProxy

POLL = 0.02  # seconds between two HEADs of the overwritten key


class Poller:
    """HEADs one key from a thread, every :data:`POLL` seconds; keeps (time, found)."""

    def __init__(self, b: Bench, key: str) -> None:
        self.s3, self.bucket, self.key = b.s3, BUCKET, key
        self.polls: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.s3.head_object(Bucket=self.bucket, Key=self.key)
                found = True
            except self.s3.exceptions.ClientError as e:
                if e.response["Error"]["Code"] not in ("404", "NoSuchKey"):
                    raise
                found = False
            self.polls.append((time.perf_counter(), found))
            time.sleep(POLL)

    def stop(self) -> tuple[float, int, int]:
        """(seconds the key was missing, polls that missed it, polls in all)."""
        self._stop.set()
        self._thread.join(30)
        pairs = zip(self.polls, self.polls[1:], strict=False)
        missing = sum(t - before for (before, _), (t, found) in pairs if not found)
        misses = sum(not found for _, found in self.polls)
        return missing, misses, len(self.polls)


def write_synced(path: Path, size: int, seed: bytes) -> None:
    """``size`` bytes (no two files alike) written and fsynced, as a save leaves them."""
    block = os.urandom(16 << 20)
    with path.open("wb") as f:
        f.write(seed)
        for off in range(len(seed), size, len(block)):
            f.write(block[: min(len(block), size - off)])
        f.flush()
        os.fsync(f.fileno())


def overwrite_rounds(b: Bench, size: int) -> dict[str, list[float]]:
    """Per run: the time to durable of the new version (from the rename's return), the time
    its key was missing meanwhile, and the polls that missed it."""
    s: dict[str, list[float]] = {"durable": [], "missing": [], "misses": [], "polls": []}
    with b.node() as gw:
        target = gw.mountpoint / "run" / "latest.pt"
        target.parent.mkdir()
        key = "gw/run/latest.pt"
        write_synced(target, size, b"v0")
        b.wait_durable(gw, {key: size})
        for i in range(b.runs + 1):  # the first round warms up and is not counted
            poller = Poller(b, key)
            tmp = target.with_name("latest.pt.tmp")
            write_synced(tmp, size, f"v{i + 1}".encode())
            os.rename(tmp, target)
            t0 = time.perf_counter()
            b.wait_durable(gw, {key: size})
            durable = time.perf_counter() - t0
            missing, misses, polls = poller.stop()
            say(
                f"  run {i}{' (warm-up)' if not i else ''}: new version durable after "
                f"{durable:6.2f} s; key missing for {missing:5.2f} s ({misses} of {polls} HEADs)"
            )
            if i:
                s["durable"].append(durable)
                s["missing"].append(missing)
                s["misses"].append(misses)
                s["polls"].append(polls)
    b.delete("gw/run/")
    return s


def expect_rounds(b: Bench, size: int) -> dict[str, list[float]]:
    """Per run, on each side (a proxy answering ``Expect: 100-continue``, one ignoring it):
    the time to durable of a fresh file from its fsync's return. Sides alternate."""
    port = int(b.endpoint.rsplit(":", 1)[1])
    proxies = {"answers": FaultProxy(port), "ignores": FaultProxy(port, ignore_expect=True)}
    s: dict[str, list[float]] = {"answers": [], "ignores": [], "first_ignores": []}
    try:
        with (
            b.node("--endpoint-url", proxies["answers"].url) as answers,
            b.node("--endpoint-url", proxies["ignores"].url) as ignores,
        ):
            gws = {"answers": answers, "ignores": ignores}
            for i in range(b.runs + 1):  # the first round warms up: the ignoring side learns
                got: dict[str, float] = {}
                order = ("answers", "ignores") if i % 2 else ("ignores", "answers")
                for side in order:
                    gw = gws[side]
                    path = gw.mountpoint / side / f"step_{i}.bin"
                    path.parent.mkdir(exist_ok=True)
                    write_synced(path, size, f"{side}{i}".encode())
                    t0 = time.perf_counter()
                    b.wait_durable(gw, {f"gw/{side}/step_{i}.bin": size})
                    got[side] = time.perf_counter() - t0
                    path.unlink()
                    b.wait_store_ops(gw)
                say(
                    f"  run {i}{' (warm-up: the first request learns)' if not i else ''}: "
                    f"durable after {got['answers']:6.2f} s with Expect answered, "
                    f"{got['ignores']:6.2f} s with it ignored"
                )
                if i:
                    s["answers"].append(got["answers"])
                    s["ignores"].append(got["ignores"])
                else:
                    s["first_ignores"].append(got["ignores"])
        if not proxies["ignores"].expected:
            raise RuntimeError("the gateway never asked the ignoring proxy for 100-continue")
    finally:
        for p in proxies.values():
            p.close()
    return s

"""Many gateways, one bucket: a fleet saving one step at once, and restoring it, behind a store
that takes only so many requests a second.

N gateways run on this machine, each a real mount with its own cache dir, all on one moto
server behind the project's rate-limiting proxy (:class:`ckptgw.store.faultproxy.RateLimit`: token
buckets for writes and reads, one second's worth each, 503 SlowDown without Retry-After when
empty, as S3 answers a burst above a prefix's rate).

Save (``saves`` rounds, the first on freshly mounted gateways that know nothing of the store,
the later ones with what they learned): every gateway writes ``files`` files of ``size`` bytes
into the same step directory at once (one writer per gateway, as one rank per node); rank 0
adds the step's ``.metadata``. Measured from the start of the writes until every gateway says
its files are durable (then checked in the bucket, listed from moto directly), against the
**bound**: the write requests the proxy accepted divided by the write rate (no fleet can be
durable sooner, but for the bucket's first second's worth).
Also: the share of requests refused (reads and writes), and every object read back and
compared with what was written (lost: missing or different).

Restore: N fresh gateways (empty cache dirs) mount the bucket; each reads its own rank's
shards and the shared ``.metadata`` of the last step, at once; against the read bound (read
requests accepted over the read rate), the share refused, and every byte compared.

With ``compare``, one more save round runs on gateways with ``store.adaptive_rate = false``
(only retries with backoff): the fleet as it behaved before pacing.

    python -m bench.suite --only fleet [--fleet 8,16] [--fleet-files 32] [--fleet-rate 50]
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from bench.common import BUCKET, Bench, say
from ckptgw.fsops.passthrough import DAEMON
from ckptgw.gateway.harness import Gateway
from ckptgw.store.faultproxy import FaultProxy, RateLimit

PREFIX = "fleet/"
READ_SHARE = 5500 / 3500  # S3's reads per second per prefix over its writes


@dataclass(frozen=True)
class Plan:
    gateways: int
    files: int  # per gateway, each ``size`` bytes
    size: int
    write_rate: float  # requests per second the store takes (all gateways together)
    saves: int = 2
    compare: bool = True

    @property
    def read_rate(self) -> float:
        return self.write_rate * READ_SHARE


def _content(step: int, rank: int, n: int, size: int) -> bytes:
    return random.Random(f"{step}/{rank}/{n}").randbytes(size)


def _names(plan: Plan, rank: int) -> list[str]:
    names = [f"rank{rank:02d}_{n:03d}.distcp" for n in range(plan.files)]
    return [*names, ".metadata"] if rank == 0 else names


def _expected(plan: Plan, step: int) -> dict[str, bytes]:
    out = {}
    for rank in range(plan.gateways):
        for n, name in enumerate(_names(plan, rank)):
            out[f"{PREFIX}step_{step}/{name}"] = _content(step, rank, n, plan.size)
    return out


@contextmanager
def _fleet(
    b: Bench, plan: Plan, proxy: FaultProxy, tag: str, adaptive: bool
) -> Iterator[list[Gateway]]:
    """``plan.gateways`` gateways on fresh nodes, always unmounted after."""
    config = b.work / f"fleet-{tag}.toml"
    config.write_text(f"[store]\nadaptive_rate = {'true' if adaptive else 'false'}\n")
    with ExitStack() as stack:
        gateways = []
        for rank in range(plan.gateways):
            root = b.work / f"fleet-{tag}-{rank}"
            gw = Gateway(
                root / "mnt",
                root / "cache",
                f"s3://{BUCKET}/{PREFIX}",
                "--endpoint-url",
                proxy.url,
                "--config",
                str(config),
                *(["--no-passthrough"] if b.path == DAEMON else []),
                env={"CKPTGW_RUNTIME_DIR": str(b.work / "run")},
            )
            stack.callback(gw.stop)
            gw.start()
            gateways.append(gw)
        yield gateways


def _together(jobs: list[Any]) -> None:
    """Run the callables at once (one thread each), from a common start; re-raise a failure."""
    start = threading.Barrier(len(jobs))
    errors: list[BaseException] = []

    def run(job: Any) -> None:
        start.wait()
        try:
            job()
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _wait_durable(b: Bench, gateways: list[Gateway], step: int, want: dict[str, bytes]) -> float:
    """Until every gateway says its step directory is durable (a ``pending`` request on its
    control socket, answered once nothing is pending: no polling, which would load the one
    moto server the fleet shares), then until the bucket, listed from moto directly, holds
    every key of ``want`` with its size; returns the time (perf_counter) of the last word."""
    said: list[float] = []

    def wait(gw: Gateway) -> Any:
        mount = gw.control()  # here: it sets the environment for a moment, not thread-safe

        def job() -> None:
            while mount.request("pending", paths=[f"step_{step}"], wait=30)["count"]:
                pass
            said.append(time.perf_counter())

        return job

    _together([wait(gw) for gw in gateways])
    prefix = f"{PREFIX}step_{step}/"
    deadline = time.monotonic() + 120
    while True:  # the gateways' word, checked
        have = b.keys(prefix)
        if all(have.get(k) == len(v) for k, v in want.items()):
            return max(said)
        if time.monotonic() > deadline:
            missing = sorted(k for k in want if k not in have)
            raise RuntimeError(f"the gateways said durable, the bucket lacks {len(missing)}")
        time.sleep(0.5)


def _lost(b: Bench, want: dict[str, bytes]) -> int:
    """Objects missing from the bucket or not byte-exact."""
    lost = 0
    for key, data in want.items():
        try:
            body = b.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        except Exception:  # a missing object: counted, not raised
            body = None
        lost += body != data
    return lost


def _counts(limit: RateLimit) -> dict[str, int]:
    return {
        "writes": limit.accepted["writes"],
        "reads": limit.accepted["reads"],
        "refused_writes": limit.refused["writes"],
        "refused_reads": limit.refused["reads"],
    }


def _save(
    b: Bench, plan: Plan, gateways: list[Gateway], limit: RateLimit, step: int
) -> dict[str, Any]:
    want = _expected(plan, step)
    limit.reset()

    def writer(rank: int, gw: Gateway) -> Any:
        def job() -> None:
            d = gw.mountpoint / f"step_{step}"
            d.mkdir(exist_ok=True)
            for n, name in enumerate(_names(plan, rank)):
                (d / name).write_bytes(_content(step, rank, n, plan.size))

        return job

    t0 = time.perf_counter()
    _together([writer(rank, gw) for rank, gw in enumerate(gateways)])
    saved = time.perf_counter() - t0
    durable = _wait_durable(b, gateways, step, want) - t0
    counts = _counts(limit)
    paces = [gw.status()["store_requests"]["pacing"]["writes"]["rate"] for gw in gateways]
    return {
        "seconds": durable,
        "saved": saved,
        "bound": counts["writes"] / plan.write_rate,
        **counts,
        "objects": len(want),
        "lost": _lost(b, want),
        "rates": paces,
    }


def _restore(
    b: Bench, plan: Plan, proxy: FaultProxy, limit: RateLimit, step: int
) -> dict[str, Any]:
    want = _expected(plan, step)
    with _fleet(b, plan, proxy, f"restore{step}", adaptive=True) as gateways:
        limit.reset()
        wrong: list[str] = []

        def reader(rank: int, gw: Gateway) -> Any:
            def job() -> None:
                d = gw.mountpoint / f"step_{step}"
                names = [*_names(plan, rank)] + ([] if rank == 0 else [".metadata"])
                for name in names:
                    key = f"{PREFIX}step_{step}/{name}"
                    if (d / name).read_bytes() != want[key]:
                        wrong.append(key)

            return job

        t0 = time.perf_counter()
        _together([reader(rank, gw) for rank, gw in enumerate(gateways)])
        seconds = time.perf_counter() - t0
        counts = _counts(limit)
    return {
        "seconds": seconds,
        "bound": counts["reads"] / plan.read_rate,
        **counts,
        "objects": plan.gateways * plan.files + plan.gateways,
        "lost": len(wrong),
    }


def fleet_rounds(b: Bench, plan: Plan) -> dict[str, Any]:
    """The saves (the first on fresh gateways), the restore, and with ``plan.compare`` one save
    without pacing; each round's figures."""
    limit = RateLimit(reads=plan.read_rate, writes=plan.write_rate)
    proxy = FaultProxy(int(b.endpoint.rsplit(":", 1)[1]), limit=limit)
    out: dict[str, Any] = {"saves": [], "restore": None, "unpaced": None}
    try:
        with _fleet(b, plan, proxy, "save", adaptive=True) as gateways:
            for step in range(1, plan.saves + 1):
                r = _save(b, plan, gateways, limit, step)
                out["saves"].append(r)
                say(_said(f"save {step}", r))
        out["restore"] = r = _restore(b, plan, proxy, limit, plan.saves)
        say(_said("restore", r, "reads"))
        if plan.compare:
            with _fleet(b, plan, proxy, "unpaced", adaptive=False) as gateways:
                step = plan.saves + 1
                out["unpaced"] = r = _save(b, plan, gateways, limit, step)
                say(_said("save without pacing", r))
    finally:
        proxy.close()
    return out


def refused_share(r: dict[str, Any]) -> float:
    refused = r["refused_writes"] + r["refused_reads"]
    total = refused + r["writes"] + r["reads"]
    return refused / total if total else 0.0


def _said(what: str, r: dict[str, Any], kind: str = "writes") -> str:
    return (
        f"  {what}: {r['seconds']:.2f} s against a bound of {r['bound']:.2f} s "
        f"({r['seconds'] / r['bound']:.2f}x; {r[kind]} {kind} accepted), "
        f"{100 * refused_share(r):.1f} % of requests refused "
        f"({r['refused_writes']} writes, {r['refused_reads']} reads), "
        f"{r['lost']} of {r['objects']} objects lost"
    )

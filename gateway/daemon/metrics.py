"""The optional Prometheus endpoint (``[metrics] listen``).

Served from the daemon's own trio loop, so a scrape reads the drain's counters on the thread
that writes them: no locks, no copies. Every metric carries the ``mountpoint`` label, so
several gateways on one node can be told apart.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ckptgw.gateway.daemon.status import Reporter

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class GatewayCollector(Collector):
    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter

    def collect(self) -> Iterator[Metric]:
        r = self.reporter
        st = r.status()
        labels = ["mountpoint"]
        mp = [str(r.mountpoint)]

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(f"ckptgw_{name}", doc, labels=labels)
            m.add_metric(mp, value)
            return m

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            m = GaugeMetricFamily(f"ckptgw_{name}", doc, labels=labels)
            m.add_metric(mp, value)
            return m

        cache: dict[str, Any] = st["cache"]
        yield counter(
            "written_bytes",
            "Bytes written to the mount",
            st["written_bytes"],
        )
        yield counter("fsyncs", "fsync requests answered", st["fsyncs"])
        nfs = st.get("nfs")
        yield gauge(
            "nfs_serving",
            "1 while the mount's NFS export is served (ckptgw serve nfs)",
            1 if nfs and nfs["state"] == "serving" else 0,
        )
        if nfs:
            yield gauge("nfs_clients", "NFS clients connected now", len(nfs["connected"]))
            yield counter("nfs_restarts", "NFS-Ganesha restarts after it exited", nfs["restarts"])
        path = st["data_path"]
        yield gauge(
            "passthrough",
            "1 if the kernel reads and writes cache files",
            path["mode"] == "passthrough",
        )
        yield counter("passthrough_opens", "Opens served by the kernel", path["passthrough_opens"])
        yield counter(
            "daemon_opens", "Opens whose bytes go through the daemon", path["daemon_opens"]
        )
        yield counter(
            "daemon_written_bytes", "Bytes written through the daemon", path["daemon_bytes"]
        )
        yield counter("drained_bytes", "Bytes sent to the store", st["drained"]["bytes"])
        yield counter("drained_files", "Uploads completed", st["drained"]["files"])
        yield gauge("dirty_bytes", "Bytes only in this node's cache", st["dirty_bytes"])
        yield gauge("queue_files", "Dirty files ready to drain", st["queue"]["files"])
        yield gauge("queue_bytes", "Bytes of dirty files ready to drain", st["queue"]["bytes"])
        yield gauge(
            "oldest_dirty_age_seconds",
            "How long the oldest dirty file has waited",
            st["queue"]["oldest_dirty_age"] or 0.0,
        )
        yield gauge(
            "replacing_files",
            "Files whose new version drains while the store keeps the previous one",
            st["queue"]["replacing"],
        )
        yield counter(
            "lost_wakeups",
            "Dirty, quiet files the drain had not queued, found and queued by its audit (bugs)",
            st["queue"]["lost_wakeups"],
        )
        yield from _checkpoint_exposure(st["checkpoints"], labels, mp)
        yield gauge("uploads_in_progress", "Uploads under way", len(st["uploads"]))
        yield counter("store_retries", "Store calls retried", st["retries"])
        errors = CounterMetricFamily(
            "ckptgw_store_errors", "Failed store calls by kind", labels=[*labels, "kind"]
        )
        for kind, n in sorted(st["errors"].items()):
            errors.add_metric([*mp, kind], n)
        yield errors
        yield from _endpoint_metrics(st.get("store_requests"), labels, mp)
        lookups = st.get("lookups")
        if lookups:
            yield gauge(
                "lookups_stalled",
                "1 while a listing or description a lookup needs is past store.lookup_wait",
                lookups["stalled_since"] is not None,
            )
            yield counter(
                "lookups_from_journal",
                "Lookups and opendirs answered from the journal after store.lookup_wait",
                lookups["from_journal"],
            )
            yield counter(
                "lookup_stalls",
                "Times lookups began to wait on a stalled store",
                lookups["episodes"],
            )
        hist = r.engine.drained.part_seconds
        h = HistogramMetricFamily(
            "ckptgw_upload_part_seconds", "Time per uploaded part or single PUT", labels=labels
        )
        h.add_metric(
            mp,
            [("+Inf" if b == float("inf") else repr(b), n) for b, n in hist.cumulative()],
            hist.total,
        )
        yield h
        yield gauge("cache_used_bytes", "Bytes the cache files hold", cache["used"])
        yield gauge(
            "cache_limit_bytes",
            "The most the cache files may hold: cache.size, or where it is unset the cache "
            "disk's size less cache.reserve",
            cache["limit"] if cache["limit"] is not None else r.fs.space.capacity(),
        )
        yield gauge("cache_free_bytes", "Room for new data", cache["free"])
        yield counter("evictions", "Clean files evicted from the cache", cache["evictions"])
        yield counter("evicted_bytes", "Bytes evicted from the cache", cache["evicted_bytes"])
        yield counter("write_waits", "Writes that waited for the drain", cache["write_waits"])
        yield counter("enospc", "Writes refused for lack of room", cache["enospc"])
        yield counter("fetched_bytes", "Bytes read through from the store", st["fetched"]["bytes"])
        yield counter(
            "fetch_requests", "Ranged GETs that read files through", st["fetched"]["requests"]
        )
        pf = r.prefetcher.stats if r.prefetcher is not None else None
        yield counter("prefetched_files", "Files fetched by warm-ups", pf.files if pf else 0)
        yield counter("prefetched_bytes", "Bytes fetched by warm-ups", pf.bytes if pf else 0)
        yield counter(
            "prefetch_skipped_files",
            "Files a warm-up left out: they did not fit in the cache",
            pf.skipped_files if pf else 0,
        )
        yield gauge(
            "warmups_running",
            "Warm-ups listing or fetching now",
            sum(w["phase"] != "done" for w in st["warmups"]),
        )
        yield gauge(
            "emergency_drain",
            "1 while draining for shutdown or preemption",
            st["mode"] != "serving",
        )


def _checkpoint_exposure(
    rows: list[dict[str, Any]], labels: list[str], mp: list[str]
) -> Iterator[Metric]:
    """What each checkpoint has only on this node and for how long: one series per
    checkpoint that is not durable (few: those being saved or drained), none once it is."""
    names = [*labels, "checkpoint"]
    local = GaugeMetricFamily(
        "ckptgw_checkpoint_local_bytes",
        "Bytes of a checkpoint only on this node (its files' content the store lacks)",
        labels=names,
    )
    held = GaugeMetricFamily(
        "ckptgw_checkpoint_local_age_seconds",
        "How long the oldest content of a checkpoint the store lacks has been only on this node",
        labels=names,
    )
    for c in rows:
        if c["local_bytes"] or c.get("local_age") is not None:
            local.add_metric([*mp, c["path"]], c["local_bytes"])
            held.add_metric([*mp, c["path"]], c.get("local_age") or 0.0)
    yield local
    yield held


def _endpoint_metrics(
    view: dict[str, Any] | None, labels: list[str], mp: list[str]
) -> Iterator[Metric]:
    """The S3 endpoint's requests (Store.requests_view), labelled with the endpoint (a URL
    without credentials), never with a request's key: one series per endpoint."""
    if not view:
        return
    names, values = [*labels, "endpoint"], [*mp, str(view["endpoint"])]

    def one(
        family: type[GaugeMetricFamily | CounterMetricFamily], name: str, doc: str, v: float
    ) -> Metric:
        m = family(f"ckptgw_store_{name}", doc, labels=names)
        m.add_metric(values, v)
        return m

    stalled = [q for q in view["requests"] if q["stalled"]]
    yield one(
        GaugeMetricFamily,
        "requests_in_flight",
        "Requests to the store in flight",
        view["in_flight"],
    )
    yield one(
        GaugeMetricFamily,
        "requests_stalled",
        "Requests in flight without progress for store.stall_warning seconds or more",
        view["stalled"],
    )
    yield one(
        GaugeMetricFamily,
        "stalled_seconds",
        "The longest a request in flight has gone without progress, among the stalled ones",
        max((q["idle"] for q in stalled), default=0.0),
    )
    yield one(
        CounterMetricFamily, "stalls", "Requests that stalled (each counted once)", view["stalls"]
    )
    yield one(
        GaugeMetricFamily,
        "expect_continue",
        "1 while PUTs and parts ask Expect: 100-continue (0: the endpoint left one unanswered)",
        1 if view["expect_continue"] else 0,
    )
    pacing = view.get("pacing")
    if pacing:
        yield from _pacing_metrics(pacing, names, values)


def _pacing_metrics(
    pacing: dict[str, Any], names: list[str], values: list[str]
) -> Iterator[Metric]:
    """This gateway's pace of reads and writes (ckptgw.store.pacing), labelled with the kind."""
    names = [*names, "kind"]
    families = (
        (
            GaugeMetricFamily,
            "rate_limit",
            "Requests per second this gateway allows itself "
            "after the store refused some as too many (-1: not limited)",
            "rate",
        ),
        (CounterMetricFamily, "refused", "Requests the store refused as too many", "refused"),
        (
            GaugeMetricFamily,
            "refused_last_minute",
            "Refusals as too many in the last minute",
            "refused_per_minute",
        ),
        (CounterMetricFamily, "rate_cuts", "Times the pace was cut after a refusal", "cuts"),
        (GaugeMetricFamily, "requests_waiting", "Requests waiting for their turn", "waiting"),
        (CounterMetricFamily, "wait_seconds", "Seconds requests waited for their turn", "waited"),
    )
    for family, name, doc, field in families:
        m = family(f"ckptgw_store_{name}", doc, labels=names)
        for kind in ("reads", "writes"):
            v = pacing[kind][field]
            m.add_metric([*values, kind], -1.0 if v is None else float(v))
        yield m


class MetricsServer:
    def __init__(self, reporter: Reporter, host: str, port: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(GatewayCollector(reporter))
        self.host, self.port = host, port

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        except OSError as e:
            log.error("cannot serve metrics on %s:%d: %s", self.host, self.port, e.strerror)
            task_status.started()
            return
        log.info("serving metrics on http://%s:%d/metrics", self.host, self.port)
        task_status.started()
        await trio.serve_listeners(self._serve, listeners)

    async def _serve(self, stream: trio.SocketStream) -> None:
        async with stream:
            head = bytearray()
            with trio.move_on_after(10), contextlib.suppress(trio.BrokenResourceError):
                while b"\r\n\r\n" not in head and len(head) < 16384:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    head += chunk
            parts = bytes(head).split(b" ", 2)
            if (
                len(parts) >= 2
                and parts[0] in (b"GET", b"HEAD")
                and parts[1].split(b"?")[0]
                in (
                    b"/metrics",
                    b"/",
                )
            ):
                body = generate_latest(self.registry)
                status, ctype = "200 OK", CONTENT_TYPE
                if parts[0] == b"HEAD":
                    body = b""
            else:
                body, status, ctype = b"not found\n", "404 Not Found", "text/plain"
            reply = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode() + body
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(reply)

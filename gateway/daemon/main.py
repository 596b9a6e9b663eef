"""The gateway process: lock the cache dir, recover, mount, serve in one trio loop, shut down.

``ckptgw mount`` without ``--foreground`` starts this same code in a new session and waits on
a pipe (``CKPTGW_READY_FD``) for one line: ``ok`` once the mount is ready, or ``error: ...``.
In front, readiness also goes to systemd (``NOTIFY_SOCKET``) when there is one.

One nursery holds the FUSE loop, the drain, read-through, the control socket, and optionally
the metrics endpoint and the preemption watcher. SIGTERM (or SIGINT) does not stop the
gateway at once: it keeps serving (the trainer may be writing its emergency checkpoint),
drains everything newest first, and exits once nothing is dirty or at ``shutdown.deadline``,
logging every file that is not in the store. A second signal stops it at once. Whatever is
left stays in the journal and drains at the next mount of the same cache.
"""

from __future__ import annotations

import dataclasses
import errno
import inspect
import logging
import logging.handlers
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pyfuse3
import trio

from ckptgw.drain.checkpoints import FileView, Recognizer
from ckptgw.drain.reads.entries import Entries
from ckptgw.drain.reads.fetch import Fetcher
from ckptgw.drain.reads.listing import Listings
from ckptgw.drain.reads.lookupwait import LookupWait
from ckptgw.drain.reads.prefetch import Prefetcher
from ckptgw.drain.reads.readthrough import ReadThrough
from ckptgw.drain.retention.lifecycle import Lifecycle
from ckptgw.drain.uploads.engine import DrainEngine
from ckptgw.drain.uploads.scheduler import Scheduler
from ckptgw.fsops.filesystem import Filesystem
from ckptgw.fsops.journal import JournalError
from ckptgw.fsops.objectmeta import PART_SIZE
from ckptgw.gateway import registry
from ckptgw.gateway.cachedir import CacheDirLock, space_problem
from ckptgw.gateway.client import entries
from ckptgw.gateway.config import Config
from ckptgw.gateway.daemon.control import ControlServer, RequestError, socket_path
from ckptgw.gateway.daemon.preemption import PreemptionWatcher
from ckptgw.gateway.daemon.status import PathError, Reporter
from ckptgw.gateway.errors import UserError
from ckptgw.gateway.mountpoint import prepare_mountpoint
from ckptgw.gateway.protocol import Readiness, wait_seconds
from ckptgw.gateway.storecheck import explain, may_come_right
from ckptgw.gateway.storeplace import local_store, local_store_problem, local_store_warning
from ckptgw.store.crc import CRC32_IMPL
from ckptgw.store.deadlines import CHECK_ANSWER
from ckptgw.store.interface import StoreError
from ckptgw.store.open import open_store
from ckptgw.store.pacing import Pacing
from ckptgw.store.retry import RetryingStore, RetryPolicy, RetryStats
from ckptgw.store.url import without_userinfo

log = logging.getLogger("ckptgw")


def setup_logging(cfg: Config) -> Path:
    """Log to <cache_dir>/ckptgw.log, and to stderr in front (systemd's journal reads it)."""
    root = logging.getLogger()
    root.setLevel(cfg.log_level.upper())
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = cfg.log_path
    _claim_log(path)
    fh = logging.handlers.RotatingFileHandler(path, maxBytes=16 << 20, backupCount=3)
    fh.setFormatter(fmt)
    root.addHandler(fh)
    for noisy in ("aiohttp", "aiobotocore", "botocore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    if cfg.foreground and sys.stderr is not None:
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(logging.Formatter("ckptgw: %(levelname)s %(message)s"))
        root.addHandler(sh)
    return path


def _claim_log(path: Path) -> None:
    """Make the log file ours and private before logging to it. It must not be a symbolic link
    or someone else's file: a daemon running as root that followed a link planted in a shared
    directory (``--log-file /tmp/...``) would append to, and chmod, whatever it points at."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        why = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise UserError(f"log file {path}: {why}; choose another --log-file") from None
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            raise UserError(
                f"log file {path} belongs to uid {owner}, not to you; choose another --log-file"
            )
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def mount_options(cfg: Config) -> set[str]:
    opts = set(pyfuse3.default_options) | {"default_permissions", "fsname=ckptgw"}
    opts.add("subtype=ckptgw")
    if cfg.allow_other:
        opts.add("allow_other")
    return opts


def run(cfg: Config) -> int:
    """Serve until unmounted or signalled. Returns the process exit code."""
    ready = Readiness()
    os.umask(0o077)  # journal, log and cache files are private to the gateway's user
    if local_store(cfg.store) is not None and not cfg.allow_local_store:
        ready.failed(msg := local_store_problem(cfg.store, cfg.cache_dir))
        raise UserError(msg)
    try:
        lock = CacheDirLock(cfg.cache_dir)
    except UserError as e:
        ready.failed(str(e))
        raise
    try:
        setup_logging(cfg)
        log.info(
            "starting: mountpoint=%s store=%s cache=%s", cfg.mountpoint, cfg.store, cfg.cache_dir
        )
        return _run_locked(cfg, ready)
    except UserError as e:
        log.error("%s", e)
        ready.failed(str(e))
        raise
    except BaseException as e:
        log.exception("gateway failed")
        ready.failed(f"gateway failed: {e!r}; see {cfg.log_path}")
        raise
    finally:
        lock.release()


def _run_locked(cfg: Config, ready: Readiness) -> int:
    problem = space_problem(cfg.cache_dir, cfg.reserve_bytes, cfg.cache_size)
    if problem is not None and problem.fatal:
        raise UserError(str(problem))
    prepare_mountpoint(cfg.mountpoint)
    # The drain's scheduler is what the filesystem reports to (fsops.events.DrainEvents);
    # it needs nothing to exist, so it comes first.
    scheduler = Scheduler(cfg.schedule())
    try:
        fs = Filesystem(
            cfg.cache_dir,
            cfg.fs_options(),
            scheduler,
        )
    except JournalError as e:
        raise UserError(str(e)) from None
    rec = fs.recovery
    if rec.unclean:
        log.warning(
            "recovered after an unclean shutdown: %d sizes fixed, %d orphans and %d stray cache "
            "files removed, %d files lost",
            rec.sizes_fixed,
            rec.orphans_removed,
            rec.stray_removed,
            rec.lost,
        )
    log.info(
        "journal holds %d entries not in the store (%d bytes)", rec.dirty_files, rec.dirty_bytes
    )
    problem = space_problem(
        cfg.cache_dir, cfg.reserve_bytes, cfg.cache_size, fs.journal.cached_bytes()
    )
    if problem is not None:
        log.warning("%s", problem)
    warnings = [str(problem)] if problem is not None else []
    if local_store(cfg.store) is not None:
        warnings.append(local_store_warning(cfg.store))
        log.warning("%s", warnings[-1])
    if CRC32_IMPL != "zlib-ng":
        log.warning(
            "zlib-ng is not installed: the CRC32 of every byte uploaded is zlib's, about 3.5x "
            "the CPU (pip install zlib-ng)"
        )
    mount = _Mount(cfg, "; ".join(warnings) or None)
    try:
        trio.run(_serve, fs, scheduler, cfg, ready, mount)
    except BaseExceptionGroup as group:  # a task's UserError, in the nursery's group
        users, rest = group.split(UserError)
        if users is None or rest is not None:
            raise
        raise _first(users) from None
    finally:
        mount.close()
        fs.close()
    log.info("stopped cleanly")
    return 0


def _first(group: BaseExceptionGroup[UserError]) -> UserError:
    e = group.exceptions[0]
    return _first(e) if isinstance(e, BaseExceptionGroup) else e


class _Mount:
    """The FUSE mount and its registry entry; made once the request handlers exist."""

    def __init__(self, cfg: Config, warning: str | None) -> None:
        self.cfg = cfg
        self.warning = warning  # said to whoever mounts, with any other warning
        self.mounted = False
        self.signalled = False  # after a signal we unmount ourselves
        self.control = socket_path(cfg.cache_dir)

    def open(self, operations: pyfuse3.Operations) -> None:
        cfg = self.cfg
        try:
            pyfuse3.init(operations, str(cfg.mountpoint), mount_options(cfg))
        except RuntimeError as e:
            raise UserError(f"cannot mount on {cfg.mountpoint}: {e}") from None
        self.mounted = True
        registry.register(
            registry.Entry(
                str(cfg.mountpoint),
                str(cfg.cache_dir),
                str(cfg.store),
                os.getpid(),
                str(self.control),
            )
        )

    def close(self) -> None:
        if self.mounted:
            # After `fusermount3 -u` the kernel already unmounted; after a signal we do.
            pyfuse3.close(unmount=self.signalled)
            registry.unregister(self.cfg.mountpoint)
            self.mounted = False


async def check_store(
    store: RetryingStore, cfg: Config, ready: Readiness | None = None
) -> str | None:
    """Fail the mount (UserError) on a store error only the user can fix; a one-line warning
    for one that may pass (the drain keeps retrying, so fixing it needs no remount). What may
    be a node still starting (no credentials from the instance role yet, no network) is
    checked again for up to ``MOUNT_PATIENCE`` seconds before the mount fails.

    Each try is held to the store's deadlines (an S3 store answers its check within
    ``deadlines.CHECK_ANSWER`` seconds or the try fails), so a store that accepts connections
    and never answers costs a mount about half a minute, not minutes; a check not done
    within ``CHECK_NOTICE`` seconds is said, with what it waits for, in the log and to
    ``ckptgw mount`` (``ready``), which prints it."""
    deadline = trio.current_time() + MOUNT_PATIENCE
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_check_notices, store, cfg, ready)
        try:
            return await _check_store(store, cfg, deadline)
        finally:
            nursery.cancel_scope.cancel()


CHECK_NOTICE = 3.0  # seconds of a store check before the mount says what it waits for


async def _check_notices(store: RetryingStore, cfg: Config, ready: Readiness | None) -> None:
    """While the check goes on: what it waits for, every ``CHECK_NOTICE`` seconds."""
    while True:
        await trio.sleep(CHECK_NOTICE)
        view = store.requests_view() or {}
        where = f" at {view['endpoint']}" if view.get("endpoint") else ""
        doing = ""
        for r in view.get("requests", []):
            if r["what"].startswith("checking"):
                doing = f": {r['phase']} for {r['idle']:.0f} s"
        attempts = MOUNT_CHECK.attempts
        now = sum(store.stats.errors.values()) % attempts + 1
        answer = min(cfg.first_byte_timeout, CHECK_ANSWER)
        line = (
            f"checking the store {cfg.store}{where}{doing} (try {now} of {attempts}, each "
            f"waits up to {answer:g} s for an answer)"
        )
        log.info("%s", line)
        if ready is not None:
            ready.progress(line)


async def _check_store(store: RetryingStore, cfg: Config, deadline: float) -> str | None:
    while True:
        try:
            await store.with_policy(MOUNT_CHECK).check()
            return None
        except StoreError as e:
            message, yours = explain(e, cfg.store, cfg.endpoint_url)
            wait = yours and trio.current_time() < deadline
            if wait and await trio.to_thread.run_sync(may_come_right, e, cfg.endpoint_url):
                log.info("%s; checking again (the node may still be starting)", message)
                await trio.sleep(2.0)
                continue
            if yours:
                raise UserError(f"{message}; not mounted") from None
            msg = f"{message}; data stays in the cache until this is fixed"
            log.warning("%s", msg)
            return msg


MOUNT_CHECK = RetryPolicy(attempts=3, base=0.2, cap=2.0, refusals=3)
STORE_CHECKPOINTS_TTL = 60.0  # seconds the store's checkpoints shown by status are reused
MOUNT_PATIENCE = 30.0  # seconds a mount waits for credentials or a network that may come
# on the path of a lookup, which someone waits for: few tries, refusals as too many included
LISTING = RetryPolicy(attempts=3, base=0.05, cap=1.0, refusals=3)


async def _read_through(
    fs: Filesystem,
    store: RetryingStore,
    cfg: Config,
    *,
    task_status: trio.TaskStatus[
        tuple[Fetcher, Prefetcher, ReadThrough]
    ] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve files that are only in the store: listings merged into the namespace, fetches."""
    listing_store = store.with_policy(LISTING)  # on the path of a lookup: few attempts
    entries = Entries(fs.parts, store, cfg.listing_ttl, lookup_store=listing_store)
    # A lookup waits for those few attempts no longer than lookup_wait (drain.reads.lookupwait).
    waits = LookupWait(cfg.lookup_wait, _store_where(cfg))
    listings = Listings(
        fs.parts,
        entries,
        listing_store,
        cfg.listing(),
        waits,
    )
    fetcher = Fetcher(
        fs.parts,
        entries,
        store,
        cfg.fetch(),
    )
    prefetcher = Prefetcher(
        fs.parts,
        listings,
        entries,
        fetcher,
        Recognizer(cfg.checkpoint_patterns),
        auto=cfg.prefetch,
        pushback=store.pacing.reads.pushing_back,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(waits.run)
        await nursery.start(fetcher.run)
        await nursery.start(prefetcher.run)
        remote = ReadThrough(listings, entries, fetcher, prefetcher)
        task_status.started((fetcher, prefetcher, remote))


def _store_where(cfg: Config) -> str:
    """The store and, for S3, its endpoint, as messages name them: no credentials (the
    store's URL has none; an endpoint's user and password, refused by the config, would be
    left out)."""
    if cfg.store.scheme != "s3":
        return str(cfg.store)
    if cfg.endpoint_url is None:
        return f"{cfg.store} (AWS S3)"
    return f"{cfg.store} at {without_userinfo(cfg.endpoint_url)}"


def _paths(request: dict[str, Any]) -> list[str]:
    paths = request.get("paths", [])
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise RequestError("paths must be a list of strings")
    return paths


def _checkpoint(lifecycle: Lifecycle, request: dict[str, Any]) -> str:
    path = str(request.get("path", "")).strip("/")
    located, step = lifecycle.recognizer.locate(path)
    if step is None or located != path:
        raise RequestError(
            f"{path or '/'} is not a checkpoint (a name like step_N, global_stepN, iter_N, "
            "checkpoint-N, epoch_N or ckpt_N.pt)"
        )
    return path


def _wait(request: dict[str, Any]) -> float:
    """A request's ``wait``: seconds, 0 if not given."""
    wait = wait_seconds(request.get("wait", 0))
    if wait is None:
        raise RequestError(f"wait must be a number of seconds, not {request['wait']!r}")
    return wait


def _run(request: dict[str, Any]) -> str | None:
    run = request.get("run")
    return None if run is None else str(run)


def control_handlers(reporter: Reporter, lifecycle: Lifecycle, cfg: Config) -> dict[str, Any]:
    def guarded(call: Any) -> Any:
        """A handler whose errors the client should see as they are (a path, the store)."""

        async def handler(request: dict[str, Any]) -> dict[str, Any]:
            try:
                result: dict[str, Any] = call(request)
                if inspect.isawaitable(result):
                    result = await result
            except (PathError, LookupError, StoreError) as e:
                raise RequestError(str(e)) from None
            return result

        return handler

    async def plan(r: dict[str, Any]) -> dict[str, Any]:
        plans = [p.view() for p in await lifecycle.plan(_run(r))]
        return {"plan": plans, "store_local": reporter.store_local}

    async def pin(r: dict[str, Any]) -> dict[str, Any]:
        """Pin (a checkpoint that exists: LookupError otherwise) or unpin; ``changed``: false
        for an unpin of a path that was not pinned."""
        path = _checkpoint(lifecycle, r)
        if r.get("pin", True):
            where = await lifecycle.pin(path)
            return {"path": path, "pinned": True, "changed": True, "where": where}
        was = await lifecycle.unpin(path)
        return {"path": path, "pinned": False, "changed": was}

    async def pins(r: dict[str, Any]) -> dict[str, Any]:
        return {"pins": await lifecycle.pin_views(), "store_local": reporter.store_local}

    async def rules(r: dict[str, Any]) -> dict[str, Any]:
        return await lifecycle.bucket_rules(bool(r.get("apply")))

    async def apply(r: dict[str, Any]) -> dict[str, Any]:
        return {**await lifecycle.apply(_run(r)), "store_local": reporter.store_local}

    def prefetcher() -> Prefetcher:
        if reporter.prefetcher is None:
            raise RequestError("this gateway has no store to warm up from")
        return reporter.prefetcher

    async def warmup(r: dict[str, Any]) -> dict[str, Any]:
        try:
            return (await prefetcher().warmup(str(r.get("path", "")))).view()
        except LookupError as e:  # its message starts with the path, relative to the root
            raise RequestError(f"{reporter.mountpoint}/{e}") from None

    async def warmup_status(r: dict[str, Any]) -> dict[str, Any]:
        return prefetcher().job(int(r.get("id", 0))).view()

    async def probe_store(r: dict[str, Any]) -> dict[str, Any]:
        """``ckptgw doctor MOUNTPOINT``: the store's checks, made by this daemon (its
        credentials, its endpoint) with a client of their own, not the drain's."""
        from ckptgw.gateway.doctor.storeprobe import probe_store as probe  # botocore: only now

        return {"checks": [dataclasses.asdict(c) for c in await probe(cfg)]}

    return {
        "status": guarded(lambda r: reporter.status()),
        "config": guarded(lambda r: cfg.running_view()),
        "probe_store": guarded(probe_store),
        "pending": guarded(lambda r: reporter.pending_within(_paths(r), _wait(r))),
        "flush": guarded(lambda r: reporter.flush(_paths(r))),
        "lifecycle_plan": guarded(plan),
        "lifecycle_apply": guarded(apply),
        "lifecycle_rules": guarded(rules),
        "pin": guarded(pin),
        "pins": guarded(pins),
        "warmup": guarded(warmup),
        "warmup_status": guarded(warmup_status),
    }


async def _retention_timer(lifecycle: Lifecycle, interval: float) -> None:
    """The periodic mode: apply every policy every ``interval`` seconds."""
    while True:
        await trio.sleep(interval)
        try:
            done = await lifecycle.apply()
        except (StoreError, LookupError) as e:
            log.warning("retention run failed: %s", e)
            continue
        if done["deleted"] or done["tagged"]:
            log.info(
                "retention: %d checkpoints deleted (%d bytes), %d milestones tagged",
                done["deleted"],
                done["deleted_bytes"],
                done["tagged"],
            )


def log_not_durable(reporter: Reporter, cache_dir: Path) -> None:
    """Say exactly what is not in the store as the gateway stops."""
    left = reporter.pending([])
    if not left["count"]:
        log.info("everything is in the store")
        return
    for f in left["files"][:1000]:
        log.warning("not durable: %s (%d bytes, %s)", f["path"], f["size"], f["state"])
    if left["count"] > 1000:
        log.warning("not durable: ... and %d more", left["count"] - 1000)
    log.warning(
        "%s (%d bytes) not in the store; they stay in %s and drain at the next mount",
        entries(left),
        left["bytes"],
        cache_dir,
    )


async def _drain_then_stop(engine: DrainEngine, reporter: Reporter, cfg: Config, why: str) -> None:
    lc = reporter.lifecycle
    lc.mode, lc.reason = "stopping", f"{why}: draining before exit"
    lc.deadline = time.time() + cfg.shutdown_deadline
    engine.start_emergency(why)
    log.info("%s: draining for up to %g s, then stopping", why, cfg.shutdown_deadline)
    with trio.move_on_after(cfg.shutdown_deadline):
        while not engine.is_idle():
            await trio.sleep(0.1)
    log_not_durable(reporter, cfg.cache_dir)
    pyfuse3.terminate()


async def _serve(
    fs: Filesystem, scheduler: Scheduler, cfg: Config, ready: Readiness, mount: _Mount
) -> None:
    """Run the FUSE loop and the drain until unmounted or signalled."""
    engine: DrainEngine | None = None
    reporter: Reporter | None = None

    async with (
        open_store(
            cfg.store, cfg.endpoint_url, deadlines=cfg.deadlines, part_workers=cfg.part_workers
        ) as raw,
        trio.open_nursery() as nursery,
    ):
        stats = RetryStats()
        pacing = Pacing(cfg.pacing())
        store = RetryingStore(raw, RetryPolicy(), stats, pacing, part_size_key=PART_SIZE)

        async def on_signals(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                task_status.started()
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if engine is None or reporter is None:  # still starting: nothing to drain
                        log.info("received %s while starting: stopping", name)
                        mount.signalled = True
                        if mount.mounted:
                            pyfuse3.terminate()  # main() returns at once
                        else:
                            ready.failed(f"received {name} while starting")
                            nursery.cancel_scope.cancel()
                        return
                    if mount.signalled:
                        log.warning("received %s again: stopping now", name)
                        log_not_durable(reporter, cfg.cache_dir)
                        pyfuse3.terminate()
                        return
                    mount.signalled = True
                    nursery.start_soon(_drain_then_stop, engine, reporter, cfg, f"received {name}")

        await nursery.start(on_signals)
        warning = await check_store(store, cfg, ready)
        engine = DrainEngine(fs, store, cfg.drain(), scheduler, stats)
        await nursery.start(engine.run)
        fetcher, prefetcher, remote = await nursery.start(_read_through, fs, store, cfg)
        mount.open(fs.operations(remote))
        nursery.start_soon(fs.files.watch)
        recognizer = Recognizer(cfg.checkpoint_patterns)

        def files_of(path: str) -> list[FileView]:
            assert reporter is not None  # made below, before the lifecycle runs
            return [v for _, v in _files_or_none(reporter, path)]

        lifecycle = Lifecycle(
            fs,
            store,
            list(cfg.retention),
            cfg.bucket_rules,
            files_of,
            recognizer,
            # what status shows of the store is listed again at most this often (Prometheus
            # scrapes and probes ask for status every few seconds)
            listing_ttl=max(cfg.listing_ttl, STORE_CHECKPOINTS_TTL),
        )
        reporter = Reporter(
            cfg.mountpoint,
            str(cfg.store),
            fs,
            engine,
            fetcher.stats,
            recognizer,
            store_local=local_store(cfg.store) is not None,
            log_path=cfg.log_path,
            store=store,  # its requests_view adds the pacing
            retention=lifecycle,  # status shows its pins and the store's checkpoints
            prefetcher=prefetcher,
            lookups=remote.waits,  # lookups answered without a stalled store
        )
        await nursery.start(lifecycle.run)
        handlers = control_handlers(reporter, lifecycle, cfg)
        await nursery.start(ControlServer(mount.control, handlers).run)
        if cfg.lifecycle_interval > 0 and cfg.retention:
            nursery.start_soon(_retention_timer, lifecycle, cfg.lifecycle_interval)
        if cfg.metrics_listen is not None:
            from ckptgw.gateway.daemon.metrics import MetricsServer

            await nursery.start(MetricsServer(reporter, *cfg.metrics_listen).run)
        if cfg.preemption_provider != "off":
            await nursery.start(_watch_preemption, engine, reporter, cfg)
        warnings = [w for w in (mount.warning, warning) if w]
        ready.ok("; ".join(warnings) if warnings else None)
        log.info("mounted")
        await pyfuse3.main()
        nursery.cancel_scope.cancel()  # uploads in progress keep their records and resume


def _files_or_none(reporter: Reporter, path: str) -> list[tuple[Any, Any]]:
    try:
        return reporter.files(path)
    except PathError:
        return []  # the run has no files on this node


async def _watch_preemption(
    engine: DrainEngine,
    reporter: Reporter,
    cfg: Config,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    def on_notice(notice: str) -> None:
        lc = reporter.lifecycle
        if lc.mode == "serving":
            lc.mode, lc.reason = "emergency-drain", f"preemption notice: {notice}"
        engine.start_emergency(f"preemption notice: {notice}")

    watcher = PreemptionWatcher(
        cfg.preemption(),
        on_notice,
        {"CKPTGW_MOUNTPOINT": str(cfg.mountpoint)},
    )
    reporter.lifecycle.preemption = watcher.view
    await watcher.run(task_status=task_status)

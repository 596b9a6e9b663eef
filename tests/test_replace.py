"""A key is replaced, never removed and then added (ARCHITECTURE.md, "Per-entry state machine").

Every way a trainer replaces a durable file keeps the old object under its name until the
new one is complete there: a temp file renamed over it, an unlink followed by a create of the
same name, an ``O_TRUNC`` rewrite in place, an exchange, and a restart in between. The store
below checks, after every call that changes it, that the watched keys are all there; the
upload is held at a gate (its later parts), so the moment the old code deleted the key is one
the test always looks at.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path

import pyfuse3
import pytest

from ckptgw.fsops.filesystem import Filesystem, FsOptions
from ckptgw.fsops.journal.rows import ROOT_INODE, InodeRow, State
from ckptgw.store.faultproxy import Fault, FaultProxy
from ckptgw.store.interface import Body
from tests.conftest import GatewayFactory, any_data_path
from tests.test_drain_races import GatedStore, MiB, Node, node, run


class WatchedStore(GatedStore):
    """A gated file store that checks, after every call that changes what it holds, that
    every key in ``watched`` is there; ``gaps`` collects the calls after which one was not."""

    def __init__(self, root: Path, *gated: str) -> None:
        super().__init__(root, *gated)
        self.watched: set[str] = set()
        self.gaps: list[str] = []
        self.deleted: list[str] = []

    def _check(self, call: str) -> None:
        for key in sorted(self.watched):
            if not (self.root / key).is_file():
                self.gaps.append(f"{key} missing after {call}")

    async def put(self, key: str, data: bytes, metadata: dict[str, str]) -> str:
        etag = await super().put(key, data, metadata)
        self._check(f"PUT {key}")
        return etag

    async def delete(self, key: str) -> None:
        self.deleted.append(key)
        await super().delete(key)
        self._check(f"DELETE {key}")

    async def copy(self, src: str, dst: str, metadata: dict[str, str] | None = None) -> str:
        etag = await super().copy(src, dst, metadata)
        self._check(f"COPY {src} -> {dst}")
        return etag

    async def upload_part(
        self, key: str, upload_id: str, number: int, data: Body, crc32: int | None = None
    ) -> str:
        self._check(f"PART {number} of {key}")  # while the upload is under way
        return await super().upload_part(key, upload_id, number, data, crc32)

    async def complete_multipart(self, key: str, upload_id: str, etags: list[str]) -> str:
        etag = await super().complete_multipart(key, upload_id, etags)
        self._check(f"COMPLETE {key}")
        return etag


def watched(n: Node) -> WatchedStore:
    assert isinstance(n.store, WatchedStore)
    return n.store


async def durable(n: Node, name: bytes, data: bytes) -> int:
    """Write ``name`` and wait until the store holds it; returns its inode."""
    inode = await n.write(ROOT_INODE, name, data)
    await n.drained()
    assert (await n.stored(name.decode()))[0] == data
    return inode


async def durable_then_held(n: Node, name: bytes, data: bytes, gate: str) -> int:
    """``name`` made durable with ``gate`` open, then watched (it must never be missing) and
    the gate closed again, so that the next upload is held there; returns its inode."""
    n.store.open(gate)
    inode = await durable(n, name, data)
    watched(n).watched.add(name.decode())
    n.store.close(gate)
    return inode


async def holds(n: Node, key: str, data: bytes) -> None:
    got = await n.store.get(key)
    assert got == data, f"{key} holds {len(got)} bytes, not the {len(data)} expected"


def name_row(n: Node, name: bytes) -> InodeRow:
    row = n.fs.journal.lookup(ROOT_INODE, name)
    assert row is not None
    return row


@pytest.mark.parametrize("size", [12 * MiB, 3000], ids=["multipart", "single-put"])
def test_a_save_renamed_over_a_durable_file_keeps_the_old_object_until_the_new_one_is_there(
    tmp_path: Path, size: int
) -> None:
    """latest.pt by temp + fsync + rename: the old object stays under the name while the new
    version is uploaded (held mid-way), and is overwritten, never deleted."""
    old, new = os.urandom(size), os.urandom(size)
    gate = "later_parts" if size > 5 * MiB else "put"

    async def test() -> None:
        async with node(tmp_path, gate, store_cls=WatchedStore) as n:
            store = watched(n)
            await durable_then_held(n, b"latest.pt", old, gate)
            await n.write(ROOT_INODE, b"latest.pt.tmp", new)
            n.fs.namespace.rename(ROOT_INODE, b"latest.pt.tmp", ROOT_INODE, b"latest.pt", 0)
            row = name_row(n, b"latest.pt")
            # The new version is not durable yet; the name's previous version is.
            assert row.state in (State.DIRTY, State.UPLOADING)
            assert row.stored_key == "latest.pt"
            await n.store.entered(gate).wait()  # the new version's upload is under way
            # (a single PUT's gate is after it landed: its answer is what is slow)
            await holds(n, "latest.pt", old if gate == "later_parts" else new)
            n.store.open(gate)
            await n.drained()
            await holds(n, "latest.pt", new)
            assert "latest.pt" not in store.deleted
            assert store.gaps == []
            assert await n.store.head("latest.pt.tmp") is None
            assert (name_row(n, b"latest.pt").state, n.fs.journal.store_ops()) == (
                State.CLEAN,
                [],
            )

    run(test)


@pytest.mark.parametrize("then", ["completes", "rewritten"])
def test_a_file_renamed_over_a_durable_one_while_it_uploads_replaces_it(
    tmp_path: Path, then: str
) -> None:
    """The temp file's upload is under way (to the temp name) when it is renamed over the
    durable file: the old object stays; the upload completes and its object is moved onto
    the name, or, rewritten meanwhile, the next upload goes to the name itself."""
    old, tmp, newer = os.urandom(12 * MiB), os.urandom(12 * MiB), os.urandom(12 * MiB)

    async def test() -> None:
        async with node(tmp_path, "later_parts", store_cls=WatchedStore) as n:
            store = watched(n)
            await durable_then_held(n, b"latest.pt", old, "later_parts")
            await n.write(ROOT_INODE, b"tmp", tmp)
            await n.store.entered("later_parts").wait()  # uploading to "tmp"
            n.fs.namespace.rename(ROOT_INODE, b"tmp", ROOT_INODE, b"latest.pt", 0)
            row = name_row(n, b"latest.pt")
            assert row.state is State.UPLOADING and row.stored_key == "latest.pt"
            assert n.fs.journal.store_ops() == []
            final = tmp
            if then == "rewritten":
                await n.write(ROOT_INODE, b"latest.pt", newer, os.O_TRUNC)
                final = newer
            await holds(n, "latest.pt", old)
            n.store.open("later_parts")
            await n.drained()
            await holds(n, "latest.pt", final)
            assert store.gaps == [] and "latest.pt" not in store.deleted
            assert sorted([o.key async for o in n.store.iter_objects("")]) == ["latest.pt"]

    run(test)


def test_a_drained_file_renamed_over_a_durable_one_replaces_it_by_a_copy(tmp_path: Path) -> None:
    """Both stored: the rename is one server-side move onto the old key (S3 replaces an
    object atomically on copy), with no delete of that key first."""
    a, b = os.urandom(2000), os.urandom(3000)

    async def test() -> None:
        async with node(tmp_path, store_cls=WatchedStore) as n:
            store = watched(n)
            await durable(n, b"a.pt", a)
            await durable(n, b"b.tmp", b)
            store.watched.add("a.pt")
            n.fs.namespace.rename(ROOT_INODE, b"b.tmp", ROOT_INODE, b"a.pt", 0)
            assert [(op.kind, op.src, op.dst) for op in n.fs.journal.store_ops()] == [
                ("move", "b.tmp", "a.pt")
            ]
            await n.drained()
            await holds(n, "a.pt", b)
            assert store.deleted == ["b.tmp"] and store.gaps == []

    run(test)


def test_an_unlink_then_a_create_of_the_same_name_keeps_the_old_object(tmp_path: Path) -> None:
    old, new = os.urandom(12 * MiB), os.urandom(12 * MiB)

    async def test() -> None:
        async with node(tmp_path, "later_parts", store_cls=WatchedStore) as n:
            store = watched(n)
            first = await durable_then_held(n, b"latest.pt", old, "later_parts")
            n.fs.namespace.unlink(ROOT_INODE, b"latest.pt")
            second = await n.write(ROOT_INODE, b"latest.pt", new)  # a new inode
            assert second != first
            assert name_row(n, b"latest.pt").stored_key == "latest.pt"
            await n.store.entered("later_parts").wait()
            await holds(n, "latest.pt", old)
            n.store.open("later_parts")
            await n.drained()
            await holds(n, "latest.pt", new)
            assert store.deleted == [] and store.gaps == []

    run(test)


def test_an_o_trunc_rewrite_in_place_keeps_the_old_object(tmp_path: Path) -> None:
    old, new = os.urandom(12 * MiB), os.urandom(11 * MiB)

    async def test() -> None:
        async with node(tmp_path, "later_parts", store_cls=WatchedStore) as n:
            store = watched(n)
            await durable_then_held(n, b"latest.pt", old, "later_parts")
            await n.write(ROOT_INODE, b"latest.pt", new, os.O_TRUNC)
            await n.store.entered("later_parts").wait()
            await holds(n, "latest.pt", old)
            n.store.open("later_parts")
            await n.drained()
            await holds(n, "latest.pt", new)
            assert store.deleted == [] and store.gaps == []

    run(test)


@pytest.mark.parametrize("first", ["stored", "dirty"])
def test_an_exchange_keeps_both_names_in_the_store_throughout(tmp_path: Path, first: str) -> None:
    """RENAME_EXCHANGE of two durable files (or of a durable one and one not yet uploaded):
    each name holds an object at every moment, and each ends with the other's content."""
    a, b, a2 = b"AAAA", b"BBBBBB", b"aaaaaaaa"

    async def test() -> None:
        async with node(tmp_path, store_cls=WatchedStore) as n:
            store = watched(n)
            await durable(n, b"a", a)
            await durable(n, b"b", b)
            store.watched |= {"a", "b"}
            if first == "dirty":
                await n.write(ROOT_INODE, b"a", a2, os.O_TRUNC)  # a's new version not sent
                a_now = a2
            else:
                a_now = a
            n.fs.namespace.rename(ROOT_INODE, b"a", ROOT_INODE, b"b", pyfuse3.RENAME_EXCHANGE)
            await n.drained()
            await holds(n, "a", b)
            await holds(n, "b", a_now)
            assert store.gaps == []
            assert "a" not in store.deleted and "b" not in store.deleted
            assert sorted([o.key async for o in n.store.iter_objects("")]) == ["a", "b"]

    run(test)


def test_a_replaced_name_that_goes_away_leaves_nothing_behind(tmp_path: Path) -> None:
    """The previous version a new entry kept is deleted when that entry is renamed away or
    unlinked before its upload: only keys no entry will write are deleted, but those are."""
    old = os.urandom(3000)

    async def test() -> None:
        async with node(tmp_path, "put", store_cls=WatchedStore) as n:
            n.store.open("put")
            await durable(n, b"x.pt", old)
            await durable(n, b"y.pt", old)
            n.store.close("put")
            # x.pt: replaced by a temp file that is then renamed elsewhere
            await n.write(ROOT_INODE, b"x.tmp", b"new x")
            n.fs.namespace.rename(ROOT_INODE, b"x.tmp", ROOT_INODE, b"x.pt", 0)
            n.fs.namespace.rename(ROOT_INODE, b"x.pt", ROOT_INODE, b"elsewhere.pt", 0)
            # y.pt: unlinked, made again, unlinked again
            n.fs.namespace.unlink(ROOT_INODE, b"y.pt")
            await n.write(ROOT_INODE, b"y.pt", b"new y")
            n.fs.namespace.unlink(ROOT_INODE, b"y.pt")
            n.store.open("put")
            await n.drained()
            keys = sorted([o.key async for o in n.store.iter_objects("")])
            assert keys == ["elsewhere.pt"]
            await holds(n, "elsewhere.pt", b"new x")

    run(test)


def test_a_create_after_the_delete_was_sent_uploads_the_new_version_alone(
    tmp_path: Path,
) -> None:
    """Too late to keep: the delete is on its way when the name is made again. The new entry
    claims nothing (it has no previous version) and its upload follows the delete."""

    async def test() -> None:
        async with node(tmp_path, "delete", store_cls=WatchedStore) as n:
            await durable(n, b"f.pt", b"old")
            n.fs.namespace.unlink(ROOT_INODE, b"f.pt")
            await n.store.entered("delete").wait()
            await n.write(ROOT_INODE, b"f.pt", b"new")
            assert name_row(n, b"f.pt").stored_key is None
            n.store.open("delete")
            await n.drained()
            await holds(n, "f.pt", b"new")
            assert watched(n).deleted == ["f.pt"]

    run(test)


def test_a_restart_while_the_new_version_drains_keeps_the_old_one_until_it_is_there(
    tmp_path: Path,
) -> None:
    """Stopped with the rename journaled and the new upload mid-way: the store still holds
    the old version under the name, the journal says the name's previous version is there,
    and the next mount finishes the new one."""
    old, new = os.urandom(12 * MiB), os.urandom(12 * MiB)

    async def first() -> None:
        async with node(tmp_path, "later_parts", store_cls=WatchedStore) as n:
            n.store.open("later_parts")
            await durable(n, b"latest.pt", old)
            n.store.close("later_parts")
            await n.write(ROOT_INODE, b"tmp", new)
            n.fs.namespace.rename(ROOT_INODE, b"tmp", ROOT_INODE, b"latest.pt", 0)
            await n.store.entered("later_parts").wait()
            # the gateway stops here

    async def second() -> None:
        async with node(tmp_path, store_cls=WatchedStore) as n:
            await holds(n, "latest.pt", old)
            watched(n).watched.add("latest.pt")
            await n.drained()
            await holds(n, "latest.pt", new)
            assert watched(n).gaps == [] and watched(n).deleted == []

    run(first)
    url = f"file://{tmp_path / 'store'}"
    fs = Filesystem(tmp_path / "cache", FsOptions(store_url=url, reserve_bytes=0))
    try:
        row = fs.journal.lookup(ROOT_INODE, b"latest.pt")
        assert row is not None and row.state is State.DIRTY
        assert row.stored_key == "latest.pt"
        assert fs.journal.store_ops() == []
    finally:
        fs.close()
    run(second)


# -- through a mount, on S3 --------------------------------------------------------------------


class HeadPoller:
    """HEADs one key of the store every 20 ms from a thread, as a watcher of the bucket
    would, and records each answer's ETag (None: the key was missing)."""

    def __init__(self, endpoint: str, bucket: str, key: str) -> None:
        import boto3

        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        self.bucket, self.key = bucket, key
        self.seen: list[str | None] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                etag = self.s3.head_object(Bucket=self.bucket, Key=self.key)["ETag"]
            except self.s3.exceptions.ClientError as e:
                if e.response["Error"]["Code"] not in ("404", "NoSuchKey"):
                    raise
                etag = None
            self.seen.append(etag)
            time.sleep(0.02)

    def stop(self) -> list[str | None]:
        self._stop.set()
        self._thread.join(10)
        return self.seen


@any_data_path
def test_overwriting_a_durable_file_through_a_mount_never_leaves_its_key_missing(
    gateway: GatewayFactory, s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    """latest.pt on S3, then saved again by temp + fsync + rename, with the new version's
    upload held at the proxy and the daemon killed (-9) meanwhile: HeadObject, polled all the
    while, never misses the key; it has the old version until the new one is complete."""
    import boto3

    proxy = FaultProxy(int(s3_endpoint.rsplit(":", 1)[1]))
    cfg = tmp_path / "drain.toml"
    cfg.write_text('[drain]\npart_size = "5MiB"\nmultipart_threshold = "5MiB"\nsettle = 0.1\n')
    args = ("--config", str(cfg), "--endpoint-url", proxy.url)
    gw = gateway("gw", *args, store=f"s3://{bucket}/run/")
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    old, new = os.urandom(12 << 20), os.urandom(12 << 20)
    poller: HeadPoller | None = None
    try:
        (gw.mountpoint / "latest.pt").write_bytes(old)
        gw.cli("wait", str(gw.mountpoint / "latest.pt"), "--timeout", "60")
        poller = HeadPoller(s3_endpoint, bucket, "run/latest.pt")
        hold = proxy.add(Fault("hold", "PUT", r"partNumber=2(&|$)", drop=True))
        tmp = gw.mountpoint / "latest.pt.tmp"
        with open(tmp, "wb") as f:
            f.write(new)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, gw.mountpoint / "latest.pt")
        deadline = time.monotonic() + 60
        while hold.hits == 0:  # the new version's upload is under way, held at part 2
            assert time.monotonic() < deadline, "the new version's upload never started"
            time.sleep(0.02)
        body = s3.get_object(Bucket=bucket, Key="run/latest.pt")["Body"].read()
        assert body == old
        # What status says meanwhile: the new version drains; the previous one is durable.
        st = gw.status()
        assert (st["queue"]["replacing"], st["queue"]["replacing_bytes"]) == (1, len(new))
        assert st["queue"]["lost_wakeups"] == 0
        [pending] = gw.control().request("pending", paths=["latest.pt"])["files"]
        assert pending["state"] == "draining" and pending["previous_durable"] is True
        text = gw.cli("status", str(gw.mountpoint)).stdout
        assert "replacing 1 file" in text and "previous version" in text
        gw.kill()  # the node's daemon dies with the new version only in its cache
        hold.release()
        assert s3.get_object(Bucket=bucket, Key="run/latest.pt")["Body"].read() == old
        gw.start()
        gw.cli("wait", str(gw.mountpoint / "latest.pt"), "--timeout", "60")
        assert s3.get_object(Bucket=bucket, Key="run/latest.pt")["Body"].read() == new
        seen = poller.stop()
        assert len(seen) > 10 and None not in seen, "HeadObject missed latest.pt"
        assert "run/latest.pt.tmp" not in [
            o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])
        ]
    finally:
        if poller is not None:
            poller.stop()
        proxy.close()


@any_data_path
def test_a_regular_file_made_by_mknod_is_drained(mnt: Path, tmp_path: Path) -> None:
    """mknod(S_IFREG) makes a file no open holds, so no release ever reports it: it must be
    queued when it is made (it was left dirty until the next mount). Nothing here asks for
    a flush (``ckptgw wait`` would)."""
    os.mknod(mnt / "made.bin", stat.S_IFREG | 0o644)
    stored = tmp_path / "store" / "made.bin"  # the mount's embedded file:// store
    deadline = time.monotonic() + 30  # the settle delay is 0.2 s; the audit would take ~60
    while not stored.exists():
        assert time.monotonic() < deadline, "a file made by mknod was never uploaded"
        time.sleep(0.05)


@any_data_path
def test_a_file_created_read_only_is_drained(mnt: Path, tmp_path: Path) -> None:
    """open(O_CREAT | O_RDONLY) makes a file that no writer's release reports (NFSv4 OPENs
    with read access do it, as pynfs found): it must be queued when it is made."""
    os.close(os.open(mnt / "made.bin", os.O_CREAT | os.O_RDONLY, 0o644))
    stored = tmp_path / "store" / "made.bin"  # the mount's embedded file:// store
    deadline = time.monotonic() + 30  # the settle delay is 0.2 s; the audit would take ~60
    while not stored.exists():
        assert time.monotonic() < deadline, "a file created read-only was never uploaded"
        time.sleep(0.05)


def test_a_put_that_landed_before_a_restart_under_an_old_name_is_not_left_behind(
    tmp_path: Path,
) -> None:
    """A single PUT lands, its answer is lost to a stop, and the file was renamed meanwhile:
    after the restart the file goes to its new name, and what the PUT left under the old
    one is deleted (no entry holds it)."""

    async def first() -> None:
        async with node(tmp_path, "put") as n:
            await n.write(ROOT_INODE, b"x.tmp", b"content")
            await n.store.entered("put").wait()  # landed at x.tmp, the answer held
            n.fs.namespace.rename(ROOT_INODE, b"x.tmp", ROOT_INODE, b"x.pt", 0)
            # the gateway stops here

    async def second() -> None:
        async with node(tmp_path) as n:
            await n.drained()
            assert sorted([o.key async for o in n.store.iter_objects("")]) == ["x.pt"]
            await holds(n, "x.pt", b"content")

    run(first)
    run(second)


def test_an_older_version_left_to_an_upload_renamed_before_a_restart_is_not_left_behind(
    tmp_path: Path,
) -> None:
    """a.pt is durable, rewritten in place (its older version stays under a.pt for the new
    upload to overwrite), and renamed while that multipart upload is under way; the gateway
    stops. The upload's old key is not the file's any more: after the restart the file goes
    to its new name and the older version under a.pt is deleted, not left to come back as a
    file at the next listing."""
    old, new = os.urandom(12 * MiB), os.urandom(12 * MiB)

    async def first() -> None:
        async with node(tmp_path, "later_parts") as n:
            n.store.open("later_parts")
            await durable(n, b"a.pt", old)
            n.store.close("later_parts")
            await n.write(ROOT_INODE, b"a.pt", new, os.O_TRUNC)
            await n.store.entered("later_parts").wait()  # its upload to a.pt is under way
            n.fs.namespace.rename(ROOT_INODE, b"a.pt", ROOT_INODE, b"step_100.pt", 0)
            # the gateway stops here

    async def second() -> None:
        async with node(tmp_path) as n:
            await n.drained()
            assert sorted([o.key async for o in n.store.iter_objects("")]) == ["step_100.pt"]
            await holds(n, "step_100.pt", new)

    run(first)
    run(second)

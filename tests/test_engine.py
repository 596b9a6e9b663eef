"""Drain engine behaviour that needs no mount, and store operations across a crash."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio

from drain.engine import DrainConfig, DrainEngine
from drain.filestore import FileStore
from drain.storeurl import parse_store_url
from fsops.filesystem import Filesystem, FsOptions
from tests.conftest import GatewayFactory, needs_fuse
from tests.test_drain import file_store_objects, settle_on, wait_for, write_config


def test_only_old_unknown_uploads_are_aborted(tmp_path: Path) -> None:
    url = parse_store_url(f"file://{tmp_path / 'store'}")
    store = FileStore(url)
    (tmp_path / "cache").mkdir()
    fs = Filesystem(tmp_path / "cache", FsOptions(store_url=str(url), reserve_bytes=0))

    async def go() -> set[str]:
        await store.check()
        old = await store.create_multipart("old.pt", {})
        young = await store.create_multipart("young.pt", {})
        day_ago = time.time() - 2 * 86400
        os.utime(store.root / ".ckptgw-uploads" / old, (day_ago, day_ago))
        engine = DrainEngine(fs, store, DrainConfig(orphan_age=86400))
        await engine._abort_orphans()
        return {u.upload_id async for u in store.iter_uploads("")} - {young}

    try:
        assert trio.run(go) == set()
    finally:
        fs.close()


@needs_fuse
@pytest.mark.mount
def test_directory_rename_resumes_its_moves_after_kill9(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    from tests.test_drain import Bucket

    cfg = write_config(tmp_path / "d.toml", settle=0.1)
    gw = gateway("gw", "--config", str(cfg))
    root = tmp_path / "store"

    def objects() -> dict[str, bytes]:
        return file_store_objects(root)

    store = Bucket(objects, lambda key: {})
    (gw.mountpoint / "step_100").mkdir()
    files = {f"step_100/shard_{i:03}.distcp": os.urandom(100 + i) for i in range(150)}
    for k, v in files.items():
        (gw.mountpoint / k).write_bytes(v)
    settle_on(store, files)
    os.rename(gw.mountpoint / "step_100", gw.mountpoint / "latest")
    wait_for("some moves to start", lambda: any(k.startswith("latest/") for k in objects()))
    gw.kill()  # mid-way through 150 copy + delete pairs
    gw.start()
    settle_on(store, {k.replace("step_100/", "latest/"): v for k, v in files.items()})

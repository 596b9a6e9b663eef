"""Store operations across a crash (the engine without a mount: tests/test_drain_races.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import GatewayFactory, needs_fuse
from tests.test_drain import file_store_objects, settle_on, wait_for, write_config


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

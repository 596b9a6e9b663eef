"""The store's checkpoints for status (drain/retention/catalog.py), walked one directory level
at a time against a real store (a directory), so that the newest checkpoints are found whatever
their number and however their names sort."""

from __future__ import annotations

from pathlib import Path

import trio

from ckptgw.drain.checkpoints import Recognizer
from ckptgw.drain.retention.catalog import walk_checkpoints
from ckptgw.store.files import FileStore
from ckptgw.store.url import parse_store_url


def fill(tmp_path: Path) -> FileStore:
    store = FileStore(parse_store_url(f"file://{tmp_path / 'store'}"))

    async def put() -> None:
        for step in range(1, 31):  # zero-padded: key order is step order, oldest first
            for shard in ("__0_0.distcp", "__1_0.distcp", ".metadata"):
                await store.put(f"jobs/a/step_{step:06d}/{shard}", b"x" * step, {})
        await store.put("jobs/a/notes.txt", b"not a checkpoint", {})
        await store.put("jobs/b/ckpt_7.pt", b"one file", {})
        await store.put(".ckptgw-pins/jobs/a/step_000001", b"", {})

    trio.run(put)
    return store


def test_the_newest_of_each_directory_however_few_keys_a_walk_may_list(tmp_path: Path) -> None:
    store = fill(tmp_path)
    walked = trio.run(
        lambda: walk_checkpoints(store, "", "", Recognizer(), per_dir=20, max_keys=10_000)
    )
    steps = {int(f.path.split("/")[2][5:]) for f in walked.files if f.path.startswith("jobs/a/")}
    assert steps == set(range(11, 31))  # the newest 20, not the first 20 in key order
    assert walked.omitted == 10 and not walked.truncated
    assert "jobs/b/ckpt_7.pt" in {f.path for f in walked.files}
    assert not any(".ckptgw-" in f.path or "notes" in f.path for f in walked.files)

    # Bounded: cut at 12 keys, it still took the newest first, and says it stopped.
    small = trio.run(lambda: walk_checkpoints(store, "", "jobs/a", Recognizer(), max_keys=12))
    assert small.truncated
    assert {f.path.split("/")[2] for f in small.files} == {
        f"step_{s:06d}" for s in (30, 29, 28, 27)
    }

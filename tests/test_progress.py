"""Progress and the view of a drain: the ``pending`` answer's bytes while a multipart upload is
held part-way, the progress bar (bytes, rate, ETA, the summary line), a temp + fsync + rename
save seen through ``status`` (the upload under the file's new name, each file's bytes counted
once, the move as part of its checkpoint), and the wording of counts and retries."""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from ckptgw.fsops.signal import Signal
from ckptgw.gateway import client
from ckptgw.gateway.cli.progressbar import ProgressBar
from ckptgw.gateway.client import Mount, mount_of, wait_durable
from ckptgw.gateway.daemon.status import RECHECK, SPACING, Reporter
from ckptgw.gateway.errors import UserError
from ckptgw.gateway.render import entries, files, retries_text, status_text
from ckptgw.store.faultproxy import Fault
from tests.conftest import GatewayFactory, needs_fuse
from tests.s3server import free_port
from tests.test_drain import wait_for
from tests.test_operate import S3Setup, checkpoint, s3_gateway, valid
from tests.test_readthrough import write_toml

MiB = 1 << 20
PARTS = {"part_size": "5MiB", "multipart_threshold": "5MiB", "max_parts": 1}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def answer(size: int, sent: int, *, count: int = 1, moves: int = 0) -> dict[str, Any]:
    """A ``pending`` answer for one file (inode 7) of ``size`` bytes, ``sent`` of them stored."""
    f = {"inode": 7, "path": "/mnt/step_1/model.pt", "directory": False, "size": size}
    return {
        "files": [f] if count else [],
        "count": count,
        "directories": 0,
        "bytes": size if count else 0,
        "bytes_sent": sent if count else 0,
        "moves": moves,
    }


# -- the progress bar (a fake clock, a terminal that is a StringIO) ------------------------------


def test_progress_bar_shows_bytes_rate_and_eta_from_the_uploads_progress() -> None:
    out, clock = Terminal(), Clock()
    bar = ProgressBar(out, clock=clock)
    bar(answer(100 * MiB, 0))
    assert "0 B of 100.0 MiB" in out.getvalue() and "ETA" not in out.getvalue()
    clock.now += 2
    bar(answer(100 * MiB, 20 * MiB))  # 10 MiB/s; 80 MiB left
    screen = out.getvalue().rsplit("\r", 1)[1]
    assert "20%" in screen and "20.0 MiB of 100.0 MiB" in screen
    assert "10.0 MiB/s" in screen and "ETA 8.0 s" in screen and "1 file left" in screen
    clock.now += 2
    bar(answer(100 * MiB, 100 * MiB, moves=1))  # every byte stored; its move is pending
    screen = out.getvalue().rsplit("\r", 1)[1]
    assert "100%" in screen and "1 move pending" in screen
    clock.now += 1
    bar(answer(0, 0, count=0))
    bar.close()
    assert out.getvalue().endswith("ckptgw: 1 file, 100.0 MiB durable in 5.0 s (20.0 MiB/s)\n")


def test_progress_bar_counts_a_file_renamed_during_the_wait_once() -> None:
    out, clock = Terminal(), Clock()
    bar = ProgressBar(out, clock=clock)
    bar(answer(10 * MiB, 5 * MiB))
    renamed = answer(10 * MiB, 10 * MiB, moves=1)
    renamed["files"][0]["path"] = "/mnt/step_1/model.pt.renamed"
    bar(renamed)
    assert bar.total == 10 * MiB and "10.0 MiB of 10.0 MiB" in out.getvalue().rsplit("\r", 1)[1]


def test_progress_bar_off_a_terminal_writes_only_the_summary() -> None:
    out, clock = io.StringIO(), Clock()
    bar = ProgressBar(out, clock=clock)
    bar(answer(3 * MiB, 0))
    clock.now += 0.5
    bar(answer(0, 0, count=0))
    bar.close()
    assert out.getvalue() == "ckptgw: 1 file, 3.0 MiB durable in 0.5 s\n"
    # Not durable at the end: no summary (the caller says what is left); nothing pending: quiet.
    for last in (answer(3 * MiB, 0), None):
        out = io.StringIO()
        bar = ProgressBar(out, clock=clock)
        bar(answer(3 * MiB, 0) if last else answer(0, 0, count=0))
        bar.close()
        assert out.getvalue() == ""


# -- wording ---------------------------------------------------------------------------------------


def test_counts_are_singular_or_plural() -> None:
    assert (files(1), files(2), files(0)) == ("1 file", "2 files", "0 files")
    assert entries({"count": 2, "directories": 1}) == "1 file and 1 directory"
    assert entries({"count": 3, "directories": 3}) == "3 directories"


def test_retries_line_says_retries_and_errors_by_kind() -> None:
    st = {"retries": 13, "errors": {"Transport": 16, "SlowDown": 2}, "last_error_at": 97.0}
    assert (
        retries_text(st, 100.0) == "retries 13; errors: 16 transport, 2 SlowDown (last 3.0 s ago)"
    )
    assert retries_text({"retries": 0, "errors": {}, "last_error_at": None}, 0) == (
        "retries 0; no errors"
    )


def test_status_text_words_one_file_and_moves() -> None:
    st = {
        "mountpoint": "/mnt",
        "store": "s3://b/",
        "pid": 1,
        "uptime": 5.0,
        "mode": "serving",
        "data_path": {"mode": "passthrough"},
        "cache": {"used": 0, "limit": None, "free": 1, "evictions": 0, "write_waits": 0},
        "dirty_bytes": 4 * MiB,
        "queue": {
            "files": 1,
            "bytes": 4 * MiB,
            "oldest_dirty_age": 1.0,
            "open_for_writing": 0,
            "store_ops": 1,
            "moves": 1,
            "moving_bytes": 6 * MiB,
        },
        "uploads": [
            {
                "path": "/mnt/step_2/model.pt",
                "sent_as": "/mnt/step_2/model.pt.tmp",
                "size": 4 * MiB,
                "sent": MiB,
                "in_flight": MiB,
                "phase": "sending",
                "elapsed": 1.0,
                "throughput": MiB,
                "eta": 3.0,
            }
        ],
        "drained": {"bytes": 0},
        "fetched": {"bytes": 0},
        "retries": 0,
        "errors": {},
        "last_error": None,
        "checkpoints": [
            {"path": "/mnt/step_2", "step": 2, "state": "draining", "files": 1,
             "bytes": 4 * MiB, "local_bytes": 4 * MiB, "moves": 0, "mtime": 0.0},
            {"path": "/mnt/step_1", "step": 1, "state": "draining", "files": 1,
             "bytes": 6 * MiB, "local_bytes": 0, "moves": 1, "mtime": 0.0},
        ],
    }  # fmt: skip
    text = status_text(st)
    assert "queue 1 file, 4.0 MiB" in text and "1 files" not in text
    assert "upload    /mnt/step_2/model.pt   25%  1.0 MiB of 4.0 MiB  1.0 MiB/s  ETA 3.0 s" in text
    assert "(sent under its old name /mnt/step_2/model.pt.tmp, then moved)" in text
    assert "1 file (6.0 MiB) in the store, to be moved to its current name" in text
    (row,) = [line for line in text.splitlines() if "/mnt/step_1 " in line]
    assert "1 move pending" in row
    assert "retries 0; no errors" in text


# -- a waiting ``pending``, on a fake clock --------------------------------------------------------


def fake_reporter(left: dict[str, int], asks: list[float]) -> tuple[Reporter, Signal]:
    """A Reporter with only what ``pending_within`` uses: the changes it waits on, and a
    ``pending`` that notes when it was asked."""
    changes = Signal()
    reporter = Reporter.__new__(Reporter)
    reporter.fs = SimpleNamespace(states=SimpleNamespace(changes=changes))  # type: ignore[assignment]
    reporter._next_ask = -math.inf

    def pending(paths: list[str]) -> dict[str, Any]:
        asks.append(trio.current_time())
        return {"count": left["count"]}

    reporter.pending = pending  # type: ignore[method-assign]
    return reporter, changes


def test_a_waiting_pending_asks_again_at_a_change_at_its_rechecks_and_at_its_deadline() -> None:
    left: dict[str, int] = {"count": 1}
    asks: list[float] = []
    reporter, changes = fake_reporter(left, asks)

    async def main() -> None:
        async def finish() -> None:
            await trio.sleep(0.3)  # between two rechecks
            left["count"] = 0
            changes.fire()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(finish)
            answer = await reporter.pending_within(["x"], 10)
        assert answer == {"count": 0, "waited": 0.3}  # woken by the change itself
        assert asks == [pytest.approx(0.0), pytest.approx(0.3)]

        await trio.sleep(1)
        left["count"], t0 = 1, trio.current_time()
        asks.clear()
        answer = await reporter.pending_within(["x"], 2.5)  # nothing changes
        assert answer == {"count": 1, "waited": 2.5}
        assert [a - t0 for a in asks] == pytest.approx([0, RECHECK, 2 * RECHECK, 2.5])

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_waiting_pendings_together_ask_no_more_often_than_their_spacing() -> None:
    """Two clients waiting while changes come every millisecond (a small-file drain): the
    daemon asks at most once per ``SPACING``, for both of them together."""
    left: dict[str, int] = {"count": 1}
    asks: list[float] = []
    reporter, changes = fake_reporter(left, asks)

    async def main() -> None:
        async def churn() -> None:
            for _ in range(500):
                await trio.sleep(0.001)
                changes.fire()
            left["count"] = 0
            changes.fire()

        answers: list[dict[str, Any]] = []

        async def client() -> None:
            answers.append(await reporter.pending_within(["x"], 10))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(churn)
            nursery.start_soon(client)
            nursery.start_soon(client)
        assert [a["count"] for a in answers] == [0, 0]
        gaps = [b - a for a, b in itertools.pairwise(asks[1:])]  # the first two: one each
        assert gaps and min(gaps) >= SPACING - 1e-9
        assert len(asks) <= 0.5 / SPACING + 4

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_daemon_that_answers_at_once_is_asked_again_every_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A daemon of an older version knows no ``wait``: it answers at once, without
    ``waited``, and the client sleeps out each ``poll`` itself instead of asking in a loop."""
    answers = [{"count": 1}, {"count": 1}, {"count": 0}]
    asked: list[tuple[str, object]] = []
    slept: list[float] = []

    class OldDaemon:
        def request(self, op: str, **args: Any) -> dict[str, Any]:
            asked.append((op, args.get("wait")))
            return answers.pop(0)

    monkeypatch.setattr(time, "sleep", slept.append)
    assert client.wait_until_durable(OldDaemon(), ["x"], None, poll=0.2) == {"count": 0}  # type: ignore[arg-type]
    assert asked == [("flush", None), ("pending", client.LONG_POLL), ("pending", client.LONG_POLL)]
    assert len(slept) == 2 and all(0 < s <= 0.2 for s in slept)


# -- a real mount on S3, uploads held at the proxy ----------------------------------------------


@pytest.fixture
def s3(s3_endpoint: str, bucket: str) -> Iterator[S3Setup]:
    setup = S3Setup(s3_endpoint, bucket)
    yield setup
    setup.proxy.close()


def poll(mount: Mount, path: str) -> dict[str, Any]:
    return mount.request("pending", paths=[path])


@needs_fuse
def test_a_waiting_pending_answers_once_the_entry_is_durable_or_when_its_wait_is_up(
    gateway: GatewayFactory, s3: S3Setup, s3_env: dict[str, str], tmp_path: Path
) -> None:
    """``pending`` with ``wait`` is answered by the daemon once nothing asked about is pending
    (the state change wakes it), or with what is still pending when the wait is up; a bad
    ``wait`` is refused with what it must be."""
    cfg = write_toml(tmp_path / "c.toml", {"drain": {"settle": 600.0}})
    gw = s3_gateway(gateway, s3, cfg)
    put = s3.proxy.add(Fault("hold", "PUT", r"/held\.pt$"))
    (gw.mountpoint / "held.pt").write_bytes(b"x" * 1000)
    mount, _ = mount_of(gw.mountpoint)
    try:
        mount.request("flush", paths=["held.pt"])
        wait_for("the PUT to be held", lambda: put.hits == 1)
        up = mount.request("pending", paths=["held.pt"], wait=0.3)
        assert up["count"] == 1 and up["waited"] >= 0.3  # its wait was up first

        answers: list[dict[str, Any]] = []
        waiting = threading.Thread(
            target=lambda: answers.append(mount.request("pending", paths=["held.pt"], wait=60))
        )
        waiting.start()
        put.release()
        waiting.join(90)
        (done,) = answers
        assert done["count"] == 0 and done["waited"] < 60  # answered at durable, not at 60 s
        assert mount.request("pending", paths=["held.pt"], wait=60)["count"] == 0
        for bad in (-1, "soon", True):
            with pytest.raises(UserError, match="wait must be a number of seconds"):
                mount.request("pending", paths=["held.pt"], wait=bad)
    finally:
        put.release()


@needs_fuse
def test_pending_bytes_grow_while_a_multipart_upload_is_held_part_way(
    gateway: GatewayFactory, s3: S3Setup, s3_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    cfg = write_toml(
        tmp_path / "c.toml",
        {"drain": {"settle": 600.0, **PARTS}, "metrics": {"listen": f"127.0.0.1:{port}"}},
    )
    gw = s3_gateway(gateway, s3, cfg)
    part2 = s3.proxy.add(Fault("hold", "PUT", r"partNumber=2(&|$)"))
    part3 = s3.proxy.add(Fault("hold", "PUT", r"partNumber=3(&|$)"))
    data = os.urandom(20 * MiB)  # 4 parts of 5 MiB, one at a time
    (gw.mountpoint / "big.pt").write_bytes(data)
    mount, _ = mount_of(gw.mountpoint)
    try:
        first = mount.request("flush", paths=["big.pt"])
        assert first["bytes"] == 20 * MiB and first["bytes_sent"] == 0
        wait_for(
            "part 2 to be held", lambda: part2.hits == 1 and poll(mount, "big.pt")["bytes_sent"] > 0
        )
        one = poll(mount, "big.pt")
        assert (one["count"], one["bytes"], one["bytes_sent"]) == (1, 20 * MiB, 5 * MiB)
        assert one["bytes_in_flight"] == 5 * MiB  # part 2
        (up,) = valid(gw.status())["uploads"]
        assert (up["sent"], up["in_flight"], up["phase"]) == (5 * MiB, 5 * MiB, "sending")
        assert up["eta"] is not None

        part2.release()
        wait_for("part 2 to land", lambda: poll(mount, "big.pt")["bytes_sent"] > 5 * MiB)
        two = poll(mount, "big.pt")
        assert (two["count"], two["bytes"], two["bytes_sent"]) == (1, 20 * MiB, 10 * MiB)

        # The bar, fed these answers two (fake) seconds apart, shows bytes, rate and ETA.
        out, clock = Terminal(), Clock()
        bar = ProgressBar(out, clock=clock)
        bar(one)
        clock.now += 2
        bar(two)
        screen = out.getvalue().rsplit("\r", 1)[1]
        assert "10.0 MiB of 20.0 MiB" in screen and "2.5 MiB/s" in screen
        assert "ETA 4.0 s" in screen
    finally:
        part2.release()
        part3.release()
    wait_durable(gw.mountpoint / "big.pt", timeout=60)
    assert s3.body("big.pt") == data

    # No cache.size: the metric is there all the same, as the disk's room less the reserve.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    (line,) = [x for x in metrics.splitlines() if x.startswith("ckptgw_cache_limit_bytes{")]
    assert float(line.rsplit(" ", 1)[1]) > 0


@needs_fuse
def test_temp_fsync_rename_is_shown_under_the_new_name_and_counted_once(
    gateway: GatewayFactory, s3: S3Setup, s3_env: dict[str, str], tmp_path: Path
) -> None:
    gw = s3_gateway(
        gateway, s3, write_toml(tmp_path / "c.toml", {"drain": {"settle": 0.1, **PARTS}})
    )
    part2 = s3.proxy.add(Fault("hold", "PUT", r"model\.pt\.tmp\?.*partNumber=2(&|$)"))
    copy = s3.proxy.add(Fault("hold", "PUT", r"/step_1/model\.pt(\?|$)"))  # the move's copy
    ckpt = gw.mountpoint / "step_1"
    ckpt.mkdir()
    data = os.urandom(12 * MiB)
    with open(ckpt / "model.pt.tmp", "wb") as f:  # what torch.save + a careful trainer do
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        wait_for("the upload of model.pt.tmp to be held", lambda: part2.hits == 1)
        os.rename(ckpt / "model.pt.tmp", ckpt / "model.pt")

        st = valid(json.loads(gw.cli("status", "--json", str(gw.mountpoint)).stdout))
        (up,) = st["uploads"]
        assert up["path"] == str(ckpt / "model.pt")
        assert up["sent_as"] == str(ckpt / "model.pt.tmp")
        cp = checkpoint(st, "step_1")
        assert cp["state"] == "draining" and cp["files"] == 1
        assert cp["local_bytes"] == len(data) and cp["moves"] == 0
        assert st["dirty_bytes"] == len(data) == sum(c["local_bytes"] for c in st["checkpoints"])
        text = gw.cli("status", str(gw.mountpoint)).stdout
        assert f"upload    {ckpt / 'model.pt'} " in text and "1 files" not in text

        part2.release()
        wait_for("the upload to end", lambda: copy.hits == 1 and not gw.status()["uploads"])
        st = valid(gw.status())
        cp = checkpoint(st, "step_1")
        assert cp["state"] == "draining" and cp["files"] == 1
        assert (cp["local_bytes"], cp["moves"], cp["moving_bytes"]) == (0, 1, len(data))
        assert st["dirty_bytes"] == 0 == sum(c["local_bytes"] for c in st["checkpoints"])
        assert (st["queue"]["moves"], st["queue"]["moving_bytes"]) == (1, len(data))
        mount, _ = mount_of(gw.mountpoint)
        left = poll(mount, "step_1")
        assert (left["count"], left["bytes"], left["bytes_sent"], left["moves"]) == (
            1,
            len(data),
            len(data),
            1,
        )
        row = next(
            x for x in gw.cli("status", str(gw.mountpoint)).stdout.splitlines() if str(ckpt) in x
        )
        assert "1 move pending" in row
    finally:
        part2.release()
        copy.release()
    wait_durable(ckpt, timeout=60)
    assert s3.body("step_1/model.pt") == data and "step_1/model.pt.tmp" not in s3.keys
    log = (gw.cache_dir / "ckptgw.log").read_text()
    assert "moved step_1/model.pt.tmp -> step_1/model.pt" in log


def test_the_summary_of_a_local_store_never_says_plain_durable() -> None:
    out, clock = io.StringIO(), Clock()
    bar = ProgressBar(out, clock=clock)
    bar({**answer(3 * MiB, 0), "store_local": True})
    bar({**answer(0, 0, count=0), "store_local": True})
    bar.close()
    assert out.getvalue() == "ckptgw: 1 file, 3.0 MiB durable (local store) in 0.0 s\n"

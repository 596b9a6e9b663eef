"""Operating a gateway: status (JSON against its schema, during a real drain), the metrics
endpoint, flush and wait, umount that drains, SIGTERM with pending data, the preemption
watcher against a stand-in metadata service on loopback, and the CLI's errors when no daemon
runs."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import stat
import threading
import time
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import boto3
import jsonschema
import pytest

from ckptgw.gateway.client import NotDurable, wait_durable
from ckptgw.gateway.harness import Gateway
from ckptgw.gateway.registry import alive
from ckptgw.store.faultproxy import Fault, FaultProxy
from tests.conftest import CheckedGateway, GatewayFactory, needs_fuse
from tests.s3server import free_port
from tests.test_cli import assert_one_line_error, ckptgw
from tests.test_drain import file_store_objects, wait_for
from tests.test_readthrough import write_toml

pytestmark = [pytest.mark.mount, needs_fuse]

SCHEMA = json.loads(resources.files("gateway.daemon").joinpath("status.schema.json").read_text())
SLOW: dict[str, object] = {
    "settle": 600.0
}  # nothing drains by itself during a test: only flush, wait, signals


def valid(doc: dict[str, Any]) -> dict[str, Any]:
    jsonschema.validate(doc, SCHEMA)
    return dict(doc)


def checkpoint(status: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        c for c in status["checkpoints"] if c["path"].endswith("/" + name)
    ]
    assert len(found) == 1, status["checkpoints"]
    return found[0]


def wait_exit(pid: int, timeout: float = 60) -> None:
    wait_for(f"daemon {pid} to exit", lambda: not alive(pid), timeout)


class S3Setup:
    """A gateway on the S3 server behind a fault proxy, and a direct view of the bucket."""

    def __init__(self, endpoint: str, bucket: str) -> None:
        self.endpoint, self.bucket = endpoint, bucket
        self.proxy = FaultProxy(int(endpoint.rsplit(":", 1)[1]))
        self.s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")

    @property
    def keys(self) -> set[str]:
        listed = self.s3.list_objects_v2(Bucket=self.bucket).get("Contents", [])
        return {o["Key"] for o in listed}

    def body(self, key: str) -> bytes:
        data: bytes = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return data


@pytest.fixture
def s3(s3_endpoint: str, bucket: str) -> Iterator[S3Setup]:
    setup = S3Setup(s3_endpoint, bucket)
    yield setup
    setup.proxy.close()


def s3_gateway(
    gateway: GatewayFactory, s3: S3Setup, config: Path, name: str = "gw"
) -> CheckedGateway:
    return gateway(
        name, "--config", str(config), "--endpoint-url", s3.proxy.url, store=f"s3://{s3.bucket}/"
    )


# -- status and metrics ----------------------------------------------------------------------------


def test_status_and_metrics_during_a_real_drain(
    gateway: GatewayFactory, s3: S3Setup, s3_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    cfg = write_toml(
        tmp_path / "c.toml",
        {
            "drain": {"settle": 0.1, "part_size": "5MiB", "multipart_threshold": "5MiB"},
            "metrics": {"listen": f"127.0.0.1:{port}"},
        },
    )
    gw = s3_gateway(gateway, s3, cfg)
    s3.proxy.add(Fault("stall", "PUT", r"partNumber=3(&|$)", seconds=3))
    ckpt = gw.mountpoint / "run" / "step_200"
    ckpt.mkdir(parents=True)
    older = gw.mountpoint / "run" / "step_100"
    older.mkdir()
    (older / "model.pt").write_bytes(b"x" * 1000)
    wait_for("step_100 to drain", lambda: "run/step_100/model.pt" in s3.keys)
    data = os.urandom(20 << 20)
    (ckpt / "model.pt").write_bytes(data)

    def uploading() -> bool:
        return bool(gw.status()["uploads"])

    wait_for("the upload to show in status", uploading)
    st = valid(gw.status())
    assert st["mountpoint"] == str(gw.mountpoint) and st["store"] == f"s3://{s3.bucket}/"
    (up,) = st["uploads"]
    assert up["path"] == str(ckpt / "model.pt") and up["size"] == len(data)
    assert 0 <= up["sent"] < len(data)
    assert st["dirty_bytes"] == len(data)
    assert st["queue"]["files"] == 1 and st["queue"]["bytes"] == len(data)
    assert st["queue"]["oldest_dirty_age"] is not None
    newest, second = st["checkpoints"][:2]
    assert newest["path"] == str(ckpt) and newest["step"] == 200
    assert newest["state"] == "draining" and newest["local_bytes"] == len(data)
    assert newest["local_age"] is not None and newest["local_age"] >= 0  # exposed since
    assert newest["replacing"] == 0 and st["queue"]["replacing"] == 0
    assert second["path"] == str(older) and second["state"] == "durable"
    assert second["local_age"] is None
    during = scrape(port)
    series = f'{{checkpoint="{ckpt}",mountpoint="{gw.mountpoint}"}}'
    assert during[f"ckptgw_checkpoint_local_bytes{series}"] == len(data)
    assert during[f"ckptgw_checkpoint_local_age_seconds{series}"] >= 0
    assert not any(str(older) in k for k in during)  # durable: no series

    text = gw.cli("status", str(gw.mountpoint)).stdout
    assert str(ckpt) in text and "draining" in text and "\x1b[" not in text  # no colour in a pipe

    wait_for("step_200 to drain", lambda: gw.status()["dirty_bytes"] == 0)
    st = valid(gw.status())
    assert checkpoint(st, "step_200")["state"] == "durable"
    assert st["uploads"] == [] and st["queue"]["oldest_dirty_age"] is None
    assert st["drained"]["bytes"] >= len(data) + 1000 and st["drained"]["files"] == 2
    assert s3.body("run/step_200/model.pt") == data
    assert s3_env["AWS_SECRET_ACCESS_KEY"] not in json.dumps(st)

    samples = scrape(port)
    label = f'{{mountpoint="{gw.mountpoint}"}}'
    assert samples[f"ckptgw_drained_bytes_total{label}"] >= len(data) + 1000
    assert samples[f"ckptgw_written_bytes_total{label}"] >= len(data) + 1000
    assert samples[f"ckptgw_dirty_bytes{label}"] == 0
    assert samples[f"ckptgw_upload_part_seconds_count{label}"] >= 5  # 4 parts + 1 PUT
    slowest = f'ckptgw_upload_part_seconds_bucket{{le="2.5",mountpoint="{gw.mountpoint}"}}'
    assert samples[slowest] < samples[f"ckptgw_upload_part_seconds_count{label}"]  # the stall
    assert samples[f"ckptgw_cache_used_bytes{label}"] >= len(data)
    assert samples[f"ckptgw_lost_wakeups_total{label}"] == 0
    assert not any("ckptgw_checkpoint_local" in k for k in samples)  # all durable now


def scrape(port: int) -> dict[str, float]:
    """The metrics endpoint's samples: series (name and labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line and not line.startswith("#")
    }


def test_status_counts_retries_and_shows_the_last_error(
    gateway: GatewayFactory, s3: S3Setup, s3_env: dict[str, str], tmp_path: Path
) -> None:
    gw = s3_gateway(gateway, s3, write_toml(tmp_path / "c.toml", {"drain": {"settle": 0.1}}))
    s3.proxy.add(Fault("slowdown", "PUT", count=2))
    (gw.mountpoint / "a.pt").write_bytes(b"a" * 100)
    wait_for("a.pt to drain", lambda: "a.pt" in s3.keys)
    st = valid(gw.status())
    assert st["retries"] == 2 and st["errors"] == {"SlowDown": 2}
    assert "a.pt" in st["last_error"] and st["last_error_at"] > 0


# -- flush and wait --------------------------------------------------------------------------------


def test_flush_and_wait_drain_ahead_of_the_settle_delay(
    gateway: GatewayFactory, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    gw = gateway("gw", "--config", str(write_toml(tmp_path / "c.toml", {"drain": SLOW})))
    (gw.mountpoint / "step_1").mkdir()
    (gw.mountpoint / "step_1" / "model.pt").write_bytes(b"m" * 5000)
    (gw.mountpoint / "step_1" / "optim.pt").write_bytes(b"o" * 7000)
    (gw.mountpoint / "other.txt").write_bytes(b"not flushed")
    st = valid(gw.status())
    assert checkpoint(st, "step_1")["state"] == "local-only"
    assert st["dirty_bytes"] == 5000 + 7000 + 11

    r = gw.cli("flush", str(gw.mountpoint / "step_1"), "--wait", "--timeout", "60")
    assert r.returncode == 0, r.stderr
    assert set(file_store_objects(store)) == {"step_1/model.pt", "step_1/optim.pt"}  # no marker
    st = valid(gw.status())
    assert checkpoint(st, "step_1")["state"] == "durable"
    assert st["dirty_bytes"] == 11  # other.txt was not asked for

    # A file held open for writing cannot be durable: wait times out and says so.
    with open(gw.mountpoint / "open.pt", "wb") as f:
        f.write(b"still writing")
        f.flush()
        r = gw.cli("wait", str(gw.mountpoint / "open.pt"), "--timeout", "0.5", check=False)
        assert r.returncode == 3
        assert r.stdout.count("\n") == 1 and "open.pt" in r.stdout
        assert "open for writing" in r.stdout
        assert_one_line_error(r, "not durable after 0.5 s: 1 file,")
        with pytest.raises(NotDurable) as e:
            wait_durable(gw.mountpoint / "open.pt", timeout=0.2)
        assert isinstance(e.value, TimeoutError) and e.value.pending["count"] == 1
    wait_durable(gw.mountpoint / "open.pt", timeout=60)  # closed: drains at once
    assert file_store_objects(store)["open.pt"] == b"still writing"

    r = gw.cli("flush")  # everything, without waiting
    assert r.returncode == 0, r.stderr
    wait_for("other.txt", lambda: "other.txt" in file_store_objects(store))
    assert valid(gw.status())["dirty_bytes"] == 0

    r = gw.cli("wait", str(gw.mountpoint / "nope"), check=False)
    assert_one_line_error(r, "no such file")


def test_umount_drains_first_and_refuses_to_drop_data(
    gateway: GatewayFactory, s3: S3Setup, s3_env: dict[str, str], tmp_path: Path
) -> None:
    gw = s3_gateway(gateway, s3, write_toml(tmp_path / "c.toml", {"drain": SLOW}))
    (gw.mountpoint / "first.pt").write_bytes(b"1" * 1000)
    r = gw.cli("umount", str(gw.mountpoint), check=False)
    assert r.returncode == 0, r.stderr
    assert s3.body("first.pt") == b"1" * 1000  # drained before the unmount, settle or not
    gw.start()

    down = s3.proxy.add(Fault("slowdown", "PUT", count=10**6))  # the store refuses every write
    (gw.mountpoint / "second.pt").write_bytes(b"2" * 1000)
    r = gw.cli("umount", str(gw.mountpoint), "--timeout", "1", check=False)
    assert_one_line_error(r, "not in the store yet; not unmounting", "--force")
    assert (gw.mountpoint / "second.pt").read_bytes() == b"2" * 1000  # still mounted
    r = gw.cli("umount", str(gw.mountpoint), "--timeout", "1", "--force", check=False)
    assert r.returncode == 0, r.stderr
    assert "stay in the cache" in r.stderr and str(gw.cache_dir) in r.stderr
    assert "second.pt" not in s3.keys

    down.count = 0  # the store is back: the next mount of the cache drains what was left
    gw.start()
    wait_for("second.pt after the remount", lambda: "second.pt" in s3.keys)
    assert s3.body("second.pt") == b"2" * 1000


# -- SIGTERM ---------------------------------------------------------------------------------------


def test_sigterm_drains_newest_first_and_keeps_serving_writes(
    gateway: GatewayFactory, s3: S3Setup, s3_env: dict[str, str], tmp_path: Path
) -> None:
    one_at_a_time = {**SLOW, "max_files": 1, "max_parts": 1}  # so that the order shows
    gw = s3_gateway(gateway, s3, write_toml(tmp_path / "c.toml", {"drain": one_at_a_time}))
    for step in (1, 2, 3):
        d = gw.mountpoint / f"step_{step}"
        d.mkdir()
        (d / "model.pt").write_bytes(bytes([step]) * 4000)
        time.sleep(0.02)  # distinct mtimes: the order the emergency drain goes by
    stall = s3.proxy.add(Fault("stall", "PUT", count=1, seconds=2))
    assert gw.pid is not None
    pid = gw.pid
    os.kill(pid, signal.SIGTERM)
    wait_for("the stopping mode", lambda: gw.status()["mode"] == "stopping")
    (gw.mountpoint / "emergency.pt").write_bytes(b"written after SIGTERM")  # still served
    wait_exit(pid)
    assert s3.keys == {  # no markers: each directory holds a file (tests/test_dirmarkers.py)
        *("step_1/model.pt", "step_2/model.pt", "step_3/model.pt", "emergency.pt"),
    }
    assert s3.body("emergency.pt") == b"written after SIGTERM"
    puts = [p.split(f"/{s3.bucket}/", 1)[1] for m, p, _ in s3.proxy.log if m == "PUT"]
    assert stall.hits == 1
    files = [p for p in puts if not p.endswith("/")]  # the markers are tiny: any order
    assert files[:3] == ["step_3/model.pt", "step_2/model.pt", "step_1/model.pt"]  # newest first
    log = (gw.cache_dir / "ckptgw.log").read_text()
    assert "received SIGTERM: draining" in log and "everything is in the store" in log


def test_sigterm_at_the_deadline_logs_what_is_left_for_the_next_mount(
    gateway: GatewayFactory, s3: S3Setup, s3_env: dict[str, str], tmp_path: Path
) -> None:
    cfg = write_toml(tmp_path / "c.toml", {"drain": SLOW, "shutdown": {"deadline": 1.0}})
    gw = s3_gateway(gateway, s3, cfg)
    down = s3.proxy.add(Fault("slowdown", "PUT", count=10**6))
    (gw.mountpoint / "step_7").mkdir()
    (gw.mountpoint / "step_7" / "model.pt").write_bytes(b"7" * 3000)
    assert gw.pid is not None
    os.kill(gw.pid, signal.SIGTERM)
    wait_exit(gw.pid)
    log = (gw.cache_dir / "ckptgw.log").read_text()
    assert f"not durable: {gw.mountpoint}/step_7/model.pt (3000 bytes" in log
    # step_7 holds a file: its drain needs no request (no marker), so it is durable
    assert f"not durable: {gw.mountpoint}/step_7 (" not in log
    assert "1 file (3000 bytes) not in the store" in log
    assert s3.keys == set()

    down.count = 0
    gw.start()
    wait_for("step_7 after the remount", lambda: "step_7/model.pt" in s3.keys)
    assert s3.body("step_7/model.pt") == b"7" * 3000


# -- preemption ------------------------------------------------------------------------------------


def _lower(headers: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in headers.items()}


class MetadataService:
    """A stand-in for the cloud's instance metadata service, on loopback."""

    PATHS = {
        "aws": "/latest/meta-data/spot/instance-action",
        "gcp": "/computeMetadata/v1/instance/preempted",
        "azure": "/metadata/scheduledevents",
    }

    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.preempted = False
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self) -> None:
                outer.requests.append(("PUT", self.path, _lower(self.headers)))
                ok = self.path == "/latest/api/token"
                self._reply(200 if ok else 404, b"tok-123" if ok else b"")

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.path, _lower(self.headers)))
                wrong = self.path.split("?")[0] != outer.PATHS[outer.provider]
                if wrong or (outer.provider == "aws" and not outer.preempted):
                    self._reply(404, b"")
                elif outer.provider == "aws":
                    notice = {"action": "terminate", "time": "2026-11-22T08:00:00Z"}
                    self._reply(200, json.dumps(notice).encode())
                elif outer.provider == "gcp":
                    self._reply(200, b"TRUE" if outer.preempted else b"FALSE")
                else:
                    events = [{"EventType": "Preempt", "NotBefore": "soon"}]
                    body = {"Events": events if outer.preempted else []}
                    self._reply(200, json.dumps(body).encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{self.PATHS[provider]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_a_preemption_notice_drains_now_and_runs_the_command(
    gateway: GatewayFactory, tmp_path: Path, provider: str
) -> None:
    mds = MetadataService(provider)
    try:
        out = tmp_path / "notice.txt"
        cfg = write_toml(
            tmp_path / "c.toml",
            {
                "drain": SLOW,
                "preemption": {
                    "provider": provider,
                    "url": mds.url,
                    "interval": 0.1,
                    "command": f'echo "$CKPTGW_MOUNTPOINT $CKPTGW_NOTICE" > {out}',
                },
            },
        )
        gw = gateway("gw", "--config", str(cfg))
        (gw.mountpoint / "step_9").mkdir()
        (gw.mountpoint / "step_9" / "model.pt").write_bytes(b"9" * 2000)
        wait_for("a few polls", lambda: len(mds.requests) >= 3)
        st = valid(gw.status())
        assert st["mode"] == "serving" and st["preemption"]["notice"] is None
        assert checkpoint(st, "step_9")["state"] == "local-only"

        mds.preempted = True
        wait_for("the drain after the notice", lambda: gw.status()["dirty_bytes"] == 0)
        wait_for("the command", lambda: out.exists() and out.read_text().strip() != "")
        st = valid(gw.status())
        assert st["mode"] == "emergency-drain" and st["preemption"]["notice"]
        assert st["preemption"]["command_exit"] == 0
        assert out.read_text().startswith(f"{gw.mountpoint} ")
        assert file_store_objects(tmp_path / "store") == {"step_9/model.pt": b"9" * 2000}
        if provider == "aws":
            assert "terminate" in st["preemption"]["notice"]
            gets = [h for m, p, h in mds.requests if m == "GET"]
            assert all(h.get("x-aws-ec2-metadata-token") == "tok-123" for h in gets)
        if provider == "gcp":
            assert all(h.get("metadata-flavor") == "Google" for _, _, h in mds.requests)
        # Writes keep working after the notice (the trainer saves its last checkpoint).
        (gw.mountpoint / "last.pt").write_bytes(b"final")
        wait_for("last.pt", lambda: "last.pt" in file_store_objects(tmp_path / "store"))
    finally:
        mds.close()


# -- the CLI without a daemon ----------------------------------------------------------------------


def test_cli_without_a_daemon_says_so_in_one_line(
    tmp_path: Path, runtime_dir: Path, gateway: GatewayFactory
) -> None:
    env = {"CKPTGW_RUNTIME_DIR": str(runtime_dir)}
    assert_one_line_error(ckptgw("status", env=env), "no ckptgw gateway is running")
    assert_one_line_error(ckptgw("flush", env=env), "no ckptgw gateway is running")
    assert_one_line_error(ckptgw("status", str(tmp_path), env=env), "is not on a ckptgw mount")
    assert_one_line_error(ckptgw("wait", str(tmp_path), env=env), "is not on a ckptgw mount")
    assert_one_line_error(
        ckptgw("flush", "--timeout", "1", str(tmp_path), env=env), "--timeout needs --wait"
    )

    gw = gateway("gw")
    sock = Path(gw.status()["cache"]["dir"]) / "control.sock"
    assert (sock.stat().st_mode & 0o777) == 0o600
    assert (gw.cache_dir.stat().st_mode & 0o777) == 0o700
    assert_one_line_error(
        ckptgw("status", str(gw.mountpoint / "sub"), env=env), "is not a ckptgw mountpoint"
    )
    with socket.socket(socket.AF_UNIX) as s:  # a client from the future is told, not ignored
        s.connect(str(sock))
        s.sendall(b'{"version": 99, "op": "status"}\n')
        reply = json.loads(s.makefile().readline())
    assert reply["ok"] is False and "protocol version 99 is not supported" in reply["error"]

    elsewhere = {"CKPTGW_RUNTIME_DIR": str(tmp_path / "other-run")}  # e.g. another user's
    r = ckptgw("status", str(gw.mountpoint), env=elsewhere)
    assert_one_line_error(r, "is registered in", "same CKPTGW_RUNTIME_DIR")

    gw.kill()  # the daemon dies; the mount is stale
    r = ckptgw("status", str(gw.mountpoint), env=env)
    assert_one_line_error(r, "not running")
    r = ckptgw("wait", str(gw.mountpoint / "x"), env=env)
    assert_one_line_error(r, "not running")


def test_status_of_every_mount(gateway: GatewayFactory, runtime_dir: Path) -> None:
    a, b = gateway("a"), gateway("b")
    (a.mountpoint / "x.pt").write_bytes(b"x")
    r = a.cli("status", "--json")
    doc = json.loads(r.stdout)
    assert doc["version"] == 1
    assert sorted(m["mountpoint"] for m in doc["mounts"]) == sorted(
        [str(a.mountpoint), str(b.mountpoint)]
    )
    for m in doc["mounts"]:
        valid(m)
    text = a.cli("status").stdout
    assert str(a.mountpoint) in text and str(b.mountpoint) in text


@pytest.mark.mount
def test_control_socket_works_under_a_cache_dir_too_deep_for_a_socket_address(
    tmp_path: Path,
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)  # cache_dir/control.sock is over 107 bytes
    gw = Gateway(
        tmp_path / "mnt",
        deep / "cache",
        f"file://{tmp_path / 'store'}",
        env={"CKPTGW_RUNTIME_DIR": str(tmp_path / ("r" * 90))},
    )
    with gw:
        sock = deep / "cache" / "control.sock"
        assert len(os.fsencode(sock)) > 107
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600  # in the cache dir, private
        (gw.mountpoint / "a.pt").write_bytes(b"x")
        gw.cli("flush", str(gw.mountpoint / "a.pt"), "--wait", "--timeout", "30")
        assert gw.status()["dirty_bytes"] == 0

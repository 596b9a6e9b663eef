"""Many gateways, one bucket, a store that takes only so many requests a second: real mounts
on the moto server behind the fault proxy's rate limit (ckptgw/store/faultproxy.py RateLimit: token
buckets, 503 SlowDown when empty). What is asserted: nothing is lost, every object is
byte-exact, the gateways slow down (their pace, in status, the text and the schema), and a
fresh node under a read limit reads what it was asked for rather than the whole checkpoint.
The pace's rules on a fake clock: tests/test_pacing.py; the fleet measured: bench/fleet.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import boto3
import jsonschema
import pytest

from ckptgw.store.faultproxy import FaultProxy, RateLimit
from tests.conftest import GatewayFactory, any_data_path, needs_fuse
from tests.s3server import free_port
from tests.test_drain import wait_for
from tests.test_operate import scrape
from tests.test_readthrough import write_toml

pytestmark = [pytest.mark.mount, needs_fuse, any_data_path]

SCHEMA = json.loads(resources.files("gateway.daemon").joinpath("status.schema.json").read_text())


def content(rank: int, n: int) -> bytes:
    return (f"rank {rank} shard {n} ".encode() * 4096)[: 64 << 10]


@pytest.fixture
def limited(s3_endpoint: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(int(s3_endpoint.rsplit(":", 1)[1]), limit=RateLimit())
    yield proxy
    proxy.close()


def objects(s3: object, bucket: str, prefix: str) -> dict[str, int]:
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])  # type: ignore[attr-defined]
    return {o["Key"]: o["Size"] for o in listed}


def test_a_fleet_behind_a_write_limit_loses_nothing_and_slows_down(
    gateway: GatewayFactory,
    limited: FaultProxy,
    s3_endpoint: str,
    bucket: str,
    tmp_path: Path,
) -> None:
    assert limited.limit is not None
    limited.limit.writes, limited.limit.burst = 8.0, 1.0
    limited.limit.reset()
    port = free_port()
    gws = []
    for r in range(3):  # the first serves its metrics
        table: dict[str, dict[str, object]] = {"drain": {"settle": 0.1}}
        if r == 0:
            table["metrics"] = {"listen": f"127.0.0.1:{port}"}
        cfg = write_toml(tmp_path / f"c{r}.toml", table)
        gws.append(
            gateway(
                f"gw{r}",
                "--config",
                str(cfg),
                "--endpoint-url",
                limited.url,
                store=f"s3://{bucket}/",
            )
        )
    files = 10

    def save(rank: int) -> None:
        d = gws[rank].mountpoint / "step_1"
        d.mkdir(exist_ok=True)
        for n in range(files):
            (d / f"rank{rank}_{n}.distcp").write_bytes(content(rank, n))

    threads = [threading.Thread(target=save, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    want = {f"step_1/rank{r}_{n}.distcp": content(r, n) for r in range(3) for n in range(files)}
    wait_for(
        "the fleet's files to be durable",
        lambda: all(objects(s3, bucket, "step_1/").get(k) == len(v) for k, v in want.items()),
        timeout=120,
    )
    for key, data in want.items():
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data
    assert limited.limit.refused["writes"] > 0  # the fleet asked for more than the store took

    docs = [gw.status() for gw in gws]
    for doc in docs:
        jsonschema.validate(doc, SCHEMA)
        assert doc["store_requests"]["pacing"]["adaptive"] is True
    refused = sum(d["store_requests"]["pacing"]["writes"]["refused"] for d in docs)
    assert refused == limited.limit.refused["writes"]  # every refusal reached a pace
    slowed = [
        (gw, d)
        for gw, d in zip(gws, docs, strict=True)
        if d["store_requests"]["pacing"]["writes"]["cuts"]
    ]
    assert slowed  # at least one gateway cut its rate
    samples = scrape(port)
    series = f'endpoint="{limited.url}",kind="writes",mountpoint="{gws[0].mountpoint}"'
    pace0 = docs[0]["store_requests"]["pacing"]["writes"]
    assert samples[f"ckptgw_store_refused_total{{{series}}}"] == pace0["refused"]
    assert samples[f"ckptgw_store_rate_cuts_total{{{series}}}"] == pace0["cuts"]
    limit = samples[f"ckptgw_store_rate_limit{{{series}}}"]
    assert limit == (-1 if pace0["rate"] is None else pace0["rate"])  # no requests since
    gw, doc = slowed[0]
    assert doc["store_requests"]["pacing"]["writes"]["rate"] > 0
    assert doc["errors"].get("SlowDown", 0) > 0 and doc["dirty_bytes"] == 0
    text = gw.cli("status", str(gw.mountpoint)).stdout
    assert "pacing    writes" in text and "the store refused" in text


def test_a_fresh_node_under_a_read_limit_fetches_what_is_read_not_the_whole_checkpoint(
    gateway: GatewayFactory,
    limited: FaultProxy,
    s3_endpoint: str,
    bucket: str,
    tmp_path: Path,
) -> None:
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    files = 30
    for rank in range(2):
        for n in range(files):
            s3.put_object(Bucket=bucket, Key=f"step_1/rank{rank}_{n}.distcp", Body=content(rank, n))
    assert limited.limit is not None
    limited.limit.reads, limited.limit.burst = 6.0, 1.0
    limited.limit.reset()
    cfg = write_toml(tmp_path / "c.toml", {"cache": {"prefetch": True}})
    gw = gateway(
        "fresh", "--config", str(cfg), "--endpoint-url", limited.url, store=f"s3://{bucket}/"
    )
    limited.log.clear()
    d = gw.mountpoint / "step_1"
    for n in range(files):  # rank 0 reads its shards
        assert (d / f"rank0_{n}.distcp").read_bytes() == content(0, n)
    doc = gw.status()
    jsonschema.validate(doc, SCHEMA)
    reads = doc["store_requests"]["pacing"]["reads"]
    assert limited.limit.refused["reads"] > 0 and reads["refused"] == limited.limit.refused["reads"]
    assert reads["rate"] is not None
    others = {
        p for m, p, what in limited.log if m == "GET" and what == "ok" and "/step_1/rank1_" in p
    }
    assert len(others) < files  # the warm-up of the whole checkpoint yielded to the reads asked
    for w in doc["warmups"]:
        assert w["fetched_files"] + w["cached_files"] + w["held_files"] <= w["files"]

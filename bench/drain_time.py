"""Time to durable: from the return of a 1 GiB save (temp + fsync + rename) through the mount to
the object being complete in the bucket, against boto3's ``upload_file`` of the same bytes to
the same S3 server (moto on loopback) with the same part size and concurrency. Also CPU
seconds per GiB: the gateway daemon's during the drain, against boto3's in-process.

    python -m bench.drain_time [--size-mib 1024] [--runs 3]

Targets (issue 3): time to durable at most 1.05x boto3; CPU per GiB at most boto3's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3
import torch
import xxhash
from boto3.s3.transfer import TransferConfig
from botocore.config import Config as BotoConfig

from bench.results import save
from bench.save_stall import save_atomic, state_dict
from gateway.harness import Gateway, exit_on_sigterm
from tests.s3server import moto_server

PART = 16 << 20
CONCURRENCY = 8
CREDS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_object(s3: Any, key: str, size: int) -> dict[str, Any]:
    """Poll until ``bench/key`` holds ``size`` bytes; its HEAD. An object appears only when
    complete (PUT, multipart, copy)."""
    while True:
        try:
            h: dict[str, Any] = s3.head_object(Bucket="bench", Key=key)
            if h["ContentLength"] == size:
                return h
        except s3.exceptions.ClientError:
            pass
        time.sleep(0.1)  # polling loads the (single-process) server too


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    os.environ.update(CREDS)
    work = Path(tempfile.mkdtemp(prefix="ckptgw-drain-", dir=args.workdir))
    sd = state_dict(args.size_mib << 20)
    res: dict[str, list[float]] = {
        "gateway_s": [],
        "boto3_s": [],
        "gateway_cpu": [],
        "boto3_cpu": [],
    }
    try:
        with moto_server() as endpoint:
            # boto3 with the gateway's settings: no payload signing, same part size and threads.
            s3 = boto3.client(
                "s3",
                endpoint_url=endpoint,
                config=BotoConfig(s3={"payload_signing_enabled": False}),
            )
            s3.create_bucket(Bucket="bench")
            cfg = work / "gw.toml"
            cfg.write_text(f'[drain]\npart_size = "{PART >> 20}MiB"\nmax_parts = {CONCURRENCY}\n')
            gw = Gateway(
                work / "mnt",
                work / "cache",
                "s3://bench/gw/",
                "--endpoint-url",
                endpoint,
                "--config",
                str(cfg),
                env={"CKPTGW_RUNTIME_DIR": str(work / "run")},
            )
            local = work / "local.pt"
            torch.save(sd, local)
            size = local.stat().st_size
            tc = TransferConfig(
                multipart_threshold=PART, multipart_chunksize=PART, max_concurrency=CONCURRENCY
            )
            with gw:
                assert gw.pid is not None
                for i in range(args.runs):
                    key = f"step_{i}/ckpt.pt"
                    (gw.mountpoint / f"step_{i}").mkdir()
                    save_atomic(sd, gw.mountpoint / key)
                    t0, c0 = time.perf_counter(), cpu_seconds(gw.pid)
                    written = (gw.mountpoint / key).stat().st_size
                    h = wait_for_object(s3, f"gw/{key}", written)
                    g_time, g_cpu = time.perf_counter() - t0, cpu_seconds(gw.pid) - c0
                    digest = xxhash.xxh3_128_hexdigest((gw.mountpoint / key).read_bytes())
                    assert h["Metadata"]["xxh3-128"] == digest, "the object is not what was saved"
                    listed = [
                        o["Key"]
                        for o in s3.list_objects_v2(Bucket="bench", Prefix="gw/").get(
                            "Contents", []
                        )
                    ]
                    assert listed == [f"gw/{key}"], f"unexpected objects: {listed}"
                    t0, c0 = time.perf_counter(), time.process_time()
                    s3.upload_file(str(local), "bench", f"boto3/{key}", Config=tc)
                    b_time, b_cpu = time.perf_counter() - t0, time.process_time() - c0
                    for k, v in (
                        ("gateway_s", g_time),
                        ("boto3_s", b_time),
                        ("gateway_cpu", g_cpu),
                        ("boto3_cpu", b_cpu),
                    ):
                        res[k].append(v)
                    print(
                        f"  run {i}: gateway durable after {g_time:6.2f} s ({g_cpu:5.2f} CPU s),"
                        f" boto3 upload_file {b_time:6.2f} s ({b_cpu:5.2f} CPU s)",
                        flush=True,
                    )
                    os.unlink(gw.mountpoint / key)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    gib = size / (1 << 30)
    t_ratio = med["gateway_s"] / med["boto3_s"]
    c_ratio = med["gateway_cpu"] / med["boto3_cpu"]
    print()
    print(
        f"{'metric (median of ' + str(args.runs) + ')':36} {'gateway':>9} {'boto3':>9} "
        f"{'ratio':>6} {'target':>7}"
    )
    print(
        f"{'time to durable after the save (s)':36} {med['gateway_s']:9.2f} "
        f"{med['boto3_s']:9.2f} {t_ratio:6.2f} {'<= 1.05':>7}  "
        f"{'MET' if t_ratio <= 1.05 else 'MISSED'}"
    )
    print(
        f"{'CPU seconds per GiB drained':36} {med['gateway_cpu'] / gib:9.2f} "
        f"{med['boto3_cpu'] / gib:9.2f} {c_ratio:6.2f} {'<= 1.00':>7}  "
        f"{'MET' if c_ratio <= 1.0 else 'MISSED'}"
    )
    save(
        "drain_time",
        {
            "bytes": size,
            "part_size": PART,
            "concurrency": CONCURRENCY,
            "samples": res,
            "median": med,
            "time_ratio": t_ratio,
            "cpu_ratio": c_ratio,
        },
    )


if __name__ == "__main__":
    main()

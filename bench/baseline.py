"""The limit on the S3 side: boto3's transfer manager moving the same bytes to or from the same
server, in a process of its own so that its time, CPU and peak memory are its own.

    python -m bench.baseline upload|download --endpoint URL --bucket B --chunk BYTES
                             --concurrency N KEY=FILE [KEY=FILE ...]

All the pairs go through one transfer manager at once (its ``max_concurrency`` shared, as the
gateway shares ``max_parts``). Prints one JSON line: ``seconds``, ``cpu_seconds``,
``peak_rss_bytes``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config as BotoConfig
from s3transfer.manager import TransferManager

from bench.procs import peak_rss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op", choices=["upload", "download"])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--chunk", type=int, required=True)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("pairs", nargs="+", metavar="KEY=FILE")
    args = ap.parse_args(argv)
    # The gateway's settings: no payload signing, the same part size and parts in flight.
    client = boto3.client(
        "s3",
        endpoint_url=args.endpoint,
        config=BotoConfig(
            s3={"payload_signing_enabled": False},
            max_pool_connections=max(10, args.concurrency),
        ),
    )
    config = TransferConfig(
        multipart_threshold=args.chunk,
        multipart_chunksize=args.chunk,
        max_concurrency=args.concurrency,
    )
    pairs = [p.split("=", 1) for p in args.pairs]
    t0, c0 = time.perf_counter(), time.process_time()
    with TransferManager(client, config) as manager:
        futures = [
            manager.upload(f, args.bucket, k)
            if args.op == "upload"
            else manager.download(args.bucket, k, f)
            for k, f in pairs
        ]
        for fut in futures:
            fut.result()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    # This process's own high-water mark. Not getrusage: on Linux its ru_maxrss keeps the
    # parent's at exec (a 2 GiB parent made a 13 MiB child report 2,061 MiB).
    rss = peak_rss(os.getpid())
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "peak_rss_bytes": rss}))
    return 0


def run(
    op: str, endpoint: str, bucket: str, chunk: int, concurrency: int, pairs: dict[str, str]
) -> dict[str, Any]:
    """Run it in a child process; its JSON result."""
    cmd = [
        sys.executable,
        "-m",
        "bench.baseline",
        op,
        "--endpoint",
        endpoint,
        "--bucket",
        bucket,
        "--chunk",
        str(chunk),
        "--concurrency",
        str(concurrency),
        *(f"{k}={f}" for k, f in pairs.items()),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"boto3 {op} failed: {r.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    sys.exit(main())

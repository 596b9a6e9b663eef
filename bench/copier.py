"""The local twin of the libnfs test client's ``put`` (tests/nfs/client.c), for the NFS bench:
the same writes (1 MiB each), fsync, close and rename, into a local path (the disk or the FUSE
mount), driven the same way: one command per line on stdin, one answer line on stdout.

    python -m bench.copier        then: put LOCAL TMP FINAL   ->   ok BYTES  |  err CODE MESSAGE
"""

from __future__ import annotations

import os
import sys

CHUNK = 1 << 20  # as the C client's


def put(local: str, tmp: str, final: str) -> int:
    total = 0
    src = os.open(local, os.O_RDONLY)
    try:
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while block := os.read(src, CHUNK):
                view = memoryview(block)
                while view:
                    view = view[os.write(dst, view) :]
                total += len(block)
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    if final != "-":
        os.rename(tmp, final)
    return total


def main() -> int:
    print("ok ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["quit"]:
            break
        if len(words) != 4 or words[0] != "put":
            print(f"err -22 unknown command or wrong arguments: {line.strip()}", flush=True)
            continue
        try:
            print(f"ok {put(*words[1:])}", flush=True)
        except OSError as e:
            print(f"err {-(e.errno or 5)} {e.strerror}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

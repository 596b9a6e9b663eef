"""Open the store a URL names, with the part workers that send its parts if asked for."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from ckptgw.store.deadlines import Deadlines
from ckptgw.store.files import FileStore
from ckptgw.store.interface import Store
from ckptgw.store.partpool import PartPool
from ckptgw.store.url import StoreURL

MAX_CONNECTIONS = 32  # an S3 store's connections (and each part worker's)


@contextlib.asynccontextmanager
async def open_store(
    url: StoreURL,
    endpoint_url: str | None = None,
    *,
    deadlines: Deadlines | None = None,
    part_workers: int = 0,
) -> AsyncIterator[Store]:
    """``deadlines``: what an S3 store's requests are held to (:mod:`ckptgw.store.deadlines`).
    ``part_workers`` > 0: an S3 store's parts sent with ``upload_part_from`` go from that many
    worker processes (:mod:`ckptgw.store.partpool`), opened after the store and closed before
    it; a file store sends every part itself."""
    if url.scheme == "file":
        yield FileStore(url)
        return
    from ckptgw.store.s3 import S3Store  # botocore takes a second to import: only when needed

    deadlines = deadlines or Deadlines()
    async with S3Store.open(
        url, endpoint_url, max_connections=MAX_CONNECTIONS, deadlines=deadlines
    ) as store:
        if part_workers <= 0:
            yield store
            return
        async with PartPool.open(
            part_workers,
            url=str(url),
            endpoint_url=endpoint_url,
            deadlines=deadlines,
            max_connections=MAX_CONNECTIONS,
        ) as pool:
            store.part_sender = pool
            yield store

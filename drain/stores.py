"""Open the store a URL names."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from ckptgw.drain.deadlines import Deadlines
from ckptgw.drain.filestore import FileStore
from ckptgw.drain.store import Store
from ckptgw.drain.storeurl import StoreURL


@contextlib.asynccontextmanager
async def open_store(
    url: StoreURL,
    endpoint_url: str | None = None,
    *,
    deadlines: Deadlines | None = None,
    part_workers: int = 0,
) -> AsyncIterator[Store]:
    """``deadlines`` (an S3 store's requests: :mod:`drain.deadlines`) and ``part_workers``:
    see :meth:`S3Store.open` (a file store sends every part itself)."""
    if url.scheme == "file":
        yield FileStore(url)
        return
    from ckptgw.drain.s3store import S3Store  # botocore takes a second to import: only when needed

    async with S3Store.open(
        url, endpoint_url, deadlines=deadlines, part_workers=part_workers
    ) as store:
        yield store

"""``ckptgw cache rebind CACHE_DIR --store URL``: send a cache dir's data to another store.

A cache dir is bound to the store it was first mounted with, so that its dirty data never goes
to the wrong one. When that store was the wrong one (a misspelled bucket), this moves the
binding: the new store is checked first, the cache dir must not be mounted (its lock is taken
for the whole change), and everything the cache holds drains to the new store at the next
mount (see :mod:`ckptgw.fsops.rebind`)."""

from __future__ import annotations

from pathlib import Path

import trio

from ckptgw.fsops.filesystem import Filesystem, FsOptions
from ckptgw.fsops.journal import Journal, JournalError
from ckptgw.fsops.rebind import RebindError, RebindReport, rebind
from ckptgw.gateway.cachedir import CacheDirLock
from ckptgw.gateway.errors import UserError
from ckptgw.gateway.render import plural, size
from ckptgw.gateway.storecheck import explain
from ckptgw.gateway.storeplace import local_store, local_store_problem
from ckptgw.store.interface import StoreError
from ckptgw.store.open import open_store
from ckptgw.store.url import StoreURL, StoreURLError, parse_store_url


def rebind_cache(
    cache_dir: Path, store: str, endpoint_url: str | None, allow_local_store: bool
) -> RebindReport | None:
    """Rebind ``cache_dir`` to ``store``; None if it already was. UserError for anything the
    user must fix first, with nothing changed."""
    try:
        url = parse_store_url(store)
    except StoreURLError as e:
        raise UserError(str(e)) from None
    if not (cache_dir / "journal.db").is_file():
        raise UserError(f"{cache_dir} is not a ckptgw cache dir (it has no journal.db)")
    if local_store(url) is not None and not allow_local_store:
        raise UserError(local_store_problem(url, cache_dir))
    try:
        lock = CacheDirLock(cache_dir)
    except UserError as e:
        raise UserError(f"{e}: unmount it first (ckptgw umount MOUNTPOINT)") from None
    try:
        old = _bound(cache_dir)
        if old == str(url):
            return None
        trio.run(_check, url, endpoint_url)
        fs = Filesystem(cache_dir, FsOptions(store_url=old, key_prefix=""))
        try:
            return rebind(fs, str(url), url.key_prefix)
        finally:
            fs.close()
    except (JournalError, RebindError) as e:
        raise UserError(str(e)) from None
    finally:
        lock.release()


def _bound(cache_dir: Path) -> str:
    journal = Journal(cache_dir / "journal.db")
    try:
        return journal.get_meta("store_url") or ""
    finally:
        journal.close()


async def _check(url: StoreURL, endpoint_url: str | None) -> None:
    """The new store must work before anything is bound to it."""
    async with open_store(url, endpoint_url) as store:
        try:
            await store.check()
        except StoreError as e:
            message, yours = explain(e, url, endpoint_url)
            later = "" if yours else ": try again once the store answers"
            raise UserError(f"{message}{later}; nothing rebound") from None


def describe(cache_dir: Path, r: RebindReport) -> str:
    lines = [
        f"{cache_dir}: bound to {r.new} (was {r.old})",
        f"  {plural(r.entries, 'entry', 'entries')} ({size(r.bytes)}) go to {r.new} at the next "
        "mount of this cache",
    ]
    if r.forgotten:
        lines.append(
            f"  {plural(r.forgotten, 'entry', 'entries')} only {r.old} has: no longer listed "
            "here (they stay there)"
        )
    if r.uploads:
        lines.append(
            f"  {plural(r.uploads, 'multipart upload')} to {r.old} abandoned (a bucket rule "
            "AbortIncompleteMultipartUpload removes their parts: ckptgw lifecycle rules)"
        )
    if r.store_ops:
        ops = plural(r.store_ops, "store operation")
        lines.append(f"  {ops} in {r.old} (renames, deletes, metadata) not carried out")
    return "\n".join(lines)

"""Part buffers (ckptgw.store.partbuffers): parts are read into reused buffers, bounded, let go once
the drain has been idle a while, never reused while a given-up request may still send from
one; through a real file store, the parts of an upload land byte for byte and share one
buffer, and a failed part gives its buffer back (no S3, no mount: fast tier)."""

from __future__ import annotations

import errno
import mmap
import os
import zlib
from pathlib import Path

import pytest
import trio
import trio.testing

from ckptgw.store.files import FileStore
from ckptgw.store.interface import READ_ERROR, SHORT_FILE, StoreError, read_part
from ckptgw.store.partbuffers import IDLE, PartBuffers
from ckptgw.store.url import parse_store_url

PART = 5 << 20


def test_buffers_are_reused_bounded_and_let_go_when_none_is_in_use() -> None:
    b = PartBuffers(keep=2)
    first = b.take(PART)
    b.give(first)  # none in use: let go
    assert (b.free, b.in_use, b.made) == (0, 0, 1)

    held = [b.take(PART) for _ in range(4)]
    assert b.made == 5 and b.in_use == 4
    for buf in held[:3]:
        b.give(buf)
    assert b.free == 2  # at most ``keep`` kept
    again = b.take(PART - 1)  # a shorter (last) part takes a kept one
    assert b.made == 5 and again in held[:3]
    bigger = b.take(2 * PART)  # too big for the kept ones: a new one
    assert b.made == 6 and len(bigger) == 2 * PART
    for buf in (again, bigger, held[3]):
        b.give(buf)
    assert (b.free, b.in_use) == (0, 0)


def test_a_buffer_a_given_up_request_may_still_send_from_is_never_reused() -> None:
    b = PartBuffers()
    keep_busy = b.take(PART)
    doomed = b.take(PART)
    b.lost(doomed)
    assert b.take(PART) is not doomed and b.made == 3
    b.give(keep_busy)


def test_a_part_read_into_a_buffer_is_the_file_s_bytes_and_their_crc32(tmp_path: Path) -> None:
    data = os.urandom(3 * PART + 123)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    b = PartBuffers()
    try:
        buf = b.take(PART)
        buf[:5] = b"stale"  # what an earlier part left: overwritten, never sent
        for offset, length in ((0, PART), (3 * PART, 123)):
            got, crc = read_part(fd, offset, length, buf)
            assert bytes(got) == data[offset : offset + length]
            assert crc == zlib.crc32(data[offset : offset + length])
        with pytest.raises(StoreError) as caught:
            read_part(fd, 3 * PART, PART, buf)  # the file ends first
        assert caught.value.code == SHORT_FILE
        with pytest.raises(ValueError, match="buffer for a"):
            read_part(fd, 0, PART + 1, buf)  # never a silent short part
    finally:
        os.close(fd)


def test_the_parts_of_an_upload_share_buffers_and_land_byte_for_byte(tmp_path: Path) -> None:
    """Five parts, one after another, through a real file store: one buffer for all five,
    kept while the drain pauses for less than IDLE seconds, let go after (fake clock)."""
    data = os.urandom(4 * PART + 7)
    (tmp_path / "f").write_bytes(data)
    store = FileStore(parse_store_url(f"file://{tmp_path / 'store'}"))
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    buffers = store.part_buffers

    async def main() -> None:
        upload = await store.create_multipart("ckpt.pt", {})
        etags = []
        for n in range(1, 6):
            off = (n - 1) * PART
            etag, _ = await store.upload_part_from(
                "ckpt.pt", upload, n, fd, off, min(PART, len(data) - off)
            )
            etags.append(etag)
        assert (buffers.made, buffers.in_use, buffers.free) == (1, 0, 1)
        await trio.sleep(IDLE - 1)  # (no thread runs now: the fake clock moves only here)
        buffers.give(buffers.take(PART))  # a pause shorter than IDLE: the same buffer
        assert buffers.made == 1
        await trio.sleep(IDLE + 1)
        assert (buffers.in_use, buffers.free) == (0, 0)  # idle: let go
        await store.complete_multipart("ckpt.pt", upload, etags)

    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        os.close(fd)
    assert (tmp_path / "store" / "ckpt.pt").read_bytes() == data


def test_a_part_that_fails_gives_its_buffer_back_and_one_never_made_is_a_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "f").write_bytes(os.urandom(PART - 1))
    store = FileStore(parse_store_url(f"file://{tmp_path / 'store'}"))
    fd = os.open(tmp_path / "f", os.O_RDONLY)

    async def main() -> None:
        upload = await store.create_multipart("ckpt.pt", {})
        with pytest.raises(StoreError) as short:
            await store.upload_part_from("ckpt.pt", upload, 1, fd, 0, PART)  # ends first
        assert short.value.code == SHORT_FILE
        assert (store.part_buffers.in_use, store.part_buffers.free) == (0, 1)

        def no_memory(*args: object, **kwargs: object) -> mmap.mmap:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")

        monkeypatch.setattr(mmap, "mmap", no_memory)
        with pytest.raises(StoreError) as none:
            await store.upload_part_from("ckpt.pt", upload, 1, fd, 0, 2 * PART)
        assert none.value.code == READ_ERROR and none.value.temporary  # tried again later
        assert store.part_buffers.in_use == 0

    try:
        trio.run(main)
    finally:
        os.close(fd)


def test_a_cancelled_part_s_buffer_is_dropped_not_reused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(os.urandom(PART))

    class Stuck(FileStore):
        async def upload_part(self, *args: object, **kwargs: object) -> str:
            await trio.sleep_forever()
            raise AssertionError("not reached")

    store = Stuck(parse_store_url(f"file://{tmp_path / 'store'}"))
    fd = os.open(tmp_path / "f", os.O_RDONLY)

    async def main() -> None:
        upload = await store.create_multipart("ckpt.pt", {})
        busy = store.part_buffers.take(PART)  # another part in flight: buffers are kept
        with trio.move_on_after(0.05):
            await store.upload_part_from("ckpt.pt", upload, 1, fd, 0, PART)
        assert store.part_buffers.in_use == 1 and store.part_buffers.free == 0
        store.part_buffers.give(busy)

    try:
        trio.run(main)
    finally:
        os.close(fd)

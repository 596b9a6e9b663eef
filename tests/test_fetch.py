"""The read-through fetch's own rules, deterministic: the range size each object gets, and
which waiting range a freed GET slot goes to. (Fetching through real mounts and moto:
tests/test_readthrough.py.)"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ckptgw.drain.reads.fetch import OPEN, PREFETCH, WAITED, FetchConfig, Slots, range_size

MiB = 1 << 20


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, 8 * MiB),  # one empty range
        (100, 8 * MiB),
        (20 * MiB, 8 * MiB),  # 2.5 MiB each would be too small: 3 ranges of 8 MiB
        (100 * MiB, 13 * MiB),  # 12.5 MiB each, whole MiB
        (1 << 30, 128 * MiB),  # 8 ranges for 8 GETs in flight
        (4 << 30, 256 * MiB),  # bounded by fetch_chunk_max: 16 ranges
        (125 << 30, 256 * MiB),  # 500 requests, not 16,000 of 8 MiB
    ],
)
def test_the_range_size_adapts_to_the_object(size: int, expected: int) -> None:
    assert range_size(size, FetchConfig()) == expected


def test_a_fixed_or_bounded_range_size_is_honoured() -> None:
    assert range_size(1 << 30, FetchConfig(fetch_chunk=MiB)) == MiB
    assert range_size(1 << 30, FetchConfig(fetch_chunk_max=64 * MiB)) == 64 * MiB
    assert range_size(1 << 30, FetchConfig(fetch_parallel=32)) == 32 * MiB


def test_a_freed_slot_goes_to_the_most_urgent_waiter_asked_when_it_frees() -> None:
    order: list[str] = []
    urgency = {"prefetch": PREFETCH, "read-ahead": OPEN, "reader": WAITED, "late": PREFETCH}

    async def go() -> None:
        slots = Slots(1)
        release = trio.Event()

        async def holder() -> None:
            async with slots.slot(lambda: PREFETCH):
                await release.wait()

        async def waiter(name: str) -> None:
            async with slots.slot(lambda: urgency[name]):
                order.append(name)
                await trio.sleep(1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder)
            await trio.testing.wait_all_tasks_blocked()
            for name in ("prefetch", "late", "read-ahead", "reader"):
                nursery.start_soon(waiter, name)
                await trio.testing.wait_all_tasks_blocked()
            urgency["late"] = WAITED  # a reader now waits for the "late" file's range
            release.set()
        assert slots.free == 1

    trio.run(go, clock=trio.testing.MockClock(autojump_threshold=0))
    # "late" waited longer than "reader" at the same urgency; the prefetch goes last.
    assert order == ["late", "reader", "read-ahead", "prefetch"]


def test_a_waiter_cancelled_as_it_is_handed_a_slot_passes_it_on() -> None:
    got: list[str] = []

    async def go() -> None:
        slots = Slots(1)
        with trio.CancelScope() as outer:
            async with trio.open_nursery() as nursery:
                release = trio.Event()

                cancel_me = trio.CancelScope()

                async def holder() -> None:
                    async with slots.slot(lambda: WAITED):
                        await release.wait()
                        # Cancelled, and handed the slot before it runs again (no
                        # checkpoint between the two): it must pass the slot on.
                        cancel_me.cancel()

                async def first() -> None:
                    with cancel_me:
                        async with slots.slot(lambda: WAITED):
                            got.append("first")

                async def second() -> None:
                    async with slots.slot(lambda: PREFETCH):
                        got.append("second")

                nursery.start_soon(holder)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(first)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(second)
                await trio.testing.wait_all_tasks_blocked()
                release.set()
        assert not outer.cancelled_caught
        assert slots.free == 1

    trio.run(go)
    assert got == ["second"]

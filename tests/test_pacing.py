"""The pace of store requests (ckptgw/store/pacing.py), and the one place that retries asking it for
turns (ckptgw/store/retry.py): on trio's MockClock, with a seeded random source, against a fake
store that refuses what a token bucket does not allow. Deterministic: the times asserted are
the fake clock's. The same on real mounts behind a rate-limiting proxy: tests/test_fleet.py;
its measurement: bench/fleet.py."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from ckptgw.store.interface import NotFound, StoreError
from ckptgw.store.pacing import BETA, Pace, PacingConfig
from ckptgw.store.retry import RetryPolicy, RetryStats, retrying


def slowdown() -> StoreError:
    return StoreError(
        "PUT k: SlowDown Please reduce your request rate.", temporary=True, code="SlowDown"
    )


def run(fn: Callable[[], Awaitable[None]]) -> None:
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def pace(**kw: float) -> Pace:
    return Pace("writes", PacingConfig(**kw), rng=random.Random(7))  # type: ignore[arg-type]


def test_unlimited_until_a_refusal_and_a_refused_burst_costs_one_cut() -> None:
    async def main() -> None:
        p = pace()
        start = trio.current_time()
        tickets = [await p.turn() for _ in range(16)]  # a burst: all at once
        assert trio.current_time() == start and p.rate is None
        for t in tickets:
            p.refusal(t)
        assert p.view()["cuts"] == 1 and p.refused == 16
        assert p.rate == pytest.approx(BETA * 16)  # 16 sent in the last second
        assert p.view()["refused_per_minute"] == 16
        await trio.sleep(0.1)
        p.refusal(await p.turn())  # sent after the cut: cuts again
        assert p.view()["cuts"] == 2 and p.rate == pytest.approx(BETA * BETA * 16)
        await trio.sleep(61)
        assert p.view()["refused_per_minute"] == 0 and p.view()["refused"] == 17

    run(main)


def test_turns_are_paced_at_the_rate_in_order() -> None:
    async def main() -> None:
        p = pace()
        p.refusal(await p.turn())  # one sent in the last second
        assert p.rate == pytest.approx(BETA)
        order: list[int] = []
        start = trio.current_time()

        async def one(i: int) -> None:
            await p.turn()
            order.append(i)

        async with trio.open_nursery() as n:
            for i in range(10):
                n.start_soon(one, i)
                await trio.sleep(0)  # queued in this order
            await trio.sleep(1)
            assert p.view()["waiting"] >= 8
        took = trio.current_time() - start
        assert order == list(range(10))
        assert 0.5 * 10 / BETA <= took <= 1.5 * 10 / BETA  # gaps of 1/rate, jittered
        assert p.waited > 0

    run(main)


def test_the_rate_grows_back_along_a_cubic_while_requests_are_accepted() -> None:
    async def main() -> None:
        p = pace()
        for _ in range(20):
            await p.turn()
        p.refusal(trio.current_time())
        peak = 20.0
        assert p.rate == pytest.approx(BETA * peak)
        k = (peak * (1 - BETA) / 0.4) ** (1 / 3)
        rates = []
        for _ in range(int(3 * k / 0.05)):
            await trio.sleep(0.05)
            p.accepted()
            assert p.rate is not None
            rates.append(p.rate)
        assert rates == sorted(rates)  # never down without a refusal
        back = next(i for i, r in enumerate(rates) if r >= peak) * 0.05
        assert 0.8 * k - 0.1 <= back <= 1.2 * k + 0.1  # near the last cut's rate after K s
        assert rates[-1] > 2 * peak  # then probing beyond it

    run(main)


def test_idle_time_does_not_grow_the_rate_and_it_never_falls_below_the_floor() -> None:
    async def main() -> None:
        p = pace(min_rate=2.0)
        p.refusal(await p.turn())
        assert p.rate == 2.0  # 0.7 of one request a second: the floor
        for _ in range(5):
            p.refusal(await p.turn())
        assert p.rate == 2.0
        p.accepted()
        await trio.sleep(3600)  # an hour without requests
        p.accepted()
        assert p.rate is not None and p.rate < 10  # idle: no evidence of more room

    run(main)


def test_a_pace_that_does_not_adapt_never_waits_but_counts() -> None:
    async def main() -> None:
        p = pace(adaptive_rate=False)
        for _ in range(5):
            p.refusal(await p.turn())
        assert p.rate is None and p.refused == 5 and p.view()["cuts"] == 0

    run(main)


def test_retrying_waits_its_turn_and_retries_a_refusal_without_backoff() -> None:
    async def main() -> None:
        p = pace()
        answers: list[BaseException | None] = [slowdown() for _ in range(12)] + [None]
        calls = 0

        async def call() -> str:
            nonlocal calls
            calls += 1
            e = answers.pop(0)
            if e is not None:
                raise e
            return "etag"

        stats = RetryStats()
        # 12 refusals: beyond the 8 attempts other errors get, within the refusals allowed
        assert await retrying("put k", call, RetryPolicy(), stats, pace=p) == "etag"
        assert calls == 13 and stats.errors == {"SlowDown": 12} and p.refused == 12
        assert p.rate is not None  # it slowed down

        answers[:] = [StoreError("boom", temporary=True, code="500"), NotFound("HEAD k: not found")]
        with pytest.raises(NotFound):
            await retrying("head k", call, RetryPolicy(), stats, pace=p)
        assert p.refused == 12  # a 500 or a 404 is no refusal as too many

        answers[:] = [slowdown() for _ in range(40)]
        with pytest.raises(StoreError):
            await retrying("put k", call, RetryPolicy(refusals=5), stats, pace=p)
        assert p.refused == 17  # refusals have their own bound

        answers[:] = [slowdown() for _ in range(40)]
        start = trio.current_time()
        with pytest.raises(StoreError):  # ... and a time bound: a reader waits for it
            await retrying("get k", call, RetryPolicy(refusal_seconds=10), stats, pace=p)
        assert 10 <= trio.current_time() - start < 20 and p.refused < 17 + 32

    run(main)


def _fleet(gateways: int, files: int, rate: float, *, adaptive: bool) -> tuple[float, int, int]:
    """``gateways`` paces, each sending ``files`` requests 16 at a time (the drain's small
    files in flight) to a fake store that takes ``rate`` a second from a bucket of one
    second's worth (a refusal otherwise); each request takes 20 ms. Returns (seconds until
    the last request was accepted, accepted, refused)."""
    out: list[float] = []
    tokens, accepted, refused = [rate], [0], [0]
    last = [0.0]

    def take() -> bool:
        now = trio.current_time()
        tokens[0] = min(rate, tokens[0] + (now - last[0]) * rate)
        last[0] = now
        if tokens[0] >= 1:
            tokens[0] -= 1
            accepted[0] += 1
            return True
        refused[0] += 1
        return False

    async def request() -> None:
        await trio.sleep(0.01)
        ok = take()
        await trio.sleep(0.01)
        if not ok:
            raise slowdown()

    async def gateway(p: Pace) -> None:
        limiter = trio.CapacityLimiter(16)

        async def one() -> None:
            async with limiter:
                await retrying("put", request, RetryPolicy(1000, refusals=1000), pace=p)

        async with trio.open_nursery() as n:
            for _ in range(files):
                n.start_soon(one)

    async def main() -> None:
        seeds = random.Random(1)
        config = PacingConfig(adaptive_rate=adaptive)
        paces = [Pace("writes", config, rng=random.Random(seeds.random())) for _ in range(gateways)]
        async with trio.open_nursery() as n:
            for p in paces:
                n.start_soon(gateway, p)
        out.append(trio.current_time())

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return out[0], accepted[0], refused[0]


def test_a_fleet_learns_its_share_of_the_rate() -> None:
    """8 gateways x 32 requests at 50 a second: paced, the fleet is refused a fraction of
    what it is without pacing (then every refusal is retried after its backoff only), and
    it still finishes near the rate's bound."""
    paced_time, paced_ok, paced_refused = _fleet(8, 32, 50.0, adaptive=True)
    blind_time, blind_ok, blind_refused = _fleet(8, 32, 50.0, adaptive=False)
    assert paced_ok == blind_ok == 8 * 32
    bound = paced_ok / 50.0
    assert paced_refused < blind_refused / 2
    assert paced_time < min(blind_time, 1.6 * bound)  # the fake clock's seconds


def test_after_a_quiet_second_the_rate_resumes_at_the_last_cut() -> None:
    """What the rate grew to while the store took everything (others were done) is not
    carried into the next save: it resumes at the rate of the last cut, then probes."""

    async def main() -> None:
        p = pace()
        for _ in range(10):
            await p.turn()
        p.refusal(trio.current_time())
        for _ in range(200):  # accepted for 10 s: far beyond the last cut's rate
            await p.turn()  # as retrying() asks for each attempt
            await trio.sleep(0.01)
            p.accepted()
        assert p.rate is not None and p.rate > 5 * 10
        await trio.sleep(30)  # the save is over
        await p.turn()
        assert p.rate == pytest.approx(10.0)  # the rate at the last cut
        await trio.sleep(0.05)
        p.accepted()
        assert p.rate == pytest.approx(10.0, rel=0.01)  # on the plateau, then probing

    run(main)

"""The keys a gateway stored or deleted lately (what a listing that started before may not
show yet): kept for RECENT seconds, whatever their number, forgotten oldest first."""

from __future__ import annotations

from ckptgw.fsops.storekeys import RECENT, Recent


def test_keys_are_kept_for_recent_seconds_and_then_forgotten_oldest_first() -> None:
    r = Recent()
    for i in range(30_000):  # more than a sharded save of 10,000 files notes in a minute
        r.note(f"k{i}", i / 1000)
    assert len(r) == 30_000  # 30 s: none is old enough to go
    r.note("late", RECENT + 10)  # k0..k10000, noted up to second 10, go
    assert "k10000" not in r and "k10001" in r
    assert next(iter(r)) == "k10001" and len(r) == 20_000


def test_a_key_noted_again_counts_from_then() -> None:
    r = Recent()
    r.note("a", 0.0)
    r.note("b", 1.0)
    r.note("a", 2.0)
    assert list(r) == ["b", "a"]
    r.note("c", RECENT + 1.5)  # b is older than RECENT; a (noted at 2.0) is not
    assert dict(r) == {"a": 2.0, "c": RECENT + 1.5}

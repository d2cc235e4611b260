"""Unit tests for proxy.upstream.transfer.TransferRate (pure: the test supplies the clock)."""

from __future__ import annotations

from proxy.upstream.transfer import TransferRate


def test_no_minimum_never_limits_the_wait() -> None:
    rate = TransferRate(0, 30, now=0)
    assert rate.patience(0) is None and not rate.too_slow(1000)


def test_nothing_is_too_slow_during_the_grace_period() -> None:
    rate = TransferRate(1000, 10, now=0)
    assert not rate.too_slow(9.9)
    assert rate.patience(0) == 10  # with nothing received, the first check is at the end of the grace
    assert rate.too_slow(10)


def test_a_trickle_below_the_minimum_is_too_slow_after_the_window() -> None:
    rate = TransferRate(32 * 1024, 3, now=0)
    for tick in range(1, 31):  # 1 KiB/s in 0.1 s steps
        rate.add(102, tick / 10)
    assert rate.too_slow(3.0)
    assert rate.patience(3.0) == 0


def test_a_fast_transfer_passes_and_may_wait_until_its_window_runs_dry() -> None:
    rate = TransferRate(1000, 10, now=0)
    rate.add(50_000, 1.0)  # five times what a 10 s window needs, all at t=1
    assert not rate.too_slow(10.5)
    assert rate.patience(10.5) == 0.5  # at t=11 the chunk leaves the window: nothing left
    assert rate.too_slow(11.0)


def test_patience_counts_chunks_leaving_the_window_one_by_one() -> None:
    rate = TransferRate(100, 10, now=0)  # needs 1000 bytes per 10 s
    rate.add(600, 2.0)
    rate.add(600, 8.0)
    assert not rate.too_slow(10)
    assert rate.patience(10) == 2.0  # at t=12 the first chunk leaves: 600 < 1000
    assert not rate.too_slow(11.9) and rate.too_slow(12.0)


def test_received_bytes_are_bucketed_but_counted() -> None:
    rate = TransferRate(1, 16, now=0)
    for step in range(1000):
        rate.add(1, step / 1000)
    assert rate.received(1.0) == 1000
    assert rate.received(17.0) == 0

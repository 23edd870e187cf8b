"""`Stall.observe`: when an assigned consumer counts as stalled (librdkafka#5153) -- committed
records waiting past an unmoved position for `STUCK_AFTER` -- and when it never does; and
`close_within`, which a close that deadlocks in librdkafka (#4514) does not hold up."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mvsink.io.kafka import STUCK_AFTER, Stall, close_within

#: (position, low, last stable offset, seconds since the first look) per look at partition 0.
Look = tuple[int, int, int, float]


@pytest.mark.parametrize(
    ("looks", "stalled"),
    [
        # records committed past an unmoved position, long enough
        ([(5, 0, 9, 0.0), (5, 0, 9, STUCK_AFTER)], True),
        # ... not yet long enough
        ([(5, 0, 9, 0.0), (5, 0, 9, STUCK_AFTER - 0.1)], False),
        # nothing read yet (negative position): waiting from the low watermark on
        ([(-1001, 3, 9, 0.0), (-1001, 3, 9, STUCK_AFTER)], True),
        ([(-1001, 9, 9, 0.0), (-1001, 9, 9, STUCK_AFTER)], False),
        # caught up: nothing committed past the position (an open transaction is not counted
        # in the last stable offset, so it is caught up too)
        ([(9, 0, 9, 0.0), (9, 0, 9, 10 * STUCK_AFTER)], False),
        # moving: records are being read, however long records keep coming
        ([(5, 0, 99, 0.0), (6, 0, 99, STUCK_AFTER), (7, 0, 99, 2 * STUCK_AFTER)], False),
        # moved, then stopped while records wait: timed from the last move
        ([(5, 0, 99, 0.0), (6, 0, 99, 10.0), (6, 0, 99, 10.0 + STUCK_AFTER)], True),
        ([(5, 0, 99, 0.0), (6, 0, 99, 10.0), (6, 0, 99, 9.0 + STUCK_AFTER)], False),
        # caught up in between: the wait starts again
        ([(5, 0, 9, 0.0), (5, 0, 5, 15.0), (5, 0, 9, STUCK_AFTER)], False),
    ],
)
def test_a_partition_is_stalled_only_when_committed_records_wait_past_an_unmoved_position(
    looks: list[Look], stalled: bool
) -> None:
    stall = Stall("unused:9092", clock=lambda: 0.0)
    seen = [stall.observe(0, position, low, stable, at) for position, low, stable, at in looks]
    assert seen[-1] is stalled
    assert not any(seen[:-1])


def test_partitions_are_judged_apart() -> None:
    stall = Stall("unused:9092", clock=lambda: 0.0)
    assert not stall.observe(0, 5, 0, 9, 0.0)
    assert not stall.observe(1, 9, 0, 9, 0.0)
    assert not stall.observe(1, 9, 0, 9, STUCK_AFTER)
    assert stall.observe(0, 5, 0, 9, STUCK_AFTER)


@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.integers(0, 20), st.floats(0.5, 30.0)),
        min_size=1,
        max_size=30,
    )
)
def test_a_reader_that_reads_or_is_caught_up_is_never_stalled(
    steps: list[tuple[int, int, float]],
) -> None:
    """Each look, the position moved on by `read` records or reached the last stable offset,
    which grew by `more`: never stalled, whatever the pace."""
    stall, position, stable, now = Stall("unused:9092", clock=lambda: 0.0), 0, 0, 0.0
    for read, more, after in steps:
        stable += more
        position = stable if read == 0 or position + read >= stable else position + read
        now += after
        assert not stall.observe(0, position, 0, stable, now)


class _Closing:
    """A consumer's close: returns, raises, or blocks until released (librdkafka#4514's
    deadlock in its destroy)."""

    def __init__(self, outcome: str) -> None:
        self.outcome, self.release = outcome, threading.Event()

    def close(self) -> None:
        if self.outcome == "raises":
            raise RuntimeError("Consumer closed")
        if self.outcome == "blocks":
            self.release.wait()


@pytest.mark.parametrize(("outcome", "closed"), [("returns", True), ("blocks", False)])
def test_a_close_that_never_returns_is_left_behind_and_the_caller_goes_on(
    outcome: str, closed: bool
) -> None:
    consumer = _Closing(outcome)
    started = time.monotonic()
    assert close_within(consumer, "a test reader", timeout=0.3) is closed  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    consumer.release.set()  # a close slower than the bound finishes in its own thread later


def test_a_close_that_raises_raises_in_the_callers_thread() -> None:
    with pytest.raises(RuntimeError, match="Consumer closed"):
        close_within(_Closing("raises"), "a test reader", timeout=5)  # type: ignore[arg-type]

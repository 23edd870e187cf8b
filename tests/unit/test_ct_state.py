"""The continual task's pure operators (`services.ct.state`): the seed's unit tests of
`continual_task.rs` ported case by case, named after them, and Hypothesis interleavings of the
sink state's inputs; a test of one of the invariants numbered in `services.ct` cites it."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvsink.core.frontier import Frontier
from services.ct.state import SinkState, TimesReduce, step_forward, times_extract

F = Frontier.at


def test_step_forward() -> None:
    """Each datum's time and the frontier one step forward, tick by tick."""
    for i in range(10):
        out, out_frontier = step_forward([(i, i, 1)], F(i + 1))
        assert out == [(i, i + 1, 1)]
        # crucially, the frontier moves too (a delay of the data alone would not)
        assert out_frontier == F(i + 2)
    assert step_forward([], Frontier.empty()) == ([], Frontier.empty())  # a closed input


class PanicOnClone:
    """Data the operator must pass through without copying (the seed's `PanicOnClone`)."""

    def __copy__(self) -> PanicOnClone:
        raise AssertionError("boom")

    def __deepcopy__(self, memo: object) -> PanicOnClone:
        raise AssertionError("boom")


def test_times_extract() -> None:
    data = [PanicOnClone() for _ in range(5)]
    updates = [(data[0], 0, 0), (data[1], 1, 1), (data[2], 1, 1), (data[3], 2, -2), (data[4], 2, 1)]
    passthrough, times = times_extract(updates)
    assert times == [(1, 2), (2, -1)]
    assert passthrough is updates and all(u[0] is d for u, d in zip(passthrough, data, strict=True))


def test_times_reduce() -> None:
    reduce = TimesReduce()
    reduce.absorb([(3, 1), (2, 1), (1, 1), (2, 1), (3, 1), (3, 1)])
    assert reduce.advance(F(1)) == []  # nothing final yet
    assert reduce.advance(Frontier.empty()) == [(1, 1), (2, 2), (3, 3)]  # the input closed
    assert reduce.advance(Frontier.empty()) == []


def _assert_noop(state: SinkState[str]) -> None:
    result = state.process()
    assert result is None, f"should be nothing to write: {result}"


def _assert_write(state: SinkState[str], expected_upper: int, expected_append: list[str]) -> None:
    result = state.process()
    assert result is not None, "should be something to write"
    new_upper, to_append = result
    assert new_upper == F(expected_upper)
    assert [d for d, _, _ in to_append] == expected_append


def test_ct_sink_state() -> None:
    """Invariants 1-3: data only at an append time once its progress passed it, empty writes
    between, each write consolidated and moving the upper one past its time."""
    s: SinkState[str] = SinkState()
    # Nothing to do at the initial state.
    _assert_noop(s)
    # Getting data to append is not enough to do anything yet.
    s.to_append += [("a", 1, 1), ("b", 1, 1)]
    _assert_noop(s)
    # Knowing that this is the only data we'll get for that timestamp is still not enough.
    s.to_append_progress = F(2)
    _assert_noop(s)
    # Even knowing that we got input at that time is not quite enough yet (we could be getting
    # these out of order).
    s.append_times.add(1)
    _assert_noop(s)
    # Indeed, it did come out of order. Also checks the == case for time vs progress.
    s.append_times.add(0)
    _assert_noop(s)
    # Now we have seen all the times we got input at up to 3: enough for the empty write [0, 1).
    s.append_times_progress = F(3)
    _assert_write(s, 1, [])
    # That succeeded, now we can write the data at 1.
    s.output_progress = F(1)
    _assert_write(s, 2, ["a", "b"])
    # That succeeded, now we know about some empty time.
    s.output_progress = F(2)
    _assert_write(s, 3, [])
    # That succeeded, now nothing to do.
    s.output_progress = F(3)
    _assert_noop(s)
    # A new time to write at: even without the data, an empty write up to that time.
    s.append_times.add(5)
    s.append_times_progress = F(6)
    _assert_write(s, 5, [])
    # That succeeded, now nothing to do again.
    s.output_progress = F(5)
    # Retract one of the things in the collection and add a new one: the write consolidates.
    s.to_append += [("a", 5, -1), ("c", 5, 1)]
    s.to_append_progress = F(6)
    _assert_write(s, 6, ["b", "c"])


@pytest.mark.parametrize(
    ("append_times", "progress", "output", "expected"),
    [
        ({4}, F(4), F(2), (F(4), [])),  # time 4 not final yet: the upper only reaches the progress
        ({4}, F(5), F(2), (F(4), [])),  # final, data not complete: up to the time, no data
        ({4}, F(5), F(4), None),  # already there: wait for the data
        (set(), F(0), F(0), None),  # nothing known
        ({1, 2}, F(3), F(3), None),  # every append time is behind the output: dropped
        ({1, 2}, F(5), F(3), (F(5), [])),  # and no new one before the progress: up to it
    ],
)
def test_process_without_data(
    append_times: set[int],
    progress: Frontier,
    output: Frontier,
    expected: tuple[Frontier, list[object]] | None,
) -> None:
    """Invariants 1 and 2: with no data, the upper moves up to the next append time or the
    append times' progress, never past a time still waiting for its data."""
    s: SinkState[str] = SinkState(
        append_times=set(append_times), append_times_progress=progress, output_progress=output
    )
    assert s.process() == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 12), st.sampled_from("abc"), st.sampled_from([-1, 1])), max_size=30
    ),
    st.lists(
        st.tuples(st.sampled_from(["data", "times", "process"]), st.integers(1, 3)), max_size=40
    ),
)
def test_sink_state_writes_each_input_time_once_and_nothing_between(
    inputs: list[tuple[int, str, int]], steps: list[tuple[str, int]]
) -> None:
    """Invariants 1-3. Feed the sink an input's updates (the logic being the identity: the
    output at T is the input's changes at T) and the input's times, in a random interleaving of
    their progress and of writes, each write applied as an unraced shard would. The output's
    upper only grows, data is written only at input times, each once, and the output equals the
    input's diffs."""
    horizon = 13
    changes = Counter[tuple[str, int]]()
    for time, datum, diff in inputs:
        changes[(datum, time)] += diff
    # The identity logic as a differential collection: the changes at T exist only at T
    # (inserted at T, retracted at T+1), as the task presents an input's diffs.
    to_append = [(d, t, r) for (d, t), r in changes.items()]
    to_append += [(d, t + 1, -r) for d, t, r in to_append]
    # The append times: as in the seed, a time whose diffs sum to zero (a +1 and a -1 of
    # different rows) gives none, so its changes are never written.
    _, times = times_extract([(d, t, r) for (d, t), r in changes.items()])
    input_times = {t for t, _ in times}
    changes = Counter({(d, t): r for (d, t), r in changes.items() if t in input_times})
    s: SinkState[str] = SinkState()
    written: list[tuple[Frontier, list[tuple[str, int, int]]]] = []
    progress = {"data": 0, "times": 0}

    def deliver(what: str, to: int) -> None:
        before, progress[what] = progress[what], min(horizon, to)
        if what == "data":  # the updates in [before, to): the sink buffers what it is given
            s.to_append += [u for u in to_append if before <= u[1] < progress["data"]]
            s.to_append_progress = F(progress["data"])
        else:
            s.append_times |= {t for t in input_times if before <= t < progress["times"]}
            s.append_times_progress = F(progress["times"])

    def write() -> bool:
        result = s.process()
        if result is None:
            return False
        new_upper, data = result
        assert s.output_progress.less_than(new_upper)  # the upper only grows
        written.append((new_upper, data))
        s.output_progress = new_upper
        return True

    for what, size in steps:
        if what == "process":
            write()
        else:
            deliver(what, progress[what] + size)
    deliver("data", horizon)
    deliver("times", horizon)
    while write():
        pass
    assert s.output_progress == F(horizon), "stuck with every input known"
    lower, output = F(0), Counter[tuple[str, int]]()
    for upper, data in written:
        for datum, time, diff in data:
            assert time in input_times, f"data written at {time}, where no input changed"
            assert lower.less_equal_time(time) and not upper.less_equal_time(time)
            output[(datum, time)] += diff
        if data:
            assert upper.time is not None and upper.time - 1 in input_times
        lower = upper
    assert {k: v for k, v in output.items() if v} == {k: v for k, v in changes.items() if v}

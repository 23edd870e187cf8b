"""The continual task's operators, pure (port of `continual_task.rs`): no I/O here.

* `times_extract`: the times at which a batch of input updates changed the input, as
  `(time, diff)` consolidated (zero sums dropped), next to the updates themselves;
* `TimesReduce`: one `(time, diff)` per time, released once the input's frontier has passed
  it (the seed's `times_reduce`: "a specialized consolidate with a HashMap instead of the
  Trace");
* `step_forward`: a collection moved one time forward, updates and frontier alike: the
  self-reference's contents as of `T-1` presented at `T` (the output is only known through
  `T-1` when computing what to write at `T`);
* `SinkState`: the sink's state (append times and their progress, the to-append buffer and its
  progress, the output's progress); `process` says what to write next: data only at an append
  time (a time some input changed at), the upper moved forward with no data in between, the
  buffer consolidated as of the write time (invariants 1-3 of `services.ct`).

Updates are `(data, time, diff)` triples; `data` is any hashable, orderable value (a row tuple).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from mvsink.core.frontier import Frontier

D = TypeVar("D", bound=Hashable)


def consolidate(updates: Iterable[tuple[D, int, int]]) -> list[tuple[D, int, int]]:
    """Diffs of equal `(data, time)` summed, zero sums dropped, sorted by `(data, time)` (the
    seed's `ConsolidatingVec::consolidate`)."""
    sums: dict[tuple[D, int], int] = {}
    for data, time, diff in updates:
        sums[(data, time)] = sums.get((data, time), 0) + diff
    return [(d, t, r) for (d, t), r in sorted(sums.items(), key=_key) if r]


def _key(item: tuple[tuple[D, int], int]) -> tuple[object, int]:
    (data, time), _ = item
    return data, time


def times_extract(
    updates: list[tuple[D, int, int]],
) -> tuple[list[tuple[D, int, int]], list[tuple[int, int]]]:
    """`updates` unchanged, and the times they change with their summed diffs (consolidated
    per time, zero sums dropped), by time. The data are never copied (the seed's test feeds
    values that panic on clone). As in the seed, a time whose diffs sum to zero (one row
    inserted, another deleted) gives no time; an append-only input always gives its times."""
    sums: dict[int, int] = {}
    for _, time, diff in updates:
        sums[time] = sums.get(time, 0) + diff
    return updates, [(t, r) for t, r in sorted(sums.items()) if r]


@dataclass
class TimesReduce:
    """Sums the diffs of each time and releases `(time, sum)` once the input frontier has
    passed the time, in time order (a time summing to zero is still released, as in the seed:
    the input did change at it)."""

    stash: dict[int, int] = field(default_factory=dict)

    def absorb(self, times: Iterable[tuple[int, int]]) -> None:
        for time, diff in times:
            self.stash[time] = self.stash.get(time, 0) + diff

    def advance(self, frontier: Frontier) -> list[tuple[int, int]]:
        """The times before `frontier` (final), removed from the stash."""
        done = sorted(t for t in self.stash if not frontier.less_equal_time(t))
        return [(t, self.stash.pop(t)) for t in done]


def step_forward(
    updates: Iterable[tuple[D, int, int]], frontier: Frontier
) -> tuple[list[tuple[D, int, int]], Frontier]:
    """Every update's time and the frontier one step forward (`T -> T+1`): the output frontier
    is one past the input's, which a delay of the data alone would not give."""
    moved = [(data, time + 1, diff) for data, time, diff in updates]
    return moved, frontier if frontier.is_empty else Frontier.at(frontier.time + 1)  # type: ignore[operator]


@dataclass
class SinkState(Generic[D]):
    """The continual task sink's state (the seed's `SinkState`)."""

    #: Known times to write data at. Includes every time before `append_times_progress`,
    #: except those before `output_progress`, which may have been dropped.
    append_times: set[int] = field(default_factory=set)
    append_times_progress: Frontier = field(default_factory=Frontier.minimum)
    #: The data to append, consolidated as of the write times (~empty in steady state).
    to_append: list[tuple[D, int, int]] = field(default_factory=list)
    to_append_progress: Frontier = field(default_factory=Frontier.minimum)
    #: A lower bound on the output's upper.
    output_progress: Frontier = field(default_factory=Frontier.minimum)

    def process(self) -> tuple[Frontier, list[tuple[D, int, int]]] | None:
        """The next write, `(new_upper, updates)`, or None when there is nothing to do yet."""
        # Only times at or after the output's progress can still be written at.
        self.append_times = {
            t for t in self.append_times if self.output_progress.less_equal_time(t)
        }
        # The smallest append time before its progress: times may arrive out of order, so only
        # those the progress has passed are acted on.
        first = min(self.append_times, default=None)
        if first is None or self.append_times_progress.less_equal_time(first):
            # The contract: data only at times an input changed at. There are none in
            # [output_progress, append_times_progress): move the upper there, with no data.
            if self.output_progress.less_than(self.append_times_progress):
                return self.append_times_progress, []
            return None
        write_ts = first
        if self.to_append_progress.less_equal_time(write_ts):
            # Not all the data at write_ts is here yet; the upper can still move up to it
            # (a self-referential task needs that to make progress).
            if self.output_progress.less_than(Frontier.at(write_ts)):
                return Frontier.at(write_ts), []
            return None
        # Write: the collection as of write_ts (times advanced to it, consolidated), nothing
        # from later times.
        self.to_append = consolidate((d, max(t, write_ts), r) for d, t, r in self.to_append)
        return Frontier.at(write_ts + 1), [u for u in self.to_append if u[1] <= write_ts]

"""`mvsink.io.spark.each_on_a_thread`: a task's independent pieces of work side by side, results
in order, the first error raised only once every piece has ended."""

from __future__ import annotations

import threading
import time

import pytest

from mvsink.io.spark import each_on_a_thread


def test_the_calls_run_side_by_side_and_the_results_keep_their_order() -> None:
    # Each call waits for all the others: run one after another, they would time out.
    barrier = threading.Barrier(3, timeout=10)

    def meet(item: int) -> tuple[int, str]:
        barrier.wait()
        return item * 10, threading.current_thread().name

    results = each_on_a_thread(meet, [1, 2, 3], "piece")
    assert [value for value, _ in results] == [10, 20, 30]
    assert all(name.startswith("piece") for _, name in results)


@pytest.mark.parametrize("items", [[], [7]])
def test_none_or_one_item_runs_on_the_callers_thread(items: list[int]) -> None:
    caller = threading.current_thread().name
    assert each_on_a_thread(lambda item: (item, threading.current_thread().name), items, "x") == [
        (item, caller) for item in items
    ]


def test_an_error_is_raised_once_every_call_has_ended() -> None:
    ended: list[int] = []

    def step(item: int) -> int:
        if item == 0:
            raise ValueError("first piece failed")
        time.sleep(0.2)
        ended.append(item)
        return item

    with pytest.raises(ValueError, match="first piece failed"):
        each_on_a_thread(step, [0, 1, 2], "piece")
    assert sorted(ended) == [1, 2]

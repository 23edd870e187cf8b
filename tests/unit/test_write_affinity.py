"""`services.write.affinity`: stable, balanced partition -> executor placement."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.write.affinity import groups, place


@pytest.mark.parametrize(
    ("partitions", "home", "executors", "expected"),
    [
        # first placement: dealt evenly
        ([0, 1, 2, 3], {}, {"0", "1"}, {0: "0", 1: "1", 2: "0", 3: "1"}),
        # homes kept while their executors live
        (
            [0, 1, 2, 3],
            {0: "1", 1: "1", 2: "0", 3: "0"},
            {"0", "1"},
            {0: "1", 1: "1", 2: "0", 3: "0"},
        ),
        # executor 1 died: its partitions go to the survivor, the others stay
        ([0, 1, 2, 3], {0: "0", 1: "1", 2: "0", 3: "1"}, {"0"}, {0: "0", 1: "0", 2: "0", 3: "0"}),
        # executor 2 joined: the fewest partitions move to it
        (
            [0, 1, 2, 3],
            {0: "0", 1: "0", 2: "0", 3: "0"},
            {"0", "2"},
            {0: "0", 1: "0", 2: "2", 3: "2"},
        ),
        # local mode: everything on the driver
        ([0, 1, 2], {}, {"driver"}, {0: "driver", 1: "driver", 2: "driver"}),
    ],
)
def test_place(
    partitions: list[int], home: dict[int, str], executors: set[str], expected: dict[int, str]
) -> None:
    assert place(partitions, home, executors) == expected


def test_place_needs_an_executor() -> None:
    with pytest.raises(ValueError, match="no live executors"):
        place([0], {}, set())


def test_groups_one_task_per_core_of_each_executor() -> None:
    placement = {0: "a", 1: "b", 2: "a", 3: "b", 4: "a"}
    assert groups(placement, 2) == [([0, 4], "a"), ([2], "a"), ([1], "b"), ([3], "b")]
    assert groups(placement, 1) == [([0, 2, 4], "a"), ([1, 3], "b")]


executor_names = st.sampled_from(["0", "1", "2", "3", "driver"])


@given(
    partitions=st.sets(st.integers(0, 15)),
    home=st.dictionaries(st.integers(0, 15), executor_names),
    executors=st.sets(executor_names, min_size=1),
)
def test_place_properties(partitions: set[int], home: dict[int, str], executors: set[str]) -> None:
    placed = place(partitions, home, executors)
    assert set(placed) == partitions and set(placed.values()) <= executors
    loads = [sum(1 for e in placed.values() if e == x) for x in executors]
    assert max(loads) - min(loads) <= 1
    # a partition with a live home moves only from an executor above its fair share
    stay = {p for p in partitions if home.get(p) in executors}
    kept_by = {x: sum(1 for p in stay if home[p] == x) for x in executors}
    floor = len(partitions) // len(executors)
    moved = sum(1 for p in stay if placed[p] != home[p])
    assert moved <= sum(max(0, n - floor) for n in kept_by.values())
    # and placing again from the result changes nothing (stable)
    assert place(partitions, placed, executors) == placed
    # every partition lands in exactly one task
    dealt = [p for group, _ in groups(placed, 2) for p in group]
    assert sorted(dealt) == sorted(partitions)

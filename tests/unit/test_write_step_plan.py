"""The write task's step plan (`services.write.state.plan_start`, `plan_batch`): where a step's
folds start (invariant 0 of `services.write`: a state whose `persist_folded` the shard's
`since` passed is rebuilt) and what it does with its description (invariant 1: stage only
when the shard's upper is the description's lower)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, BatchId
from services.write.state import (
    ColdStart,
    FoldOnly,
    Outdated,
    Rebuild,
    Resume,
    Stage,
    StepBatch,
    StepStart,
    plan_batch,
    plan_start,
)

F = Frontier.at
MIN, CLOSED = Frontier.minimum(), Frontier.empty()


def desc(lower: int, upper: int) -> BatchDescription:
    return BatchDescription("s", BatchId(0, 0), F(lower), F(upper), 0)


@pytest.mark.parametrize(
    ("version", "persist_folded", "since", "expected"),
    [
        # no checkpoint: a cold start from all of desired
        (-1, MIN, MIN, ColdStart()),
        (-1, MIN, F(7), ColdStart()),  # folded nothing of the shard: reads every update anyway
        # a checkpoint the shard's since has not passed: continue from it
        (4, F(5), F(5), Resume(4)),
        (4, F(5), F(3), Resume(4)),
        (4, MIN, F(9), Resume(4)),
        # invariant 0 broken by a lapsed lease: merges may have collapsed what it needs
        (4, F(5), F(6), Rebuild(4, F(6), F(5))),
        (4, F(5), CLOSED, Rebuild(4, CLOSED, F(5))),
        (-1, F(2), F(3), Rebuild(-1, F(3), F(2))),  # (a rebuilt state keeps its version)
    ],
)
def test_plan_start(
    version: int, persist_folded: Frontier, since: Frontier, expected: StepStart
) -> None:
    assert plan_start(version, persist_folded, since) == expected


def test_each_start_names_why_its_desired_fold_starts_there() -> None:
    assert "cold start" in plan_start(-1, MIN, MIN).why
    assert "checkpoint 4 folded" in plan_start(4, F(5), F(5)).why
    rebuild = plan_start(4, F(5), F(6)).why
    assert "since {6} passed checkpoint 4" in rebuild and "persist_folded {5}" in rebuild


@pytest.mark.parametrize(
    ("description", "shard_upper", "expected"),
    [
        # read-only mode, a gained partition's first fold: no description
        (None, F(3), FoldOnly()),
        (None, CLOSED, FoldOnly()),
        # invariant 1: the read-back is folded up to the description's lower
        (desc(3, 5), F(3), Stage(desc(3, 5))),
        (desc(0, 1), MIN, Stage(desc(0, 1))),
        # the shard moved past the lower (another writer appended it): nothing staged
        (desc(3, 5), F(5), Outdated(desc(3, 5), F(5))),
        (desc(3, 5), CLOSED, Outdated(desc(3, 5), CLOSED)),
        # (not reached: the driver asks only once the upper is at the lower)
        (desc(3, 5), F(2), Outdated(desc(3, 5), F(2))),
    ],
)
def test_plan_batch(
    description: BatchDescription | None, shard_upper: Frontier, expected: StepBatch
) -> None:
    assert plan_batch(description, shard_upper) == expected


# -- against the decisions as `_step` made them inline (the reference model) -------------------


def reference_rebuilt(persist_folded: Frontier, since: Frontier) -> bool:
    return Frontier.minimum().less_than(persist_folded) and persist_folded.less_than(since)


def reference_stage(
    lower: Frontier | None, upper: Frontier | None, shard_upper: Frontier
) -> tuple[bool, bool]:
    """(outdated, may stage) as `_step` decided them."""
    outdated, stage = False, False
    if lower is not None and upper is not None:
        if shard_upper != lower:
            outdated = True
        else:
            stage = True
    return outdated, stage


frontiers = st.one_of(st.integers(0, 12).map(F), st.just(CLOSED))


@settings(max_examples=500, deadline=None)
@given(st.integers(-1, 5), frontiers, frontiers)
def test_plan_start_matches_the_reference(
    version: int, persist_folded: Frontier, since: Frontier
) -> None:
    start = plan_start(version, persist_folded, since)
    assert isinstance(start, Rebuild) == reference_rebuilt(persist_folded, since)
    if not isinstance(start, Rebuild):
        assert start == (ColdStart() if version < 0 else Resume(version))


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.none(), st.tuples(st.integers(0, 10), st.integers(1, 3))), frontiers)
def test_plan_batch_matches_the_reference(
    bounds: tuple[int, int] | None, shard_upper: Frontier
) -> None:
    description = None if bounds is None else desc(bounds[0], bounds[0] + bounds[1])
    batch = plan_batch(description, shard_upper)
    lower = None if description is None else description.lower
    upper = None if description is None else description.upper
    outdated, stage = reference_stage(lower, upper, shard_upper)
    assert isinstance(batch, Outdated) == outdated
    assert isinstance(batch, Stage) == stage
    assert isinstance(batch, FoldOnly) == (description is None)
    if isinstance(batch, Stage):  # invariant 1
        assert batch.desc.lower == shard_upper

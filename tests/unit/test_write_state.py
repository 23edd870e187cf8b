"""The write driver's pure state: when to stage, and for which partitions."""

from __future__ import annotations

import pytest

from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, BatchId
from mvsink.core.settings import shard_poll_due
from services.write.state import HoldTarget, StageJob, WriteState, lease_due

F = Frontier.at


def desc(lower: int, upper: int, seq: int = 0) -> BatchDescription:
    return BatchDescription("s", BatchId(0, seq), F(lower), F(upper), 0)


def ready_state(owned: frozenset[int] = frozenset({0, 1})) -> WriteState:
    state = WriteState("s", 2, read_only=False)
    state.set_owned(owned)
    for p in owned:
        state.advance_desired_frontier(p, F(10))
    return state


def test_stages_when_persist_is_at_lower_and_desired_past_upper() -> None:
    """Invariant 1 of `services.write`."""
    state = ready_state()
    state.absorb_batch_description(desc(0, 5))
    assert state.maybe_start_batch() == StageJob(desc(0, 5), (0, 1))


def test_waits_for_the_read_back_to_reach_lower() -> None:
    """Invariant 1 of `services.write`: the read-back is folded up to the lower."""
    state = ready_state()
    state.absorb_batch_description(desc(3, 5))
    assert state.maybe_start_batch() is None  # persist {0} < lower {3}
    state.advance_persist_frontier(F(3))
    assert state.maybe_start_batch() is not None


def test_waits_for_desired_progress_of_every_owned_partition() -> None:
    """Invariant 1 of `services.write`."""
    state = WriteState("s", 2, read_only=False)
    state.set_owned(frozenset({0, 1}))
    state.advance_desired_frontier(0, F(9))
    state.absorb_batch_description(desc(0, 5))
    assert state.maybe_start_batch() is None
    state.advance_desired_frontier(1, F(5))
    assert state.maybe_start_batch() is not None


def test_drops_regressing_descriptions() -> None:
    state = ready_state()
    state.absorb_batch_description(desc(4, 6, seq=1))
    state.absorb_batch_description(desc(0, 5))
    assert state.batch_description == desc(4, 6, seq=1)


def test_an_outdated_description_is_not_staged() -> None:
    """Invariant 1 of `services.write`."""
    state = ready_state()
    state.absorb_batch_description(desc(0, 5))
    state.advance_persist_frontier(F(5))  # another replica appended first
    assert state.maybe_start_batch() is None


def test_stages_each_partition_once_and_new_owned_ones_too() -> None:
    """Invariant 2 of `services.write`."""
    state = ready_state(frozenset({0}))
    state.absorb_batch_description(desc(0, 5))
    job = state.maybe_start_batch()
    assert job == StageJob(desc(0, 5), (0,))
    state.batch_staged(job, (0,))
    assert state.maybe_start_batch() is None
    state.set_owned(frozenset({0, 1}))  # a rebalance hands over partition 1
    state.advance_desired_frontier(1, F(10))
    assert state.maybe_start_batch() == StageJob(desc(0, 5), (1,))


def test_restage_stages_the_current_description_again_once_asked() -> None:
    state = ready_state()
    assert state.restage() is False  # nothing staged: nothing to do
    state.absorb_batch_description(desc(0, 5))
    job = state.maybe_start_batch()
    assert job is not None
    state.batch_staged(job, (0, 1))
    assert state.maybe_start_batch() is None
    assert state.restage() is True
    assert state.maybe_start_batch() == StageJob(desc(0, 5), (0, 1))


def test_maybe_restage_stages_again_once_the_batch_outlived_the_bound_unappended() -> None:
    """The one exception to invariant 2 of `services.write`: a batch staged `bound` seconds ago
    and still not appended (the shard would refuse its parts as too old) is staged again."""
    state = ready_state()
    state.staged_at = 100.0
    assert state.maybe_restage(500.0, 10.0) is False  # no description: nothing to stage
    state.absorb_batch_description(desc(0, 5))
    job = state.maybe_start_batch()
    assert job is not None
    state.batch_staged(job, (0, 1), now=200.0)
    assert state.staged_at == 200.0
    assert state.maybe_restage(209.0, 10.0) is False  # not yet
    assert state.maybe_restage(210.0, 10.0) is True and state.staged_at == 210.0
    assert state.maybe_start_batch() == job
    assert state.maybe_restage(221.0, 10.0) is False  # nothing staged since: nothing to do
    state.batch_staged(job, (0, 1), now=221.0)
    state.advance_persist_frontier(F(5))  # appended: the description is done
    assert state.maybe_restage(300.0, 10.0) is False and state.staged_at == 221.0


@pytest.mark.parametrize(
    ("last", "target", "now", "due"),
    [
        (None, (None, {}), 0.0, True),  # the first version
        (((F(3), {"h": F(3)}), 10.0), (F(3), {"h": F(3)}), 11.0, False),  # unchanged, renewed
        (((F(3), {"h": F(3)}), 10.0), (F(4), {"h": F(3)}), 11.0, True),  # the lease moved
        (((F(3), {"h": F(3)}), 10.0), (F(3), {"h": F(4)}), 10.5, True),  # a hold moved
        (((F(3), {"h": F(3)}), 10.0), (F(3), {"h": F(3), "i": F(0)}), 10.5, True),  # a new hold
        (((F(3), {"h": F(3)}), 10.0), (F(3), {"h": F(3)}), 39.9, False),  # within a third
        (((F(3), {"h": F(3)}), 10.0), (F(3), {"h": F(3)}), 40.0, True),  # a third of 90 s
    ],
)
def test_the_lease_is_written_when_it_moves_or_a_third_of_it_passed(
    last: tuple[HoldTarget, float] | None, target: HoldTarget, now: float, due: bool
) -> None:
    assert lease_due(last, target, now, 90.0) is due


@pytest.mark.parametrize(
    ("last", "now", "working", "due"),
    [
        (None, 0.0, False, True),  # never read: read now
        (100.0, 100.9, True, False),
        (100.0, 101.0, True, True),  # working: every SHARD_POLL
        (100.0, 129.0, False, False),
        (100.0, 130.0, False, True),  # idle: every IDLE_SHARD_POLL
        (100.0, 120.0, True, True),  # work arriving after an idle spell: at once
    ],
)
def test_the_shard_is_read_often_while_working_and_seldom_while_idle(
    last: float | None, now: float, working: bool, due: bool
) -> None:
    assert shard_poll_due(last, now, working) is due


def test_a_fold_that_would_see_what_the_last_one_saw_is_recognised() -> None:
    """`fold_view` changes with the shard's upper, the owned partitions, their desired progress
    and read-only mode, and with nothing else: the idle driver skips only folds with nothing
    new to fold."""
    state = WriteState("s", 2, read_only=True)
    state.set_owned(frozenset({0}))
    state.advance_desired_frontier(0, Frontier.at(3))
    seen = state.fold_view()
    state.advance_desired_frontier(1, Frontier.at(9))  # not owned
    assert state.fold_view() == seen
    for change in (
        lambda: state.advance_persist_frontier(Frontier.at(2)),
        lambda: state.advance_desired_frontier(0, Frontier.at(4)),
        lambda: state.set_owned(frozenset({0, 1})),
        state.allow_writes,
    ):
        change()
        assert state.fold_view() != seen
        seen = state.fold_view()

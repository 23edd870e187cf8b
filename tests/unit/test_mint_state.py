"""mint's pure state: each seed rule as a test; a test of one of the invariants numbered in
`services.mint` cites it."""

from __future__ import annotations

import pytest

from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, BatchId
from services.mint.state import MintState

F = Frontier.at


def mint(
    read_only: bool = False, partitions: int = 2, workers: int = 3, as_of: int = 0
) -> MintState:
    return MintState("s", partitions, workers, F(as_of), read_only)


def progress(state: MintState, *frontiers: Frontier) -> None:
    for partition, frontier in enumerate(frontiers):
        state.advance_desired_frontier(partition, frontier)


def test_mints_lower_persist_upper_desired() -> None:
    state = mint()
    progress(state, F(5), F(7))
    desc = state.maybe_mint_batch_description()
    assert desc == BatchDescription("s", BatchId(0, 0), F(0), F(5), 0)  # desired = meet


def test_never_mints_in_read_only_mode_until_allowed() -> None:
    """Invariant 5: nothing minted while read-only; promoted once, for good."""
    state = mint(read_only=True)
    progress(state, F(5), F(5))
    assert state.maybe_mint_batch_description() is None
    assert state.allow_writes() is True and state.allow_writes() is False
    assert state.maybe_mint_batch_description() is not None


def test_never_mints_unless_desired_is_ahead_of_persist() -> None:
    state = mint(as_of=5)
    progress(state, F(5), F(9))
    assert state.maybe_mint_batch_description() is None  # desired {5} == persist {5}
    state.advance_desired_frontier(0, F(6))
    assert state.maybe_mint_batch_description() == BatchDescription(
        "s", BatchId(0, 0), F(5), F(6), 0
    )


def test_never_mints_twice_for_one_lower() -> None:
    """Invariant 1: mints again only after persist advanced past the last lower."""
    state = mint()
    progress(state, F(5), F(5))
    assert state.maybe_mint_batch_description() is not None
    progress(state, F(9), F(9))
    assert state.maybe_mint_batch_description() is None  # persist still {0}
    state.advance_persist_frontier(F(5))
    second = state.maybe_mint_batch_description()
    assert second is not None and (second.lower, second.upper) == (F(5), F(9))


def test_append_workers_round_robin() -> None:
    state = mint(workers=2)
    workers = []
    for t in range(1, 6):
        progress(state, F(t), F(t))
        state.advance_persist_frontier(F(t - 1))
        desc = state.maybe_mint_batch_description()
        assert desc is not None
        workers.append(desc.append_worker)
    assert workers == [0, 1, 0, 1, 0]


def test_frontiers_never_regress() -> None:
    """Invariant 4: a regressing frontier, or an unknown partition's, is ignored."""
    state = mint()
    assert state.advance_persist_frontier(F(4)) and not state.advance_persist_frontier(F(2))
    assert state.persist_frontier == F(4)
    assert state.advance_desired_frontier(0, F(3)) and not state.advance_desired_frontier(0, F(1))
    assert not state.advance_desired_frontier(7, F(9))  # unknown partition: ignored


def test_closed_desired_frontier_mints_a_closed_upper() -> None:
    state = mint()
    progress(state, Frontier.empty(), Frontier.empty())
    desc = state.maybe_mint_batch_description()
    assert desc is not None and desc.upper.is_empty


@pytest.mark.parametrize("last_worker", [0, 2])
def test_restore_keeps_lowers_increasing_across_restarts(last_worker: int) -> None:
    """Invariant 1 across restarts: a new mint continues after the last record in `descs`."""
    last = BatchDescription("s", BatchId(4, 9), F(10), F(12), last_worker)
    state = mint(workers=3)
    state.restore(last)
    progress(state, F(20), F(20))
    state.advance_persist_frontier(F(10))
    assert state.maybe_mint_batch_description() is None  # persist not past the restored lower
    state.advance_persist_frontier(F(12))
    desc = state.maybe_mint_batch_description()
    assert desc == BatchDescription("s", BatchId(5, 0), F(12), F(20), (last_worker + 1) % 3)

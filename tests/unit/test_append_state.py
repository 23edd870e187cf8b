"""append's pure state: each seed rule as a test; a test of one of the invariants numbered in
`services.append` cites it."""

from __future__ import annotations

from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, BatchId, Part, StagedBatch
from mvsink.shard.state import Appended, UpperMismatch
from services.append.state import Append, AppendState, DeleteStaged

F = Frontier.at
P = 3


def desc(lower: int, upper: int, worker: int = 0, seq: int = 0) -> BatchDescription:
    return BatchDescription("s", BatchId(0, seq), F(lower), F(upper), worker)


def batch(d: BatchDescription, covers: tuple[int, ...], writer: str = "w") -> StagedBatch:
    parts = tuple(Part(f"k/{writer}/{d.lower}/{p}", p, P, 1, 1) for p in covers)
    return StagedBatch(d.id, d.lower, d.upper, covers, parts, writer)


def worker(worker_id: int = 0) -> AppendState:
    return AppendState("s", worker_id, P)


def appends(commands: list[object]) -> list[Append]:
    return [c for c in commands if isinstance(c, Append)]


def deleted(commands: list[object]) -> set[str]:
    return {p.key for c in commands if isinstance(c, DeleteStaged) for p in c.parts}


def test_appends_once_every_partition_is_covered() -> None:
    """Invariant 2: the `Append` comes once every desired partition is covered."""
    state, d = worker(), desc(0, 5)
    assert state.absorb_batch_description(d) == []
    assert appends(state.absorb_batch(batch(d, (0, 1)))) == []  # partition 2 missing
    [append] = appends(state.absorb_batch(batch(d, (2,))))
    assert append.desc == d and {p.partition for p in append.parts} == {0, 1, 2}


def test_never_appends_before_coverage_is_complete() -> None:
    """Invariant 2: no `Append` while a partition is not covered, duplicates or not."""
    state, d = worker(), desc(0, 5)
    state.absorb_batch_description(d)
    for covers in [(0,), (0,), (1,), (1,)]:
        assert appends(state.absorb_batch(batch(d, covers, writer=f"w{covers}"))) == []


def test_batches_before_their_description_are_kept() -> None:
    state, d = worker(), desc(3, 5)
    state.absorb_batch(batch(d, (0, 1, 2)))
    assert appends(state.absorb_batch_description(d))


def test_only_the_owning_worker_appends() -> None:
    """Invariant 2: only the worker the description names appends it."""
    state, d = worker(worker_id=1), desc(0, 5, worker=0)
    state.absorb_batch_description(d)
    assert appends(state.absorb_batch(batch(d, (0, 1, 2)))) == []


def test_duplicate_batches_for_a_partition_keep_the_first() -> None:
    """Invariant 3: a duplicate's parts for a covered partition are deleted, the first kept."""
    state, d = worker(), desc(0, 5)
    state.absorb_batch_description(d)
    state.absorb_batch(batch(d, (0, 1), writer="first"))
    commands = state.absorb_batch(batch(d, (1, 2), writer="second"))
    [append] = appends(commands)
    assert deleted(commands) == {f"k/second/{d.lower}/1"}
    assert sorted(p.key for p in append.parts) == sorted(
        [f"k/first/{d.lower}/0", f"k/first/{d.lower}/1", f"k/second/{d.lower}/2"]
    )


def test_skips_outdated_descriptions_and_batches() -> None:
    """Invariants 1 and 3: `lower` stays; an outdated batch's parts are deleted."""
    state, old, new = worker(), desc(0, 5), desc(5, 9, seq=1)
    state.absorb_batch_description(new)
    assert state.absorb_batch_description(old) == []
    assert deleted(state.absorb_batch(batch(old, (0,)))) == {f"k/w/{old.lower}/0"}
    assert state.lower == F(5)


def test_a_newer_lower_discards_what_was_stashed() -> None:
    """Invariants 1 and 3: a greater lower deletes the parts stashed for the old one."""
    state, old, new = worker(), desc(0, 5), desc(5, 9, seq=1)
    state.absorb_batch_description(old)
    state.absorb_batch(batch(old, (0, 1)))
    commands = state.absorb_batch_description(new)
    assert deleted(commands) == {f"k/w/{old.lower}/0", f"k/w/{old.lower}/1"}


def test_after_an_append_lower_moves_to_the_new_upper_and_nothing_is_deleted() -> None:
    """Invariants 1 and 3: appended parts are never handed to `DeleteStaged`."""
    state, d = worker(), desc(0, 5)
    state.absorb_batch_description(d)
    state.absorb_batch(batch(d, (0, 1, 2)))
    assert state.absorb_append_outcome(Appended(F(5), 1)) == []
    assert state.lower == F(5) and state.stash == {}


def test_after_a_mismatch_the_parts_are_garbage() -> None:
    """Invariant 3: a failed append's parts are deleted, never appended."""
    state, d = worker(), desc(0, 5)
    state.absorb_batch_description(d)
    [append] = appends(state.absorb_batch(batch(d, (0, 1, 2))))
    commands = state.absorb_append_outcome(UpperMismatch(F(7), 1))
    assert deleted(commands) == {p.key for p in append.parts}
    assert state.lower == F(7)


def test_never_appends_twice_for_one_lower() -> None:
    """Invariant 2: at most one `Append` per lower, redeliveries included."""
    state, d = worker(), desc(0, 5)
    state.absorb_batch_description(d)
    assert appends(state.absorb_batch(batch(d, (0, 1, 2))))
    state.absorb_append_outcome(UpperMismatch(F(0), 1))  # e.g. the shard is behind: lower stays
    late = state.absorb_batch(batch(d, (0, 1, 2), writer="late"))
    assert appends(late) == [] and len(deleted(late)) == 3
    assert appends(state.absorb_batch_description(d)) == []  # a redelivered description


def test_a_redelivered_batch_never_deletes_the_parts_it_kept() -> None:
    """Invariant 3: the same StagedBatch delivered twice (uncommitted offset) must not turn its
    own, kept parts into 'duplicates' to delete."""
    state, d = worker(), desc(0, 5)
    first = state.absorb_batch(batch(d, (0, 1, 2)))
    assert state.absorb_batch(batch(d, (0, 1, 2))) == [] and first == []
    [append] = appends(state.absorb_batch_description(d))
    assert len(append.parts) == 3


def test_parts_too_old_are_dropped_and_fresh_ones_for_the_same_description_appended() -> None:
    """Invariant 4: lower and description stay; fresh parts for them are appended."""
    from services.append.state import TooOld

    state, d = worker(), desc(0, 5)
    state.absorb_batch_description(d)
    [first] = appends(state.absorb_batch(batch(d, (0, 1, 2), writer="old")))
    commands = state.absorb_append_outcome(TooOld())
    assert deleted(commands) == {p.key for p in first.parts}
    assert state.lower == F(0) and state.batch_description == d and not state.sealed
    assert appends(state.absorb_batch(batch(d, (0, 1), writer="fresh"))) == []
    [again] = appends(state.absorb_batch(batch(d, (2,), writer="fresh")))
    assert again.desc == d and {p.key for p in again.parts} == {
        f"k/fresh/{d.lower}/{p}" for p in range(P)
    }
    assert appends(state.absorb_append_outcome(Appended(F(5), 1))) == []
    assert state.lower == F(5)


def test_takes_says_which_batches_absorb_would_keep_rather_than_delete() -> None:
    """`takes` agrees with `absorb_batch`: a batch ahead or for the current description is kept
    (a claim the shell checks against the shard first); an outdated, misfit or late one is
    only deleted, never appended."""
    state, d = worker(), desc(5, 8)
    state.absorb_batch_description(d)
    cases = {
        "ahead": (batch(desc(8, 9), (0,)), True),
        "current": (batch(d, (0,)), True),
        "outdated": (batch(desc(2, 5), (0,)), False),
        "misfit": (batch(desc(5, 9), (0,)), False),
    }
    for name, (staged, taken) in cases.items():
        probe = worker()
        probe.absorb_batch_description(d)
        assert probe.takes(staged) is taken, name
        commands = probe.absorb_batch(staged)
        kept = {p.key for ps in probe.stash.values() for p in ps} | {
            p.key for a in appends(commands) for p in a.parts
        }
        assert (kept == {p.key for p in staged.parts}) is taken, name
        assert (deleted(commands) == {p.key for p in staged.parts}) is not taken, name
    # once the append is issued, a further batch for the description is late
    state.absorb_batch(batch(d, (0, 1, 2)))
    assert state.sealed and not state.takes(batch(d, (1,), writer="late"))

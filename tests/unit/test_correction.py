"""The write stage's correction buffer (seed `Correction`): pure Arrow, checked against a
Counter model."""

from __future__ import annotations

import pickle
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mvsink.core.frontier import Frontier
from mvsink.core.updates import normalize_updates
from services.write.correction import MAX_CHUNKS, MIN_CHUNK_ROWS, Correction

ROWS = pa.schema([("k", pa.string())])
F = Frontier.at


def table(rows: list[tuple[str, int, int]]) -> pa.Table:
    return normalize_updates(
        pa.table(
            {
                "k": pa.array([r[0] for r in rows], pa.string()),
                "_time": pa.array([r[1] for r in rows], pa.int64()),
                "_diff": pa.array([r[2] for r in rows], pa.int64()),
            }
        ),
        ROWS,
    )


def as_counter(t: pa.Table) -> Counter[tuple[str, int]]:
    """The contents (duplicates summed, zero sums dropped)."""
    summed: Counter[tuple[str, int]] = Counter()
    for r in t.to_pylist():
        summed[(r["k"], r["_time"])] += r["_diff"]
    return Counter({key: d for key, d in summed.items() if d})


def is_consolidated(t: pa.Table) -> bool:
    keys = [(r["k"], r["_err"], r["_time"]) for r in t.to_pylist()]
    return len(keys) == len(set(keys)) and all(r["_diff"] for r in t.to_pylist())


def test_desired_minus_persist_cancels() -> None:
    correction = Correction(ROWS, F(0))
    correction.insert(table([("a", 1, 1), ("b", 1, 1)]))
    correction.insert_negated(table([("a", 1, 1)]))  # the shard already has `a`
    assert as_counter(correction.consolidate()) == Counter({("b", 1): 1})


def test_advance_since_moves_times_forward_only() -> None:
    correction = Correction(ROWS, F(0))
    correction.insert(table([("a", 1, 1), ("a", 7, 1)]))
    correction.advance_since(F(5))
    assert as_counter(correction.consolidate()) == Counter({("a", 5): 1, ("a", 7): 1})
    correction.advance_since(F(3))  # never back
    assert correction.since == F(5)
    correction.insert(table([("a", 2, -1)]))  # arrives late: advanced on insert
    assert as_counter(correction.consolidate()) == Counter({("a", 7): 1})


def test_updates_before_upper() -> None:
    correction = Correction(ROWS, F(0))
    correction.insert(table([("a", 1, 1), ("b", 4, 1)]))
    assert as_counter(correction.updates_before(F(4))) == Counter({("a", 1): 1})
    assert len(correction.consolidate()) == 2  # written updates stay until read back


def test_updates_before_an_upper_past_everything_is_the_corrections_themselves() -> None:
    """No copy: a kept staged part and the corrections pickle (the warm state) as one table."""
    correction = Correction(ROWS, F(0))
    correction.insert(table([(f"k{i}", 1, 1) for i in range(2000)]))
    staged = correction.updates_before(F(4))
    assert staged is correction.consolidate()
    alone = len(pickle.dumps(correction, protocol=pickle.HIGHEST_PROTOCOL))
    both = len(pickle.dumps((correction, staged), protocol=pickle.HIGHEST_PROTOCOL))
    assert both < alone * 1.1


def test_desired_updates_as_received_are_kept_as_they_are() -> None:
    """Nothing to cancel them but the upstream's own changelog: no group-by, the same table."""
    correction = Correction(ROWS, F(0))
    received = table([("a", 1, 1), ("a", 1, -1), ("b", 2, 1)])
    correction.insert(received)
    assert correction.consolidate().equals(received)
    assert as_counter(correction.consolidate()) == Counter({("b", 2): 1})


def test_a_step_after_the_read_back_keeps_the_received_updates() -> None:
    """The steady state: the previous part, consolidated with a read-back, is dropped by its
    own read-back, and the next ticks are kept as received (a cancelling pair included)."""
    correction = Correction(ROWS, F(0))
    correction.insert(table([("a", 1, 1), ("a", 1, 1)]))
    correction.insert_negated(table([("b", 1, 1)]))
    assert is_consolidated(correction.consolidate())
    received = table([("a", 2, 1), ("c", 2, 1), ("c", 2, -1)])
    correction.insert(received)
    correction.retract_before(F(2))
    correction.advance_since(F(2))
    assert correction.consolidate().equals(received)


def test_updates_advanced_on_insert_are_consolidated() -> None:
    """Late desired updates moved to `since` can meet each other: they are not as received."""
    correction = Correction(ROWS, F(3))
    correction.insert(table([("a", 1, 1), ("a", 2, -1), ("b", 2, 1)]))
    got = correction.consolidate()
    assert is_consolidated(got)
    assert as_counter(got) == Counter({("b", 3): 1})


def test_retract_before_the_empty_frontier_leaves_nothing() -> None:
    """A batch whose upper is the empty frontier (desired closed) drops everything."""
    correction = Correction(ROWS, F(0))
    correction.insert(table([("a", 1, 1)]))
    correction.retract_before(Frontier.empty())
    assert correction.consolidate().num_rows == 0
    assert len(correction) == 0


def test_many_small_received_tables_are_combined_into_one_chunk() -> None:
    """A stalled shard keeps received tables from step to step: their chunks are bounded."""
    correction = Correction(ROWS, F(0))
    for i in range(MAX_CHUNKS + 1):
        correction.insert(table([(f"k{i}", 1, 1)]))
    got = correction.consolidate()
    assert got.column(0).num_chunks == 1
    assert got.num_rows == MAX_CHUNKS + 1


def test_many_large_received_tables_are_kept_as_they_are() -> None:
    """Chunks of a desired record's size (a hydration's) are not copied into one."""
    correction = Correction(ROWS, F(0))
    rows = [(f"k{i}", 1, 1) for i in range(MIN_CHUNK_ROWS)]
    for _ in range(MAX_CHUNKS + 1):
        correction.insert(table(rows))
    got = correction.consolidate()
    assert got.column(0).num_chunks == MAX_CHUNKS + 1
    assert got.num_rows == (MAX_CHUNKS + 1) * MIN_CHUNK_ROWS


@pytest.mark.parametrize(
    "mix",
    [
        "negated",  # read back from the shard
        "advanced",  # times advanced to since
        "kept",  # a previous consolidation's leftovers
        "checkpoint",  # a loaded checkpoint's
    ],
)
def test_updates_that_can_cancel_are_consolidated(mix: str) -> None:
    base = table([("a", 3, 1), ("b", 3, 1)])
    correction = Correction(ROWS, F(0), base if mix == "checkpoint" else None)
    if mix == "kept":
        correction.insert(base)
        correction.insert_negated(table([("c", 3, 1)]))
        correction.consolidate()
    if mix == "advanced":
        correction.insert(table([("a", 1, 1), ("b", 3, 1)]))
        correction.advance_since(F(3))
    correction.insert(table([("a", 3, -1), ("a", 3, -1)]))
    if mix == "negated":
        correction.insert_negated(table([("b", 3, 1)]))
    got = correction.consolidate()
    assert is_consolidated(got)
    expected = {
        "negated": Counter({("a", 3): -2, ("b", 3): -1}),
        "advanced": Counter({("a", 3): -1, ("b", 3): 1}),
        "kept": Counter({("a", 3): -1, ("b", 3): 1, ("c", 3): -1}),
        "checkpoint": Counter({("a", 3): -1, ("b", 3): 1}),
    }[mix]
    assert as_counter(got) == expected


ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "negated", "since", "consolidate", "retract"]),
        st.lists(
            st.tuples(st.sampled_from("abc"), st.integers(0, 6), st.integers(-2, 2)), max_size=6
        ),
        st.integers(0, 6),
    ),
    max_size=12,
)


@given(ops, st.integers(0, 8))
# a read-back dropped whole by a retraction leaves received updates, kept as received
@example([("insert", [("a", 1, 0)], 0), ("negated", [("a", 0, 0)], 0), ("retract", [], 1)], 0)
def test_matches_a_counter_model(
    steps: list[tuple[str, list[tuple[str, int, int]], int]], upper: int
) -> None:
    correction, model, since = Correction(ROWS, F(0)), Counter[tuple[str, int]](), 0
    #: (time, whether read back or advanced) of each row added since the last consolidation:
    #: a flagged row that no retraction dropped is consolidated with whatever it met
    pending: list[tuple[int, bool]] = []
    for op, rows, new_since in steps:
        if op == "consolidate":
            assert as_counter(correction.consolidate()) == Counter(
                {k: d for k, d in model.items() if d}
            )
            pending = []
        elif op == "retract":
            correction.retract_before(F(new_since))
            model = Counter({(k, t): d for (k, t), d in model.items() if t >= new_since})
            pending = [(t, flagged) for t, flagged in pending if t >= new_since]
        elif op == "since":
            since = max(since, new_since)
            pending = [(max(t, since), flagged or t < since) for t, flagged in pending]
            correction.advance_since(F(since))
            moved = Counter[tuple[str, int]]()
            for (k, t), d in model.items():
                moved[(k, max(t, since))] += d
            model = moved
        else:
            sign = 1 if op == "insert" else -1
            correction.insert(table(rows)) if sign == 1 else correction.insert_negated(table(rows))
            moved = any(t < since for _, t, _ in rows)
            for k, t, d in rows:
                model[(k, max(t, since))] += sign * d
                pending.append((max(t, since), sign == -1 or moved))
    expected = {key: d for key, d in model.items() if d}
    assert dict(as_counter(correction.consolidate())) == expected
    if any(flagged for _, flagged in pending):
        assert is_consolidated(correction.consolidate())
    before = {key: d for key, d in expected.items() if key[1] < upper}
    assert dict(as_counter(correction.updates_before(F(upper)))) == before


updates_lists = st.lists(
    st.tuples(st.sampled_from("abcd"), st.integers(0, 9), st.integers(-3, 3).filter(bool)),
    max_size=20,
)


@given(updates_lists, updates_lists, st.integers(1, 10))
def test_retract_before_equals_reading_back_our_own_part(
    before: list[tuple[str, int, int]], after: list[tuple[str, int, int]], upper: int
) -> None:
    """The write task drops its corrections before `upper` instead of negating the part it
    staged from them, once that part is appended: both must leave the same corrections, given
    that desired updates arriving after staging are at times >= upper (desired progress)."""
    staged_from = Correction(ROWS, F(0))
    staged_from.insert(table(before))
    part = staged_from.updates_before(F(upper))
    arriving = table([(k, upper + t, d) for k, t, d in after])
    negated, dropped = (
        Correction(ROWS, F(0), staged_from.consolidate()),
        Correction(ROWS, F(0), staged_from.consolidate()),
    )
    for correction in (negated, dropped):
        correction.insert(arriving)
    negated.insert_negated(part)
    dropped.retract_before(F(upper))
    assert as_counter(negated.consolidate()) == as_counter(dropped.consolidate())


@given(
    st.lists(
        st.tuples(
            st.booleans(), st.sampled_from("ab"), st.integers(0, 3), st.integers(-2, 2).filter(bool)
        ),
        max_size=30,
    )
)
def test_consolidate_sums_row_and_error_updates_separately(
    updates: list[tuple[bool, str, int, int]],
) -> None:
    """Row updates and error updates with the same text never merge; each sums by itself
    (read back from the shard, so they are consolidated)."""
    correction = Correction(ROWS, F(0))
    correction.insert_negated(
        normalize_updates(
            pa.table(
                {
                    "k": pa.array(
                        [None if err else name for err, name, _, _ in updates], pa.string()
                    ),
                    "_err": pa.array(
                        [name if err else None for err, name, _, _ in updates], pa.string()
                    ),
                    "_time": pa.array([t for _, _, t, _ in updates], pa.int64()),
                    "_diff": pa.array([d for _, _, _, d in updates], pa.int64()),
                }
            ),
            ROWS,
        )
    )
    model: Counter[tuple[bool, str, int]] = Counter()
    for err, name, t, d in updates:
        model[(err, name, t)] -= d
    got = {
        (r["_err"] is not None, r["_err"] or r["k"], r["_time"]): r["_diff"]
        for r in correction.consolidate().to_pylist()
    }
    assert got == {k: d for k, d in model.items() if d}
    assert correction.consolidate().schema == correction.schema

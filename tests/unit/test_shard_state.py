"""Pure shard logic: `apply_append` on state versions, update checks, and consolidation."""

from __future__ import annotations

import io
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mvsink.core.errors import ContractError, InvalidUsage
from mvsink.core.frontier import Frontier
from mvsink.core.updates import normalize_updates
from mvsink.shard.parts import (
    UpdateBeyondUpper,
    UpdateNotBeyondLower,
    check_bounds,
    consolidate_at,
    decode_part,
    dictionary_columns,
    encode_part,
)
from mvsink.shard.state import (
    PartRef,
    PartTooOld,
    ShardState,
    apply_append,
    apply_sweep_horizon,
    initial_state,
    links,
    staged_at,
)

ROWS = pa.schema([("k", pa.string()), ("v", pa.int64())])
F = Frontier.at


def part(key: str, lower: int, upper: int) -> PartRef:
    return PartRef(key, 0, 1, 1, 10, lower=F(lower), upper=F(upper), writer_id="w")


def test_initial_state() -> None:
    state = initial_state("s", ROWS, "n0")
    assert (state.seqno, state.upper, state.since, state.batches, state.appended) == (
        0,
        F(0),
        F(0),
        (),
        None,
    )


def test_apply_append_moves_upper_from_exactly_expected() -> None:
    zero = initial_state("s", ROWS, "n0")
    one = apply_append(zero, (part("a", 0, 3),), F(0), F(3), "n1")
    assert (one.seqno, one.upper, one.part_keys) == (1, F(3), {"a"})
    assert one.appended is not None and one.appended.seqno == 1
    empty = apply_append(one, (), F(3), F(5), "n2")
    assert empty.batches == one.batches  # an empty append keeps no batch
    assert empty.appended is not None and empty.appended.parts == ()
    assert zero.upper == F(0)  # versions are immutable values


@pytest.mark.parametrize(
    ("parts", "expected", "new", "message"),
    [
        ((), F(1), F(2), "expected"),  # the caller must have checked the upper
        ((), F(0), F(0), "empty"),
        ((part("a", 0, 2),), F(0), F(3), "staged for"),
        ((part("a", 0, 3), part("a", 0, 3)), F(0), F(3), "twice"),
    ],
)
def test_apply_append_rejects_invalid_usage(
    parts: tuple[PartRef, ...], expected: Frontier, new: Frontier, message: str
) -> None:
    with pytest.raises(InvalidUsage, match=message):
        apply_append(initial_state("s", ROWS, "n"), parts, expected, new, "n1")


def test_a_part_is_never_appended_twice_across_versions() -> None:
    one = apply_append(initial_state("s", ROWS, "n"), (part("a", 0, 1),), F(0), F(1), "n1")
    with pytest.raises(InvalidUsage, match="twice"):
        apply_append(one, (part("a", 1, 2),), F(1), F(2), "n2")


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 3)), max_size=12))
def test_chains_of_appends_keep_the_invariants(steps: list[tuple[int, int]]) -> None:
    state = initial_state("s", ROWS, "n")
    for i, (width, count) in enumerate(steps):
        lower = state.upper
        upper = F(lower.time + width)  # type: ignore[operator]
        parts = tuple(
            PartRef(f"p{i}.{j}", None, None, 1, 1, lower=lower, upper=upper, writer_id="w")
            for j in range(count)
        )
        following = apply_append(state, parts, lower, upper, f"n{i}")
        assert following.seqno == state.seqno + 1  # invariant 1
        assert state.upper.less_than(following.upper)  # invariant 2
        state = following
    keys = [p.key for p in state.parts()]
    assert len(keys) == len(set(keys))  # invariant 3
    for previous, batch in zip(state.batches, state.batches[1:], strict=False):
        assert previous.upper.less_equal(batch.lower)
    assert ShardState.from_bytes(state.to_bytes()) == state


def test_reserved_column_names_are_refused() -> None:
    with pytest.raises(ContractError, match="reserved"):
        initial_state("s", pa.schema([("_time", pa.int64())]), "n")


def _updates(
    rows: list[tuple[str | None, int | None, int, int]], err: list[str | None] | None = None
) -> pa.Table:
    data = {
        "k": pa.array([r[0] for r in rows], pa.string()),
        "v": pa.array([r[1] for r in rows], pa.int64()),
        "_time": pa.array([r[2] for r in rows], pa.int64()),
        "_diff": pa.array([r[3] for r in rows], pa.int64()),
    }
    if err is not None:
        data["_err"] = pa.array(err, pa.string())
    return pa.table(data)


@pytest.mark.parametrize(
    ("times", "error"),
    [([4], UpdateNotBeyondLower), ([10], UpdateBeyondUpper), ([5, 9], None), ([], None)],
)
def test_check_bounds(times: list[int], error: type[Exception] | None) -> None:
    table = normalize_updates(_updates([("a", 1, t, 1) for t in times]), ROWS)
    if error is None:
        check_bounds(table, F(5), F(10))
    else:
        with pytest.raises(error):
            check_bounds(table, F(5), F(10))


def test_normalize_updates_casts_and_adds_err() -> None:
    table = pa.table({"v": pa.array([1], pa.int32()), "k": ["a"], "_diff": [1], "_time": [0]})
    normal = normalize_updates(table, ROWS)
    assert normal.column_names == ["k", "v", "_time", "_diff", "_err"]
    assert normal.schema.field("v").type == pa.int64()
    assert normal.column("_err").null_count == 1
    with pytest.raises(InvalidUsage, match="null _diff"):
        normalize_updates(
            pa.table({"k": ["a"], "v": [1], "_time": [0], "_diff": pa.array([None], pa.int64())}),
            ROWS,
        )


def test_part_encoding_round_trips() -> None:
    table = normalize_updates(_updates([("a", 1, 0, 1), (None, None, 1, 2)], err=[None, "e"]), ROWS)
    assert decode_part(encode_part(table, {"mvsink.lower": "[0]"}), ROWS).equals(table)


def _dictionary_encoded(data: bytes) -> dict[str, bool]:
    """Per column of a part's first row group: whether a dictionary encoding was used."""
    group = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0)
    return {
        group.column(i).path_in_schema: group.column(i).has_dictionary_page
        for i in range(group.num_columns)
    }


def test_a_part_dictionary_encodes_only_the_columns_that_repeat() -> None:
    """A key column of distinct values is written plain (a dictionary as large as the column
    only costs), the repeating columns keep their dictionary, and the part reads back equal."""
    rows = [(f"key-{i:06d}", i % 3, 7, 1 - 2 * (i % 2)) for i in range(3000)]
    table = normalize_updates(_updates(rows), ROWS)
    data = encode_part(table, {})
    assert _dictionary_encoded(data) == {
        "k": False,
        "v": True,
        "_time": True,
        "_diff": True,
        "_err": True,
    }
    assert decode_part(data, ROWS).equals(table)
    # Fewer distinct keys than half the sample: a dictionary pays, as for every other column.
    repeating = normalize_updates(_updates([(f"k{i % 400}", 1, 7, 1) for i in range(3000)]), ROWS)
    assert dictionary_columns(repeating) is True
    assert all(_dictionary_encoded(encode_part(repeating, {})).values())
    # Nested columns keep Parquet's default.
    nested = pa.table({"s": pa.array([{"a": i} for i in range(10)])})
    assert dictionary_columns(nested) is True


updates_strategy = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", None]), st.integers(0, 2), st.integers(0, 6), st.integers(-3, 3)
    ),
    max_size=30,
)


@given(updates_strategy, st.integers(1, 7))
def test_consolidate_at_matches_a_counter_model(
    rows: list[tuple[str | None, int, int, int]], as_of: int
) -> None:
    errs = [None if k is not None else "boom" for k, _, _, _ in rows]
    table = normalize_updates(_updates(rows, err=errs), ROWS)
    model: Counter[tuple[str | None, int | None, str | None]] = Counter()
    for (k, v, t, d), e in zip(rows, errs, strict=True):
        if t < as_of:
            model[(k, v, e)] += d
    got = consolidate_at(table, ROWS, F(as_of)).to_pylist()
    assert {(r["k"], r["v"], r["_err"]): r["_diff"] for r in got} == {
        key: d for key, d in model.items() if d
    }
    assert all(r["_time"] == as_of - 1 for r in got)


def test_a_parts_footer_metadata_reads_from_its_last_bytes() -> None:
    """`delete_staged` reads a part's bounds from its tail, not the whole part."""
    from mvsink.shard.parts import footer_metadata

    table = normalize_updates(
        pa.table(
            {"k": ["a"] * 5000, "v": list(range(5000)), "_time": [3] * 5000, "_diff": [1] * 5000}
        ),
        ROWS,
    )
    data = encode_part(table, {"mvsink.lower": "[3]", "mvsink.upper": "[4]"})
    meta = footer_metadata(data[-4096:])
    assert meta is not None and meta[b"mvsink.lower"] == b"[3]" and meta[b"mvsink.upper"] == b"[4]"
    assert footer_metadata(data[-20:]) is None  # the footer is longer: read more
    with pytest.raises(pa.ArrowException):
        footer_metadata(b"not a parquet file at all")


# -- the sweeper's fence ------------------------------------------------------------------------


def staged(at: float, lower: int = 0, upper: int = 3) -> PartRef:
    """A part whose key says it was staged at unix time `at`."""
    return PartRef(
        f"shards/s/parts/w/{int(at * 1000)}-u.parquet",
        0,
        1,
        1,
        10,
        lower=F(lower),
        upper=F(upper),
        writer_id="w",
    )


@pytest.mark.parametrize(
    ("horizon", "at", "refused"),
    [(0.0, 1.0, False), (100.0, 100.0, False), (100.0, 99.999, True), (100.0, 500.0, False)],
)
def test_the_sweep_horizon_refuses_parts_staged_before_it(
    horizon: float, at: float, refused: bool
) -> None:
    zero = apply_sweep_horizon(initial_state("s", ROWS, "n0"), horizon, "n1", 0.0)
    if refused:
        with pytest.raises(PartTooOld, match="sweep horizon"):
            apply_append(zero, (staged(at),), F(0), F(3), "n2")
    else:
        assert apply_append(zero, (staged(at),), F(0), F(3), "n2").part_keys == {staged(at).key}


def test_the_sweep_horizon_never_moves_back_and_survives_serialisation() -> None:
    zero = initial_state("s", ROWS, "n0")
    assert b"sweep_horizon" not in zero.to_bytes()  # absent until a sweeper sets it
    one = apply_sweep_horizon(zero, 100.0, "n1", 0.0)
    two = apply_sweep_horizon(one, 50.0, "n2", 0.0)
    assert (one.sweep_horizon, two.sweep_horizon, two.change) == (100.0, 100.0, "sweep")
    assert ShardState.from_bytes(two.to_bytes()).sweep_horizon == 100.0


def test_with_a_horizon_a_key_stage_did_not_make_is_refused() -> None:
    one = apply_sweep_horizon(initial_state("s", ROWS, "n0"), 1.0, "n1", 0.0)
    with pytest.raises(InvalidUsage, match="not a key"):
        apply_append(one, (part("foreign.parquet", 0, 3),), F(0), F(3), "n2")


def test_staged_at_reads_the_key() -> None:
    assert staged_at("shards/s/parts/w/1234567-abc.parquet") == 1234.567
    with pytest.raises(InvalidUsage):
        staged_at("shards/s/parts/w/abc.parquet")


@pytest.mark.parametrize(
    ("older", "newer_prev", "linked"),
    [
        (("n1", "n0"), "n1", True),  # computed from it
        (("n1", "n0"), "x", False),  # a stray below the version
        (("n1", ""), "", True),  # both written before `prev` was recorded
        (("n1", "n0"), "", False),  # a stray (it records a prev) below a version without one
    ],
)
def test_links_tells_a_version_from_a_stray(
    older: tuple[str, str], newer_prev: str, linked: bool
) -> None:
    assert links(*older, newer_prev) is linked


def test_every_successor_records_its_predecessors_nonce() -> None:
    zero = initial_state("s", ROWS, "n0")
    one = apply_sweep_horizon(zero, 1.0, "n1", 0.0)
    two = apply_append(one, (), F(0), F(3), "n2")
    assert (one.prev, two.prev) == ("n0", "n1")
    assert ShardState.from_bytes(two.to_bytes()).prev == "n1"
    assert b'"prev"' not in zero.to_bytes()  # version 0 has none

"""Pure tests of `since`, reader leases, compare-and-merge and the merge policy
(`mvsink.shard.state`, `mvsink.shard.parts.merge_updates`): no S3, parts held in memory."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mvsink.core.frontier import Frontier
from mvsink.core.partitioning import CURRENT, partitions_of
from mvsink.core.settings import CompactionPolicy
from mvsink.core.updates import normalize_updates, part_schema
from mvsink.shard.parts import consolidate_at, merge_updates
from mvsink.shard.state import (
    AsOfBeforeSince,
    BatchRecord,
    MergeRequest,
    PartRef,
    ShardState,
    apply_append,
    apply_lease,
    apply_merge,
    apply_release,
    apply_release_holds,
    apply_retain_history,
    apply_set_holds,
    initial_state,
    maybe_merge,
    merge_all,
    select_parts,
    settle,
)

ROWS = pa.schema([("k", pa.string()), ("v", pa.int64())])
F = Frontier.at
P = 2


def part(key: str, lower: int, upper: int, updates: int = 1, partition: int | None = 0) -> PartRef:
    total = None if partition is None else P
    return PartRef(
        key, partition, total, updates, 10 * updates, lower=F(lower), upper=F(upper), writer_id="w"
    )


def chain(*widths: int, retain: int | None = 0, sizes: list[int] | None = None) -> ShardState:
    """A shard with one batch per width (one part each, `sizes[i]` updates)."""
    state = initial_state("s", ROWS, "n0", retain)
    for i, width in enumerate(widths):
        lower = state.upper.time or 0
        size = sizes[i] if sizes else 1
        state = apply_append(
            state,
            (part(f"p{i}", lower, lower + width, size),),
            F(lower),
            F(lower + width),
            f"n{i + 1}",
        )
    return state


# -- since and leases ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retain", "leases", "now", "expected"),
    [
        (None, [], 0.0, 0),  # no retention policy: since never advances by itself
        (0, [], 0.0, 10),  # since follows the upper
        (3, [], 0.0, 7),  # trails it by retain_history
        (20, [], 0.0, 0),  # never below zero
        (0, [("r", 4, 100.0)], 50.0, 4),  # a live lease holds it
        (0, [("r", 4, 100.0), ("q", 6, 100.0)], 50.0, 4),  # the lowest hold wins
        (0, [("r", 4, 100.0)], 150.0, 10),  # an expired lease holds nothing
    ],
)
def test_since_trails_the_upper_by_the_retention_and_the_live_leases(
    retain: int | None, leases: list[tuple[str, int, float]], now: float, expected: int
) -> None:
    """Invariant 4: since = max(since, min(upper - retain_history, live holds))."""
    from mvsink.shard.state import ReaderLease

    state = replace(
        chain(4, 6, retain=None),
        retain_history=retain,
        readers=tuple(ReaderLease(r, F(h), e) for r, h, e in leases),
    )
    settled = settle(state, now)
    assert settled.since == F(expected)
    assert all(r.expires_at > now for r in settled.readers)


def test_since_never_regresses_and_a_closed_upper_keeps_it() -> None:
    state = settle(replace(chain(5, retain=0), since=F(5)), 0.0)
    lowered = apply_retain_history(state, 10, "n", 0.0)
    assert lowered.since == F(5)  # a larger retention does not bring history back
    closed = apply_append(lowered, (), F(5), Frontier.empty(), "n2")
    assert closed.since == F(5)


def test_a_lease_holds_since_until_it_expires() -> None:
    state = chain(2, retain=0)  # since = upper = 2
    held = apply_lease(state, "reader", None, expires_at=100.0, nonce="n", now=0.0)
    assert held.lease("reader") is not None and held.lease("reader").since == F(2)  # type: ignore[union-attr]
    appended = apply_append(held, (), F(2), F(9), "n2", now=50.0)
    assert appended.since == F(2)  # held
    moved = apply_lease(appended, "reader", F(7), 100.0, "n3", now=60.0)
    assert moved.since == F(7)
    back = apply_lease(moved, "reader", F(3), 100.0, "n4", now=61.0)
    assert back.lease("reader").since == F(7)  # type: ignore[union-attr]  # never backwards
    expired = apply_append(back, (), F(9), F(12), "n5", now=101.0)
    assert expired.readers == () and expired.since == F(12)
    with pytest.raises(AsOfBeforeSince, match="compacted to since"):
        apply_lease(expired, "reader", F(7), 200.0, "n6", now=102.0)
    released = apply_release(
        apply_lease(expired, "other", None, 300.0, "n7", 102.0), "other", "n8", 103.0
    )
    assert released.readers == ()


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # (lease-change times, pin?) per step; the seqno each lease pins after it
        ([(0.0, True)], [2]),  # a new pin names the version the lease writes
        ([(0.0, True), (50.0, True), (90.0, True)], [2, 2, 2]),  # renewals keep it
        ([(0.0, True), (150.0, True)], [2, 3]),  # an expired lease is a new one: a new pin
        ([(0.0, False), (50.0, True)], [None, 3]),  # pinning a plain lease pins from then on
        ([(0.0, True), (50.0, False)], [2, None]),  # a plain renewal drops the pin
    ],
)
def test_a_pinning_lease_names_its_version_until_it_expires(
    steps: list[tuple[float, bool]], expected: list[int | None]
) -> None:
    state = chain(1, retain=0)  # version 1
    pinned = []
    for n, (now, pin) in enumerate(steps):
        state = apply_lease(state, "reader", None, now + 100.0, f"n{n}", now, pin=pin)
        pinned.append(state.lease("reader").seqno)  # type: ignore[union-attr]
    assert pinned == expected
    again = ShardState.from_bytes(state.to_bytes())
    assert again.readers == state.readers
    assert again.pins() == (() if expected[-1] is None else ((expected[-1], steps[-1][0] + 100),))
    if expected[-1] is None:
        assert "seqno" not in json.loads(state.to_bytes())["readers"][0]  # older readers' form


def test_a_critical_hold_holds_since_after_every_lease_expired() -> None:
    """A checkpoint's hold (persist's critical since handle) never lapses: a driver away for
    longer than any lease still finds `since` at its checkpoint. It moves forward only, with
    the lease that carries it, and goes only when released."""
    state = chain(2, retain=0)  # since = upper = 2
    held = apply_lease(state, "driver", None, 100.0, "n1", 0.0, holds={"checkpoint:s:p0": F(2)})
    moved = apply_lease(held, "driver", None, 100.0, "n2", 1.0, holds={"checkpoint:s:p0": F(1)})
    assert moved.hold("checkpoint:s:p0").since == F(2)  # type: ignore[union-attr]  # not back
    later = apply_append(moved, (), F(2), F(30), "n3", now=10_000.0)  # every lease expired
    assert later.readers == () and later.since == F(2)
    assert ShardState.from_bytes(later.to_bytes()).holds == later.holds
    forward = apply_lease(
        later,
        "driver",
        None,
        20_000.0,
        "n4",
        10_001.0,
        holds={"checkpoint:s:p0": F(25), "checkpoint:s:p1": F(0)},
    )
    assert forward.since == F(2)  # p1's new hold starts at since, not before
    assert forward.hold("checkpoint:s:p1").since == F(2)  # type: ignore[union-attr]
    released = apply_release_holds(forward, ["checkpoint:s:p1"], "n5", 20_002.0)
    assert released.since == F(25) and [h.holder_id for h in released.holds] == ["checkpoint:s:p0"]
    gone = apply_release_holds(released, ["checkpoint:s:p0"], "n6", 20_003.0)
    assert gone.since == F(30) and gone.holds == ()
    assert b'"holds"' not in gone.to_bytes()  # versions without holds keep their earlier form


def test_set_holds_moves_a_hold_back_but_never_before_since() -> None:
    state = apply_set_holds(chain(2, 3, retain=None), {"h": F(5)}, "n", 0.0)  # since stays 0
    back = apply_set_holds(state, {"h": F(3)}, "n2", 1.0)
    assert back.hold("h").since == F(3) and back.since == F(0)  # type: ignore[union-attr]
    followed = apply_retain_history(back, 0, "n3", 2.0)  # since follows the upper, up to h
    assert followed.since == F(3)
    with pytest.raises(AsOfBeforeSince, match="compacted to since"):
        apply_set_holds(followed, {"h": F(2)}, "n4", 3.0)


@given(
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 40), st.booleans()), max_size=20)
)
def test_since_never_passes_a_critical_hold(moves: list[tuple[str, int, bool]]) -> None:
    """Whatever holds move, appends and releases interleave (no leases: they expired), `since`
    never regresses and never passes a hold."""
    state = chain(1, retain=0)
    now = 0.0
    for holder, to, append in moves:
        now += 1000.0
        if append and state.upper.time is not None:
            upper = state.upper.time
            state = apply_append(state, (), F(upper), F(upper + 3), f"n{now}", now)
        else:
            state = apply_lease(state, "d", None, now + 1, f"l{now}", now, holds={holder: F(to)})
        for hold in state.holds:
            assert state.since.less_equal(hold.since)
        assert state.since.less_equal(state.upper)


# -- compare-and-merge --------------------------------------------------------------------------


def test_a_merge_replaces_a_contiguous_run_by_one_batch() -> None:
    state = chain(1, 2, 3, 4)
    request = MergeRequest(state.batches[1:3], state.since, P, "test")
    assert (request.lower, request.upper) == (F(1), F(6))
    out = (part("m", 1, 6, 2, 0), part("m1", 1, 6, 3, 1))
    merged = apply_merge(state, request, out, "n", 0.0)
    assert merged is not None and merged.change == "merge"
    assert [(b.lower, b.upper) for b in merged.batches] == [
        (F(0), F(1)),
        (F(1), F(6)),
        (F(6), F(10)),
    ]
    assert merged.part_keys == {"p0", "m", "m1", "p3"} and merged.upper == state.upper


def test_a_merge_whose_inputs_are_gone_is_refused() -> None:
    """Compare-and-merge: a second compactor's overlapping merge, planned on the same version,
    finds an input gone and is refused (its result is discarded)."""
    state = chain(1, 1, 1, 1)
    first = MergeRequest(state.batches[0:2], state.since, P, "a")
    second = MergeRequest(state.batches[1:4], state.since, P, "b")
    after_first = apply_merge(state, first, (part("a", 0, 2),), "n", 0.0)
    assert after_first is not None
    assert apply_merge(after_first, second, (part("b", 1, 4),), "n", 0.0) is None
    disjoint = MergeRequest(state.batches[2:4], state.since, P, "c")
    assert apply_merge(after_first, disjoint, (part("c", 2, 4),), "n", 0.0) is not None
    appended = apply_append(after_first, (part("x", 4, 5),), F(4), F(5), "n")
    assert apply_merge(appended, disjoint, (part("c", 2, 4),), "n", 0.0) is not None  # still live
    tail = apply_merge(
        state, MergeRequest(state.batches[2:4], state.since, P, "t"), (part("t", 2, 4),), "n", 0.0
    )
    assert tail is not None  # the first input of `second` is still live, its last ones are not
    assert apply_merge(tail, second, (part("b", 1, 4),), "n", 0.0) is None


@pytest.mark.parametrize(
    ("outputs", "message"),
    [((part("m", 0, 1),), "staged for"), ((part("p3", 0, 2),), "reuses")],
)
def test_merge_outputs_must_fit_the_merged_bounds(
    outputs: tuple[PartRef, ...], message: str
) -> None:
    from mvsink.core.errors import InvalidUsage

    state = chain(1, 1, 1, 1)
    request = MergeRequest(state.batches[0:2], state.since, P, "a")
    with pytest.raises(InvalidUsage, match=message):
        apply_merge(state, request, outputs, "n", 0.0)


def test_a_merge_with_no_output_drops_the_run() -> None:
    """Inputs that consolidate to nothing leave no batch (like an empty append)."""
    state = chain(1, 1, 1)
    merged = apply_merge(state, MergeRequest(state.batches[:2], state.since, P, "a"), (), "n", 0.0)
    assert merged is not None and [b.lower for b in merged.batches] == [F(2)]


# -- the policy -----------------------------------------------------------------------------------

POLICY = CompactionPolicy()


@pytest.mark.parametrize(
    ("sizes", "retain", "expected"),
    [
        ([100], 0, None),
        ([100, 10], 0, None),
        ([100, 60, 40], 0, ("amplification", 0, 3)),  # newer batches reach the oldest's size
        ([1000, 10, 10, 10, 10], 0, ("size ratio", 1, 5)),  # four similar new batches
        ([1000, 300, 10, 10, 10], 0, None),  # three similar, the next too big: wait
        ([1000, 10, 10, 10], 0, None),
        # since trails the upper (`retain`): only the batches it passed count. The newest is
        # not passed: the passed newer ones (60) are not enough yet ...
        ([100, 60, 40], 1, None),
        # ... and once they are, only the passed ones merge
        ([100, 60, 50, 40], 1, ("amplification", 0, 3)),
        # a run of four similar batches, but only two passed: wait
        ([1000, 10, 10, 10, 10], 2, None),
        ([1000, 10, 10, 10, 10, 10, 10], 2, ("size ratio", 1, 5)),
        # since kept still: nothing passes; the run waits until 12 batches are not passed
        ([1000, *[10] * 10], None, None),
        ([1000, *[10] * 11], None, ("size ratio", 1, 12)),
    ],
)
def test_the_policy_merges_what_since_passed_by_amplification_then_size_ratio(
    sizes: list[int], retain: int | None, expected: tuple[str, int, int] | None
) -> None:
    """A merge advances times only before `since`: batches past it would be rewritten without
    collapsing, so amplification and size-ratio merges wait for `since` to pass them."""
    state = chain(*([1] * len(sizes)), retain=retain, sizes=sizes)
    request = maybe_merge(state, POLICY)
    if expected is None:
        assert request is None
    else:
        assert request is not None
        reason, start, end = expected
        assert (request.reason, request.inputs) == (reason, state.batches[start:end])


def test_the_policy_caps_the_number_of_batches() -> None:
    policy = CompactionPolicy(max_amplification=1e9, size_ratio=0.0, min_merge=100, max_batches=4)
    state = chain(1, 1, 1, 1, 1, 1, sizes=[10**6, 10**5, 10**4, 10**3, 5, 7])
    request = maybe_merge(state, policy)
    assert request is not None and request.reason == "count"
    assert request.inputs == state.batches[3:6]  # the cheapest run that gets back to 4


def _simulate(
    ticks: int, policy: CompactionPolicy, retain: int | None = 0, view: int | None = None
) -> tuple[list[int], list[int], int]:
    """Append `ticks` batches of one update each, merging as the policy asks after each; live
    batch counts and sizes after each tick, and the updates all merges read. Without `view`
    nothing cancels (sizes add up); with it, a first batch of `view` updates and churn: the
    merged batches `since` has passed collapse to at most `view` updates."""
    state, counts, sizes, rewritten = initial_state("s", ROWS, "n", retain), [], [], 0
    for t in range(ticks):
        size = view if view and t == 0 else 1
        state = apply_append(state, (part(f"a{t}", t, t + 1, size),), F(t), F(t + 1), "n")
        while (request := maybe_merge(state, policy)) is not None:
            rewritten += request.updates
            out_size = request.updates
            if view:
                passed = sum(
                    b.updates for b in request.inputs if b.upper.less_equal(request.advance_before)
                )
                out_size += min(passed, view) - passed
            out = part(
                f"m{t}.{len(state.batches)}",
                request.lower.time or 0,
                request.upper.time or 0,
                out_size,
            )
            merged = apply_merge(state, request, (out,), "n", 0.0)
            assert merged is not None
            state = merged
        counts.append(len(state.batches))
        sizes.append(sum(b.updates for b in state.batches))
    return counts, sizes, rewritten


@pytest.mark.parametrize("retain", [0, 3, 8, None])
def test_live_batches_stay_logarithmic_in_history_without_consolidation(retain: int | None) -> None:
    """The worst case for size: nothing ever cancels. Live batches stay O(log history) and
    each update is rewritten O(log history) times, however far `since` trails (`retain`)."""
    counts, _, rewritten = _simulate(2000, POLICY, retain)
    assert max(counts) <= POLICY.max_batches
    assert max(counts) <= 4 * math.log2(2000)
    assert rewritten / 2000 <= math.log2(2000)


@pytest.mark.parametrize(("retain", "most"), [(0, 2), (3, 3), (8, 4)])
def test_churn_collapses_to_the_view_without_rewriting_what_since_holds(
    retain: int, most: int
) -> None:
    """20% of a view of 5 changed per tick: the shard stays within a small multiple of the
    view plus what `since` holds back, and each update is read by merges fewer than 3 times
    (merges take only batches `since` has passed)."""
    _, sizes, rewritten = _simulate(2000, POLICY, retain, view=5)
    assert max(sizes[50:]) <= most * 5 + retain
    assert rewritten / 2000 < 3


# -- contents are unchanged by any merge: random histories -----------------------------------------

update = st.tuples(
    st.sampled_from("abcd"), st.integers(0, 2), st.integers(0, 3), st.integers(-2, 2).filter(bool)
)
step = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3), st.lists(update, max_size=6), st.booleans()),
    st.tuples(st.just("merge"), st.integers(0, 10), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("lease"), st.sampled_from(["r1", "r2"]), st.integers(0, 3), st.booleans()),
    st.tuples(st.just("retain"), st.sampled_from([None, 0, 1, 3]), st.just(0), st.just(False)),
    st.tuples(st.just("clock"), st.integers(1, 40), st.just(0), st.just(False)),
)


def _table(rows: list[tuple[str, int, int, int]]) -> pa.Table:
    return normalize_updates(
        pa.table(
            {
                "k": pa.array([r[0] for r in rows], pa.string()),
                "v": pa.array([r[1] for r in rows], pa.int64()),
                "_time": pa.array([r[2] for r in rows], pa.int64()),
                "_diff": pa.array([r[3] for r in rows], pa.int64()),
            }
        ),
        ROWS,
    )


class World:
    """A shard in memory: pure state versions plus a dict of part contents."""

    def __init__(self) -> None:
        self.state = initial_state("s", ROWS, "n", 0)
        self.blobs: dict[str, pa.Table] = {}
        self.history: list[tuple[str, int, int, int]] = []
        self.now = 0.0
        self.stale: list[tuple[MergeRequest, tuple[PartRef, ...]]] = []
        self.keys = 0

    def key(self) -> str:
        self.keys += 1
        return f"k{self.keys}"

    def stage(
        self, table: pa.Table, lower: Frontier, upper: Frontier, partition: int | None
    ) -> PartRef:
        key = self.key()
        self.blobs[key] = table
        total = None if partition is None else P
        return PartRef(
            key,
            partition,
            total,
            table.num_rows,
            1,
            CURRENT,
            lower=lower,
            upper=upper,
            writer_id="w",
        )

    def append(self, width: int, rows: list[tuple[str, int, int, int]], foreign: bool) -> None:
        lower = self.state.upper.time or 0
        rows = [(k, v, lower + min(off, width - 1), d) for k, v, off, d in rows]
        self.history.extend(rows)
        table, parts = _table(rows), []
        if foreign:
            parts.append(self.stage(table, F(lower), F(lower + width), None))
        else:
            hashes = partitions_of(table, ROWS, P).to_pylist()
            for p in range(P):
                chosen = table.filter(pa.array([h == p for h in hashes], pa.bool_()))
                if chosen.num_rows:
                    parts.append(self.stage(chosen, F(lower), F(lower + width), p))
        self.state = apply_append(
            self.state, tuple(parts), F(lower), F(lower + width), "n", self.now
        )

    def run_merge(self, request: MergeRequest) -> tuple[PartRef, ...]:
        """What a compactor does: per output partition, read, merge, stage."""
        outputs = []
        targets = [None] if request.partitions_total is None else range(request.partitions_total)
        for partition in targets:
            tables = []
            for choice in select_parts(
                request.inputs, partition, request.partitions_total, request.partitioning
            ):
                table = self.blobs[choice.part.key]
                if choice.needs_filter and partition is not None:
                    hashes = partitions_of(table, ROWS, P).to_pylist()
                    table = table.filter(pa.array([h == partition for h in hashes], pa.bool_()))
                tables.append(table)
            table = pa.concat_tables(tables) if tables else part_schema(ROWS).empty_table()
            merged = merge_updates(table, ROWS, request.advance_before)
            if merged.num_rows:
                outputs.append(self.stage(merged, request.lower, request.upper, partition))
        return tuple(outputs)

    def merge(self, start: int, width: int, stale: bool) -> None:
        batches = self.state.batches
        if not batches:
            return
        start = start % len(batches)
        run = batches[start : start + width]
        request = maybe_merge(self.state, POLICY) if start == 0 else None
        request = request or MergeRequest(run, self.state.since, P, "random")
        outputs = self.run_merge(request)
        if stale:  # committed later, after other changes: compare-and-merge decides
            self.stale.append((request, outputs))
            return
        merged = apply_merge(self.state, request, outputs, "n", self.now)
        assert merged is not None
        self.state = merged

    def commit_stale(self) -> None:
        for request, outputs in self.stale:
            live = all(b in self.state.batches for b in request.inputs)
            merged = apply_merge(self.state, request, outputs, "n", self.now)
            assert (merged is not None) == live, "refused iff an input is gone"
            if merged is not None:
                self.state = merged
        self.stale = []

    def contents(self, as_of: int) -> dict[tuple[str, int], int]:
        tables = [self.blobs[p.key] for p in self.state.parts()]
        table = pa.concat_tables(tables) if tables else part_schema(ROWS).empty_table()
        got = consolidate_at(table, ROWS, F(as_of))
        return {(r["k"], r["v"]): r["_diff"] for r in got.to_pylist()}

    def model(self, as_of: int) -> dict[tuple[str, int], int]:
        counts: Counter[tuple[str, int]] = Counter()
        for k, v, t, d in self.history:
            if t < as_of:
                counts[(k, v)] += d
        return {key: d for key, d in counts.items() if d}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=25))
def test_merges_never_change_the_contents_at_any_frontier_at_or_after_since(
    steps: list[tuple[Any, ...]],
) -> None:
    """Invariants 1-5 under random appends, merges (policy-chosen or random runs, some
    committed late against newer versions), leases, retention changes and a moving clock."""
    world = World()
    for kind, a, b, c in steps:
        before = world.state
        if kind == "append":
            world.append(a, b, c)
        elif kind == "merge":
            world.merge(a, b, c)
        elif kind == "lease":
            hold = settle(world.state, world.now).since.time + b  # type: ignore[operator]
            hold = min(hold, world.state.upper.time or 0)
            if c:
                world.state = apply_release(world.state, a, "n", world.now)
            else:
                world.state = apply_lease(world.state, a, F(hold), world.now + 30, "n", world.now)
        elif kind == "retain":
            world.state = apply_retain_history(world.state, a, "n", world.now)
        else:
            world.now += a
            world.commit_stale()
        state = world.state
        if state is not before and kind != "clock":  # a clock step may commit several merges
            assert state.seqno == before.seqno + 1  # 1
        assert before.upper.less_equal(state.upper)  # 2
        assert before.since.less_equal(state.since) and state.since.less_equal(state.upper)  # 4
        for earlier, later in zip(state.batches, state.batches[1:], strict=False):  # 3
            assert earlier.lower.less_than(earlier.upper) and earlier.upper.less_equal(later.lower)
        assert all(state.since.less_equal(r.since) for r in state.readers)  # 4
        for as_of in range(state.since.time or 0, (state.upper.time or 0) + 1):  # 5
            assert world.contents(as_of) == world.model(as_of), (as_of, state.since)
    world.commit_stale()
    final = world.state
    assert ShardState.from_bytes(final.to_bytes()) == final


def test_merge_all_consolidates_churn_to_the_size_of_the_view() -> None:
    """A view of 4 keys whose values change every tick: after a forced merge at since, the shard
    holds exactly the 4 current rows."""
    world = World()
    for t in range(12):
        rows = [(k, t, 0, 1) for k in "abcd"] + ([(k, t - 1, 0, -1) for k in "abcd"] if t else [])
        world.append(1, rows, foreign=t % 5 == 4)
    request = merge_all(world.state)
    assert request is not None and request.since == F(12)
    merged = apply_merge(world.state, request, world.run_merge(request), "n", 0.0)
    assert merged is not None
    world.state = merged
    assert world.state.total_updates() == 4 and len(world.state.batches) == 1
    assert {p.partitions_total for p in world.state.parts()} == {P}  # foreign rows re-partitioned
    assert world.contents(12) == {(k, 11): 1 for k in "abcd"}


def test_format_1_documents_are_still_read() -> None:
    """A version written before compaction (every part with its own bounds, no leases)."""
    current = chain(1, 2)
    document = json.loads(current.to_bytes())
    document["format"] = 1
    for name in ("retain_history", "readers", "change"):
        del document[name]
    for batch in document["batches"]:
        for raw in batch["parts"]:
            raw["lower"], raw["upper"] = batch["lower"], batch["upper"]
    old = ShardState.from_bytes(json.dumps(document).encode())
    assert old.batches == current.batches and old.retain_history is None and old.readers == ()
    assert old.change == "append"
    assert isinstance(old.batches[0], BatchRecord)

"""The shard library against a real S3 (MinIO): open/stage/compare-and-append/readers, safe
deletion and the sweeper. Linearizability and snapshot properties have their own modules."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa
import pytest

from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchId, StagedBatch
from mvsink.core.partitioning import partitions_of
from mvsink.core.updates import normalize_updates
from mvsink.io.config import S3Settings
from mvsink.shard import (
    Appended,
    InvalidUsage,
    PartRef,
    PartTooOld,
    SchemaMismatch,
    Shard,
    Timing,
    UpdateBeyondUpper,
    UpdateNotBeyondLower,
    UpperMismatch,
    open_shard,
)
from mvsink.shard.state import ShardState

pytestmark = pytest.mark.integration

ROWS = pa.schema([("customer", pa.string()), ("orders", pa.int64())])
FAST = Timing(
    max_attempt_age=1.0,
    max_part_age=2.0,
    min_grace=3.5,
    poll_interval=0.02,
    part_grace=0.3,
    version_grace=2.5,
    request_timeout=1.0,
)
F = Frontier.at

OpenShard = Callable[..., Shard]


def updates(
    *rows: tuple[str | None, int | None, int, int], err: list[str | None] | None = None
) -> pa.Table:
    """A table of updates `(customer, orders, time, diff)`."""
    columns = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
    data = {
        "customer": pa.array(columns[0], pa.string()),
        "orders": pa.array(columns[1], pa.int64()),
        "_time": pa.array(columns[2], pa.int64()),
        "_diff": pa.array(columns[3], pa.int64()),
    }
    if err is not None:
        data["_err"] = pa.array(err, pa.string())
    return pa.table(data)


@pytest.fixture
def new_shard(s3_settings: S3Settings) -> OpenShard:
    def make(timing: Timing = FAST, schema: pa.Schema = ROWS) -> Shard:
        return open_shard(f"t-{uuid.uuid4().hex[:12]}", schema, s3_settings, timing)

    return make


def _rows(table: pa.Table) -> list[tuple[object, ...]]:
    return sorted(
        (tuple(r.values()) for r in table.to_pylist()), key=lambda r: tuple(str(v) for v in r)
    )


def test_open_creates_version_zero_and_checks_the_schema(
    new_shard: OpenShard, s3_settings: S3Settings
) -> None:
    shard = new_shard()
    state = shard.state()
    assert (state.seqno, state.upper, state.since, state.batches) == (0, F(0), F(0), ())
    again = open_shard(shard.shard_id, ROWS, s3_settings)
    assert again.upper() == F(0)
    other = pa.schema([("customer", pa.string()), ("orders", pa.int32())])
    with pytest.raises(SchemaMismatch, match=r"orders int64.*not.*orders int32"):
        open_shard(shard.shard_id, other, s3_settings)
    assert open_shard(shard.shard_id, None, s3_settings).schema.equals(ROWS)


def test_stage_rejects_updates_outside_their_bounds(new_shard: OpenShard) -> None:
    shard = new_shard()
    with pytest.raises(UpdateNotBeyondLower, match="time 4 is before the batch lower"):
        shard.stage(updates(("a", 1, 4, 1)), F(5), F(10), "w1")
    with pytest.raises(UpdateBeyondUpper, match="time 10 is not before"):
        shard.stage(updates(("a", 1, 10, 1)), F(5), F(10), "w1")
    with pytest.raises(InvalidUsage, match="empty"):
        shard.stage(updates(("a", 1, 5, 1)), F(5), F(5), "w1")
    with pytest.raises(InvalidUsage, match="lack column 'orders'"):
        shard.stage(pa.table({"customer": ["a"], "_time": [5], "_diff": [1]}), F(5), F(6), "w1")


def test_compare_and_append_is_the_only_way_forward(new_shard: OpenShard) -> None:
    shard = new_shard()
    part = shard.stage(updates(("a", 1, 0, 1), ("b", 2, 1, 1)), F(0), F(2), "w1", 0, 1)
    assert part.updates == 2 and part.bytes > 0
    assert shard.compare_and_append([part], F(0), F(2)) == Appended(F(2), 1)
    # A second append from the old upper loses: an expected outcome, not an error.
    late = shard.stage(updates(("c", 3, 0, 1)), F(0), F(2), "w2")
    assert shard.compare_and_append([late], F(0), F(2)) == UpperMismatch(F(2), 1)
    # Parts staged for other bounds, or appended twice, can never be appended.
    with pytest.raises(InvalidUsage, match="staged for"):
        shard.compare_and_append([late], F(2), F(4))
    with pytest.raises(InvalidUsage, match="appended twice"):
        again = PartRef(part.key, 0, 1, 2, part.bytes, lower=F(2), upper=F(4), writer_id="w1")
        shard.compare_and_append([again], F(2), F(4))
    state = shard.state()
    assert state.part_keys == {part.key}
    assert state.appended is not None and state.appended.parts == (part,)


def test_advance_upper_is_an_empty_append_and_idempotent(new_shard: OpenShard) -> None:
    shard = new_shard()
    assert shard.advance_upper(F(5)) == F(5)
    assert shard.state().seqno == 1
    assert shard.advance_upper(F(3)) == F(5)  # already past: no-op, no new version
    assert shard.state().seqno == 1
    assert shard.state().batches == ()  # empty appends keep no batch


def test_wait_for_upper_past(new_shard: OpenShard) -> None:
    shard = new_shard()
    writer = Shard(shard.client, shard.bucket, shard.shard_id, ROWS, FAST)
    threading.Timer(0.3, lambda: writer.advance_upper(F(3))).start()
    assert shard.wait_for_upper_past(F(2), timeout=10) == F(3)
    with pytest.raises(TimeoutError):
        shard.wait_for_upper_past(F(3), timeout=0.2)


def test_listen_yields_every_version_in_order(new_shard: OpenShard) -> None:
    shard = new_shard()
    first = shard.stage(updates(("a", 1, 0, 1)), F(0), F(1), "w1")
    shard.compare_and_append([first], F(0), F(1))
    shard.advance_upper(F(3))
    second = shard.stage(updates(("a", 1, 3, -1)), F(3), F(4), "w1")
    shard.compare_and_append([second], F(3), F(4))
    seen = list(shard.listen(after_seqno=0, idle_timeout=0.2))
    assert [s.seqno for s in seen] == [1, 2, 3]
    assert [(s.appended.lower, s.appended.upper) for s in seen if s.appended] == [
        (F(0), F(1)),
        (F(1), F(3)),
        (F(3), F(4)),
    ]
    assert [len(s.appended.parts) for s in seen if s.appended] == [1, 0, 1]
    assert list(shard.listen(after_seqno=3, idle_timeout=0.1)) == []


def test_snapshot_consolidates_and_respects_as_of(new_shard: OpenShard) -> None:
    shard = new_shard()
    p1 = shard.stage(updates(("a", 1, 0, 1), ("b", 2, 1, 1)), F(0), F(2), "w1")
    shard.compare_and_append([p1], F(0), F(2))
    p2 = shard.stage(
        updates(("a", 1, 2, -1), ("a", 5, 2, 1), (None, None, 3, 1), err=[None, None, "boom"]),
        F(2),
        F(4),
        "w1",
    )
    shard.compare_and_append([p2], F(2), F(4))
    assert _rows(shard.snapshot(2)) == [("a", 1, 1, 1, None), ("b", 2, 1, 1, None)]
    assert _rows(shard.snapshot(F(4))) == [
        (None, None, 3, 1, "boom"),
        ("a", 5, 3, 1, None),
        ("b", 2, 3, 1, None),
    ]
    with pytest.raises(InvalidUsage, match="beyond the upper"):
        shard.snapshot(5)


def test_parts_for_and_partitioned_snapshots(new_shard: OpenShard) -> None:
    shard = new_shard()
    everything = updates(*[(f"c{i}", i, 0, 1) for i in range(40)])
    owner = partitions_of(normalize_updates(everything, ROWS), ROWS, 2).to_pylist()
    mine = shard.stage(everything.filter(pa.array([p == 0 for p in owner])), F(0), F(1), "w", 0, 2)
    theirs = shard.stage(
        everything.filter(pa.array([p == 1 for p in owner])), F(0), F(1), "w", 1, 2
    )
    junk = shard.stage(updates(("c0", 0, 0, 5), ("c1", 1, 0, 7)), F(0), F(1), "foreign")
    shard.compare_and_append([mine, theirs, junk], F(0), F(1))

    selected = shard.parts_for(0, F(0), F(1), partitions_total=2)
    assert {(s.part.key, s.needs_filter) for s in selected} == {(mine.key, False), (junk.key, True)}
    full = {r[0]: r[3] for r in _rows(shard.snapshot(1))}
    part0 = {r[0]: r[3] for r in _rows(shard.snapshot(1, partitions=[0], partitions_total=2))}
    part1 = {r[0]: r[3] for r in _rows(shard.snapshot(1, partitions=[1], partitions_total=2))}
    assert part0.keys().isdisjoint(part1.keys())
    assert part0 | part1 == full
    assert full["c0"] == 6 and full["c1"] == 8  # the foreign part's rows land where they hash


def test_transmittable_parts_round_trip(new_shard: OpenShard) -> None:
    shard = new_shard()
    part = shard.stage(updates(("a", 1, 0, 1)), F(0), F(1), "w1", 0, 4)
    batch = StagedBatch(
        desc_id=BatchId(0, 0),
        lower=F(0),
        upper=F(1),
        covers=(0,),
        parts=(part.to_message(),),
        writer_id="w1",
    )
    assert PartRef.from_transmittable(batch.parts[0], batch) == part
    assert shard.compare_and_append([PartRef.from_transmittable(batch.parts[0], batch)], F(0), F(1))


def test_crash_between_stage_and_append_leaks_only_unreferenced_parts(
    new_shard: OpenShard,
) -> None:
    """A writer that stages and dies leaves unreferenced parts; the sweeper removes exactly
    those after the grace period; committed parts survive every delete and sweep."""
    shard = new_shard()
    committed = shard.stage(updates(("a", 1, 0, 1)), F(0), F(1), "w1")
    shard.compare_and_append([committed], F(0), F(1))
    crashed = [shard.stage(updates(("x", 9, 1, 1)), F(1), F(2), "dead") for _ in range(3)]

    early = shard.sweep(grace=FAST.min_grace)
    assert early.parts_deleted == () and early.parts_kept_young == 3  # still within grace

    refused = shard.delete_staged([committed, *crashed])
    assert refused.referenced == (committed.key,)  # committed: never deleted
    assert set(refused.pending) == {p.key for p in crashed}  # upper not past their lower yet
    assert refused.deleted == ()

    time.sleep(FAST.min_grace + 0.5)
    with pytest.raises(PartTooOld):
        shard.compare_and_append(crashed, F(1), F(2))
    swept = shard.sweep(grace=FAST.min_grace)
    assert set(swept.parts_deleted) == {p.key for p in crashed}
    remaining = {
        o.object_name
        for o in shard.client.list_objects(
            shard.bucket, prefix=f"{shard.prefix}/parts/", recursive=True
        )
    }
    assert remaining == {committed.key}
    assert shard.snapshot(1).num_rows == 1
    with pytest.raises(InvalidUsage, match="below the minimum"):
        shard.sweep(grace=1.0)


def test_delete_staged_deletes_parts_the_upper_has_passed(new_shard: OpenShard) -> None:
    shard = new_shard()
    loser = shard.stage(updates(("a", 1, 0, 1)), F(0), F(1), "w2")
    winner = shard.stage(updates(("a", 1, 0, 1)), F(0), F(1), "w1")
    shard.compare_and_append([winner], F(0), F(1))
    assert shard.compare_and_append([loser], F(0), F(1)) == UpperMismatch(F(1), 1)
    result = shard.delete_staged([loser, winner])
    assert result.deleted == (loser.key,) and result.referenced == (winner.key,)


def test_delete_staged_trusts_a_parts_footer_not_the_bounds_claimed(new_shard: OpenShard) -> None:
    """A `StagedBatch` claiming bounds the upper has passed for a part staged for a later batch
    (a wrong or forged claim) gets nothing deleted: the footer's bounds decide."""
    shard = new_shard()
    shard.advance_upper(F(3))
    future = shard.stage(updates(("a", 1, 5, 1)), F(5), F(6), "w1")
    claimed = replace(future, lower=F(0), upper=F(1))
    result = shard.delete_staged([claimed])
    assert result.deleted == () and result.mismatched == (future.key,)
    shard.advance_upper(F(5))
    appended = shard.compare_and_append([future], F(5), F(6))
    assert appended.__class__.__name__ == "Appended"
    assert shard.snapshot(6).num_rows == 1  # the part was kept and is readable
    gone = shard.stage(updates(("b", 1, 6, 1)), F(6), F(7), "w1")
    shard.client.remove_object(shard.bucket, gone.key)
    shard.advance_upper(F(8))
    assert shard.delete_staged([gone]).deleted == (gone.key,)  # already gone: nothing to keep


def test_a_claim_is_refused_unless_each_part_exists_with_the_claimed_bounds(
    new_shard: OpenShard,
) -> None:
    """`claim_refusal`: what a `StagedBatch` names is checked against the parts themselves
    before it is appended. A part that is there with the claimed bounds passes; a key nobody
    staged, a real part claimed for other bounds, a key outside the shard or not of a staged
    part's form is refused, saying which; a part past `max_part_age` is left to the age check."""
    shard = new_shard()
    part = shard.stage(updates(("a", 1, 0, 1)), F(0), F(1), "w1")
    assert shard.claim_refusal([part]) is None
    assert shard.claim_refusal([]) is None
    nobody = replace(part, key=part.key.replace(".parquet", "0.parquet"))
    assert shard.claim_refusal([part, nobody]) == f"part {nobody.key} does not exist"
    why = shard.claim_refusal([replace(part, lower=F(5), upper=F(9))])
    assert why == f"part {part.key} was staged for [{{0}}, {{1}}), not the claimed [{{5}}, {{9}})"
    outside = replace(part, key=f"elsewhere/parts/{part.key.rsplit('/', 1)[1]}")
    assert (
        shard.claim_refusal([outside])
        == f"part {outside.key} is not a part of shard {shard.shard_id}"
    )
    odd = replace(part, key=f"{shard.prefix}/parts/evil.parquet")
    assert "is not a key of a part staged by mvsink" in (shard.claim_refusal([odd]) or "")
    old = replace(part, key=f"{shard.prefix}/parts/1000-{uuid.uuid4()}.parquet")
    assert shard.claim_refusal([old]) is None  # refused by its age when appended
    with pytest.raises(PartTooOld):
        shard.compare_and_append([old], F(0), F(1))
    assert shard.claim_refusal([part]) is None  # nothing of that changed the real part


def test_sweep_prunes_versions_superseded_longer_than_the_version_grace(
    new_shard: OpenShard,
) -> None:
    shard = new_shard()
    for t in range(1, 6):
        shard.advance_upper(F(t))
    time.sleep(FAST.version_grace + 0.3)
    for t in range(6, 8):
        shard.advance_upper(F(t))
    result = shard.sweep(grace=FAST.min_grace)
    assert result.states_pruned == (0, 1, 2, 3, 4)  # 5 was superseded by 6 just now
    assert shard.retained_seqnos() == [5, 6, 7]
    fresh = Shard(shard.client, shard.bucket, shard.shard_id, ROWS, FAST)
    assert fresh.state().seqno == 7 and fresh.upper() == F(7)  # found by LIST after pruning
    with pytest.raises(Exception, match="pruned"):
        list(fresh.listen(after_seqno=2, idle_timeout=0.1))


def test_a_pruned_seqno_written_again_is_never_taken_for_a_version(new_shard: OpenShard) -> None:
    """A writer that read version 1 and paused while versions 1 and 2 were pruned creates
    "version 2" again on MinIO (no S3 call can stop that): it is told nothing happened and
    starts over from the latest; no reader takes that object for a version; the collector
    deletes it."""
    shard = new_shard()
    shard.advance_upper(F(1))
    stale = Shard(shard.client, shard.bucket, shard.shard_id, ROWS, FAST)
    assert stale.state().seqno == 1
    for t in range(2, 5):
        shard.advance_upper(F(t))
    time.sleep(FAST.version_grace + 0.3)
    shard.advance_upper(F(5))
    assert shard.collect_garbage().states_pruned == (0, 1, 2, 3)
    # The stale writer's next change is computed from version 1 and lands at the pruned key 2.
    read_before_pausing, latest = stale.version(1), stale.state
    calls: list[int] = []

    def first_stale() -> ShardState:
        calls.append(1)
        return read_before_pausing if len(calls) == 1 else latest()  # type: ignore[return-value]

    stale.state = first_stale  # type: ignore[method-assign]
    assert stale.compare_and_append((), F(1), F(9)) == UpperMismatch(F(5), 5)  # started over
    assert shard.client.stat_object(shard.bucket, shard.state_key(2))  # the stray object
    fresh = Shard(shard.client, shard.bucket, shard.shard_id, ROWS, FAST)
    assert fresh.state().seqno == 5  # the newest key, never the stray one
    shard.collect_garbage()
    assert 2 not in shard.retained_seqnos()  # below a confirmed gap: deleted


def test_the_sweeper_fences_a_late_append_out(new_shard: OpenShard) -> None:
    """An appender that checked its part's age, then paused past `min_grace` while the sweeper
    deleted the part, is refused at its compare-and-set (`sweep_horizon`), not committed."""
    shard = new_shard()
    part = shard.stage(updates(("a", 1, 0, 1)), F(0), F(1), "w1")
    time.sleep(FAST.min_grace + 0.3)
    swept = shard.sweep(grace=FAST.min_grace)
    assert swept.parts_deleted == (part.key,)
    assert shard.state().sweep_horizon > 0
    late = Shard(shard.client, shard.bucket, shard.shard_id, ROWS, FAST)
    late._check_part_ages = lambda parts: None  # type: ignore[method-assign]  # checked earlier
    with pytest.raises(PartTooOld, match="sweep horizon"):
        late.compare_and_append([part], F(0), F(1))
    assert shard.upper() == F(0) and shard.state().part_keys == frozenset()


def test_state_documents_round_trip(new_shard: OpenShard) -> None:
    shard = new_shard()
    part = shard.stage(updates(("a", 1, 0, 1)), F(0), F(1), "w1", 0, 2)
    shard.compare_and_append([part], F(0), F(1))
    state = shard.state()
    assert ShardState.from_bytes(state.to_bytes()) == state

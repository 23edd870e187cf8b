"""The shard stays small on a real S3: since, reader leases, compare-and-merge, garbage
collection, and appends racing compactors."""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from minio.error import S3Error

from mvsink.core.frontier import Frontier
from mvsink.core.partitioning import partitions_of
from mvsink.core.settings import CompactionPolicy, S3Settings, Timing
from mvsink.core.updates import normalize_updates, part_schema
from mvsink.shard import (
    Appended,
    AsOfBeforeSince,
    Merged,
    MergeRefused,
    PartGone,
    PartRef,
    Shard,
    UpperMismatch,
    open_shard,
)
from mvsink.shard.compact import compact_once, shard_table_bytes
from mvsink.shard.parts import consolidate_at
from mvsink.shard.spark import read_shard

pytestmark = pytest.mark.integration

ROWS = pa.schema([("key", pa.string()), ("value", pa.int64())])
F = Frontier.at
P = 2
FAST = Timing(
    max_attempt_age=1.0,
    max_part_age=5.0,
    min_grace=6.5,
    poll_interval=0.02,
    part_grace=0.5,
    version_grace=2.5,
    request_timeout=1.0,
)
RACE_SECONDS = float(os.environ.get("MVSINK_RACE_SECONDS", "30"))


def table(rows: list[tuple[str, int, int, int]]) -> pa.Table:
    return normalize_updates(
        pa.table(
            {
                "key": pa.array([r[0] for r in rows], pa.string()),
                "value": pa.array([r[1] for r in rows], pa.int64()),
                "_time": pa.array([r[2] for r in rows], pa.int64()),
                "_diff": pa.array([r[3] for r in rows], pa.int64()),
            }
        ),
        ROWS,
    )


def stage_partitioned(
    shard: Shard, rows: pa.Table, lower: int, upper: int, writer: str
) -> list[PartRef]:
    """One part per desired partition, as the write service stages them."""
    hashes = partitions_of(rows, ROWS, P)
    parts = []
    for p in range(P):
        chosen = rows.filter(pa.compute.equal(hashes, p))
        if chosen.num_rows:
            parts.append(shard.stage(chosen, F(lower), F(upper), writer, p, P))
    return parts


def contents(shard: Shard, as_of: int) -> dict[tuple[str, int], int]:
    return {(r["key"], r["value"]): r["_diff"] for r in shard.snapshot(as_of).to_pylist()}


def model(history: list[tuple[str, int, int, int]], as_of: int) -> dict[tuple[str, int], int]:
    counts: Counter[tuple[str, int]] = Counter()
    for key, value, t, diff in history:
        if t < as_of:
            counts[(key, value)] += diff
    return {k: d for k, d in counts.items() if d}


def churn(shard: Shard, ticks: int, keys: int, history: list[tuple[str, int, int, int]]) -> None:
    """A view of `keys` keys whose values all change every tick (retraction + insertion);
    every fifth tick written by a foreign writer (no partition recorded)."""
    for _ in range(ticks):
        t = shard.upper().time or 0
        rows = [(f"k{i}", t, t, 1) for i in range(keys)]
        rows += [(f"k{i}", t - 1, t, -1) for i in range(keys)] if t else []
        history.extend(rows)
        if t % 5 == 4:
            parts = [shard.stage(table(rows), F(t), F(t + 1), "foreign")]
        else:
            parts = stage_partitioned(shard, table(rows), t, t + 1, "w")
        assert isinstance(shard.compare_and_append(parts, F(t), F(t + 1)), Appended)


def test_compaction_keeps_a_churning_view_the_size_of_the_view(s3_settings: S3Settings) -> None:
    """since follows the upper, merges consolidate the churn away, GC deletes what they
    replaced and prunes superseded versions: the bucket holds the view, not its history."""
    shard = open_shard(f"c-{uuid.uuid4().hex[:10]}", ROWS, s3_settings, FAST, retain_history=2)
    history: list[tuple[str, int, int, int]] = []
    policy = CompactionPolicy()
    for _ in range(6):
        churn(shard, 5, 20, history)
        while compact_once(shard, policy, "compactor") is not None:
            pass
    state = shard.state()
    upper = state.upper.time or 0
    assert state.since == F(upper - 2)
    for as_of in range(upper - 2, upper + 1):
        assert contents(shard, as_of) == model(history, as_of)
    assert len(state.batches) <= 5, [b.updates for b in state.batches]
    # foreign rows re-partitioned by the merges; batches since has not passed wait for it
    passed = [b for b in state.batches if b.upper.less_equal(state.since)]
    assert passed and {p.partitions_total for b in passed for p in b.parts} == {P}
    assert state.total_updates() <= 20 * 3 * 3, state.total_updates()  # the view + 2 times' churn
    with pytest.raises(AsOfBeforeSince, match="compacted away"):
        shard.snapshot(upper - 3)

    time.sleep(FAST.version_grace + 0.5)
    shard.advance_upper(F(upper + 1))  # a version newer than the grace keeps its predecessor
    collected = shard.sweep(grace=FAST.min_grace)
    assert collected.states_pruned and shard.retained_seqnos()[0] == state.seqno
    objects, _ = shard_table_bytes(shard)
    assert objects == len(shard.state().parts()) + len(shard.retained_seqnos())
    assert contents(shard, upper + 1) == model(history, upper + 1)


def test_a_lease_holds_since_and_its_history(s3_settings: S3Settings) -> None:
    shard = open_shard(f"l-{uuid.uuid4().hex[:10]}", ROWS, s3_settings, FAST, retain_history=0)
    history: list[tuple[str, int, int, int]] = []
    churn(shard, 3, 5, history)
    lease = shard.lease("reader", duration=60)
    assert lease.since == F(3)
    churn(shard, 6, 5, history)
    while compact_once(shard, CompactionPolicy(), "c", force=True) is not None:
        if len(shard.state().batches) == 1:
            break
    assert shard.state().since == F(3)  # held
    for as_of in range(3, 10):
        assert contents(shard, as_of) == model(history, as_of)  # all held history readable
    shard.lease("reader", hold=F(7), duration=60)
    assert shard.state().since == F(7)
    shard.release("reader")
    assert shard.state().since == F(9)
    with pytest.raises(AsOfBeforeSince):
        shard.lease("late", hold=F(5))


def test_readers_of_a_replaced_version_start_over(s3_settings: S3Settings) -> None:
    """A reader still holding the version before a merge finds its parts gone after
    part_grace (PartGone); snapshot itself starts over from the latest version."""
    shard = open_shard(f"r-{uuid.uuid4().hex[:10]}", ROWS, s3_settings, FAST, retain_history=0)
    history: list[tuple[str, int, int, int]] = []
    churn(shard, 4, 5, history)
    old = shard.state()
    outcome = compact_once(shard, CompactionPolicy(), "c", force=True)
    assert outcome is not None and isinstance(outcome.result, Merged)
    time.sleep(FAST.part_grace + 0.3)
    assert shard.collect_garbage().parts_deleted
    with pytest.raises(PartGone):
        shard.read_parts(shard.parts_for(None, F(0), old.upper, state=old))
    assert contents(shard, 4) == model(history, 4)


def test_a_merge_that_lost_its_race_deletes_its_outputs(s3_settings: S3Settings) -> None:
    shard = open_shard(f"m-{uuid.uuid4().hex[:10]}", ROWS, s3_settings, FAST)
    churn(shard, 4, 3, [])
    from mvsink.shard.compact import merge_tasks, run_locally
    from mvsink.shard.state import merge_all

    request = merge_all(shard.state())
    assert request is not None
    first = compact_once(shard, CompactionPolicy(), "c1", force=True)
    assert first is not None and isinstance(first.result, Merged)
    late = [r.part for r in run_locally(merge_tasks(shard, request, "c2")) if r.part is not None]
    assert late
    assert isinstance(shard.compare_and_merge(request, late), MergeRefused)
    keys = {
        o.object_name
        for o in shard.client.list_objects(
            shard.bucket, prefix=f"{shard.prefix}/parts/c2/", recursive=True
        )
    }
    assert keys == set()


def test_spark_merges_equal_local_merges(spark: Any, s3_settings: S3Settings) -> None:
    """A merge run on Spark executors stages the same contents as one run locally."""
    from mvsink.shard.compact import spark_runner

    shard = open_shard(f"s-{uuid.uuid4().hex[:10]}", ROWS, s3_settings, FAST, retain_history=1)
    history: list[tuple[str, int, int, int]] = []
    churn(shard, 6, 30, history)
    outcome = compact_once(shard, CompactionPolicy(), "sc", spark_runner(spark), force=True)
    assert outcome is not None and isinstance(outcome.result, Merged)
    assert len(shard.state().batches) == 1 and outcome.updates_out <= 30 * 3
    assert contents(shard, 6) == model(history, 6)
    with read_shard(spark, shard.shard_id, 6, s3_settings) as frame:
        got = sorted(tuple(r) for r in frame.collect())
    assert got == sorted(tuple(r.values()) for r in shard.snapshot(6).to_pylist())


def test_a_spark_read_keeps_its_parts_through_merges_and_refuses_a_read_below_since(
    spark: Any, s3_settings: S3Settings
) -> None:
    """Inside `read_shard`'s block a merge replaces every part the DataFrame names and the
    collector runs past `part_grace`: the parts stay (the lease pins their version) and a
    second action reads the same rows; after the block the lease is gone and they are deleted.
    A read below `since` is refused."""
    shard = open_shard(f"s-{uuid.uuid4().hex[:10]}", ROWS, s3_settings, FAST, retain_history=1)
    history: list[tuple[str, int, int, int]] = []
    churn(shard, 6, 30, history)
    expected = sorted((k, v, 5, d, None) for (k, v), d in model(history, 6).items())
    read = read_shard(spark, shard.shard_id, 6, s3_settings, FAST)
    with read as frame:
        pinned = set(shard.state().part_keys)
        assert sorted(tuple(r) for r in frame.collect()) == expected
        churn(shard, 2, 30, history)  # since passes 6 only once the lease is gone
        assert compact_once(shard, CompactionPolicy(), "sc", force=True) is not None
        assert not pinned & shard.state().part_keys  # every part it reads was merged away
        time.sleep(FAST.version_grace + 0.5)
        shard.collect_garbage()
        assert all(shard.blob.get(key) is not None for key in pinned)
        assert sorted(tuple(r) for r in frame.collect()) == expected
        assert shard.state().since == F(6)
    assert not read.lapsed and shard.state().lease(read.reader_id) is None
    time.sleep(FAST.version_grace + 0.5)
    shard.lease("tick")  # a version after the release, old enough for the collector
    time.sleep(FAST.version_grace + 0.5)
    shard.collect_garbage()
    assert all(shard.blob.get(key) is None for key in pinned)
    churn(shard, 1, 30, history)
    refused = read_shard(spark, shard.shard_id, 6, s3_settings, FAST)
    with pytest.raises(AsOfBeforeSince, match="before the since"), refused:
        pass


def test_appends_racing_compactors_stay_linearizable(s3_settings: S3Settings) -> None:
    """4 writers appending and 2 compactors merging for RACE_SECONDS, each with its own
    client: every state version is a valid successor of the one before, and the contents of
    every version at each frontier from its since to its upper equal the acknowledged appends'
    updates, consolidated."""
    shard_id = f"race-{uuid.uuid4().hex[:10]}"
    open_shard(shard_id, ROWS, s3_settings, Timing(), retain_history=3)
    acked: dict[int, list[tuple[str, int, int, int]]] = {}  # append seqno -> its updates
    merges: Counter[str] = Counter()
    lock = threading.Lock()
    stop_at = time.monotonic() + RACE_SECONDS
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        shard = open_shard(shard_id, None, s3_settings)
        rng = random.Random(n)
        while time.monotonic() < stop_at:
            t = shard.upper().time or 0
            rows = [
                (f"k{rng.randrange(8)}", rng.randrange(3), t, rng.choice([1, 1, -1]))
                for _ in range(4)
            ]
            data = table(rows)
            parts = (
                stage_partitioned(shard, data, t, t + 1, f"w{n}")
                if n % 2
                else [shard.stage(data, F(t), F(t + 1), f"w{n}")]
            )
            result = shard.compare_and_append(parts, F(t), F(t + 1))
            if isinstance(result, Appended):
                with lock:
                    acked[result.seqno] = rows
            else:
                assert isinstance(result, UpperMismatch)
                shard.delete_staged(parts)

    def compactor(n: int) -> None:
        shard = open_shard(shard_id, None, s3_settings)
        policy = CompactionPolicy(min_merge=2, max_batches=4)
        while time.monotonic() < stop_at:
            outcome = compact_once(shard, policy, f"c{n}")
            if outcome is not None:
                with lock:
                    merges[type(outcome.result).__name__] += 1

    def guard(target: Any, n: int) -> None:
        try:
            target(n)
        except BaseException as error:  # surfaced in the test thread
            errors.append(error)

    threads = [threading.Thread(target=guard, args=(writer, n)) for n in range(4)]
    threads += [threading.Thread(target=guard, args=(compactor, n)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors

    reader = open_shard(shard_id, None, s3_settings)
    final = reader.state()
    assert reader.retained_seqnos() == list(range(final.seqno + 1))  # nothing pruned: no GC ran
    versions = [reader.version(s) for s in range(final.seqno + 1)]
    blobs: dict[str, pa.Table] = {}
    history: list[tuple[str, int, int, int]] = []
    for previous, version in itertools.pairwise(versions):
        assert previous is not None and version is not None
        assert version.seqno == previous.seqno + 1
        assert previous.since.less_equal(version.since) and version.since.less_equal(version.upper)
        if version.change == "append":
            assert version.appended is not None and version.appended.lower == previous.upper
            history.extend(acked.pop(version.seqno))
        else:
            assert version.change == "merge" and version.upper == previous.upper
        for earlier, later in itertools.pairwise(version.batches):
            assert earlier.upper.less_equal(later.lower)
        for key in version.part_keys - blobs.keys():
            blobs[key] = reader.read_part(next(p for p in version.parts() if p.key == key))
        data = pa.concat_tables(
            [blobs[k] for k in version.part_keys] or [part_schema(ROWS).empty_table()]
        )
        for as_of in {version.since.time or 0, version.upper.time or 0}:
            got = {
                (r["key"], r["value"]): r["_diff"]
                for r in consolidate_at(data, ROWS, F(as_of)).to_pylist()
            }
            assert got == model(history, as_of), (version.seqno, as_of)
    assert not acked, "an acknowledged append is missing from the chain"
    print(
        f"\n{final.seqno} versions in {RACE_SECONDS:.0f}s: merges {dict(merges)}, "
        f"{len(final.batches)} live batches at the end"
    )
    assert merges["Merged"] > 0 and final.seqno > merges["Merged"]


def test_an_idle_handle_finds_the_latest_version_after_gc_pruned_what_it_knew(
    s3_settings: S3Settings,
) -> None:
    """A reader that last looked before GC pruned the versions after the one it cached must not
    take that version for the latest (it would read an old upper and old contents)."""
    shard_id = f"idle-{uuid.uuid4().hex[:10]}"
    idle = open_shard(shard_id, ROWS, s3_settings, FAST, retain_history=0)
    history: list[tuple[str, int, int, int]] = []
    assert idle.state().seqno == 0
    busy = open_shard(shard_id, None, s3_settings, FAST)
    churn(busy, 4, 3, history)
    time.sleep(FAST.version_grace + 0.5)
    busy.advance_upper(F(5))
    assert busy.collect_garbage().states_pruned  # versions 0..3 are gone
    assert idle.state().upper == F(5) and contents(idle, 5) == model(history, 5)


def test_the_compactor_collects_garbage_while_its_merges_fail(
    s3_settings: S3Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The write driver's compactor thread: a merge that keeps failing (a lost Spark job) is
    logged once and does not stop the deletion of what an earlier merge replaced."""
    from mvsink.io.config import Config, Topics
    from services.write import compactor as module

    shard_id = f"c-{uuid.uuid4().hex[:10]}"
    shard = open_shard(shard_id, ROWS, s3_settings, FAST)
    churn(shard, 4, 10, [])
    before = shard.state().part_keys
    assert isinstance(compact_once(shard, CompactionPolicy(), "m", force=True).result, Merged)  # type: ignore[union-attr]
    replaced = before - shard.state().part_keys
    assert replaced

    def lost(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a lost Spark job")

    monkeypatch.setattr(module, "compact_once", lost)
    config = Config(
        sink_id=shard_id,
        shard_id=shard_id,
        partitions=P,
        append_workers=1,
        as_of=0,
        read_only=False,
        topics=Topics.for_sink(shard_id),
        kafka_bootstrap="127.0.0.1:9",
        s3=s3_settings,
        spark_master="local[1]",
        shard_max_attempt_age=FAST.max_attempt_age,
        shard_max_part_age=FAST.max_part_age,
        shard_min_grace=FAST.min_grace,
        shard_part_grace=FAST.part_grace,
        shard_version_grace=FAST.version_grace,
        shard_request_timeout=FAST.request_timeout,
    )
    thread = module.Compactor(config, "w", None)
    thread.enabled.set()
    thread.merging.set()
    thread.start()
    try:
        deadline = time.monotonic() + 20
        left = set(replaced)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = {k for k in replaced if _exists(shard, k)}
    finally:
        thread.stop()
    assert not left, f"{len(left)} replaced parts still in the bucket"
    failing = [r for r in caplog.records if "compaction failing" in r.getMessage()]
    assert len(failing) == 1, "the failure is logged when it starts, not at every retry"


def _exists(shard: Shard, key: str) -> bool:
    try:
        shard.client.stat_object(shard.bucket, key)
    except S3Error as error:
        if error.code == "NoSuchKey":
            return False
        raise
    return True

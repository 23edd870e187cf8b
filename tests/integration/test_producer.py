"""The desired producer against a real broker: partitioning by the encoded row, in-band and
out-of-band progress in one transaction, refusal of updates below the frontier, restarts and
fencing, the PySpark helper and the CLI."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import KafkaException, Producer
from sinkkit import Sink, contents, wait_until

from mvsink.core.codec import decode_message
from mvsink.core.errors import ContractError, InvalidUsage
from mvsink.core.frontier import Frontier
from mvsink.core.messages import DesiredProgress, Progress, Updates, UpdatesArrow
from mvsink.core.partitioning import partition_of, partitions_of
from mvsink.core.rows import parse_row_schema, row_decoder, row_encoder
from mvsink.core.updates import normalize_updates, updates_from_ipc
from mvsink.io.config import S3Settings
from mvsink.io.kafka import client_config, poll_message, read_compacted, tail_consumer
from mvsink.io.registry import OWN
from mvsink.upstream.producer import DesiredProducer
from mvsink.upstream.publish import (
    ONE_TASK_BYTES,
    PublishSpec,
    PublishWorker,
    _markers,
    _publish_partition,
    _task_keys,
    estimated_bytes,
    publish_dataframe,
)

pytestmark = pytest.mark.integration
F = Frontier.at
#: `publish_dataframe`'s two paths: the test inputs are small, so its default publishes them in
#: one task; an `one_task_bytes` of 0 takes the two stages.
PUBLISH_PATHS = pytest.mark.parametrize(
    "one_task_bytes", [ONE_TASK_BYTES, 0], ids=["one-task", "two-stages"]
)
SPARK_TYPES = {"string": pa.string(), "long": pa.int64()}


def arrow_frame(spark: Any, rows: list[tuple[Any, ...]], schema: str) -> Any:
    """A DataFrame of `rows` (`schema` as "name type, ...") made from an Arrow table, so that
    Spark knows its size: one made from a Python list is an RDD of unknown size, which
    `publish_dataframe` never publishes in one task."""
    fields = [
        pa.field(name, SPARK_TYPES[kind]) for name, kind in (f.split() for f in schema.split(","))
    ]
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in fields]
    frame = spark.createDataFrame(
        pa.Table.from_arrays(
            [pa.array(c, f.type) for c, f in zip(columns, fields, strict=True)],
            schema=pa.schema(fields),
        )
    )
    estimate = estimated_bytes(frame)
    assert estimate is not None and estimate <= ONE_TASK_BYTES
    return frame


@pytest.fixture
def sink(kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path) -> Sink:
    return Sink.create(kafka_bootstrap, s3_settings, tmp_path, partitions=3)


def producer_for(sink: Sink, name: str | None = None, wire: str = "arrow") -> DesiredProducer:
    producer = DesiredProducer(
        sink.config,
        parse_row_schema(sink.config.row_schema),
        name or f"t-{uuid.uuid4().hex[:6]}",
        chunk=4,
        wire=wire,
    )
    producer.start()
    return producer


def table(rows: list[tuple[str, int, int, int]]) -> pa.Table:
    return pa.table(
        {
            "k": [r[0] for r in rows],
            "v": [r[1] for r in rows],
            "_time": [r[2] for r in rows],
            "_diff": [r[3] for r in rows],
        }
    )


def read_desired(sink: Sink) -> list[tuple[int, Any]]:
    consumer = tail_consumer(sink.config.kafka_bootstrap, sink.config.topics.desired)
    seen: list[tuple[int, Any]] = []
    idle = 0
    while idle < 8:
        message = poll_message(consumer, 0.25)
        if message is None:
            idle += 1
            continue
        idle = 0
        seen.append((int(message.partition() or 0), decode_message(message)))
    consumer.close()
    return seen


def published_updates(sink: Sink) -> list[dict[str, Any]]:
    """Every update of the desired topic's `UpdatesArrow` records (read_committed)."""
    schema = parse_row_schema(sink.config.row_schema)
    return [
        u
        for _, record in read_desired(sink)
        if isinstance(record, UpdatesArrow)
        for u in updates_from_ipc(record.ipc, schema).to_pylist()
    ]


def sent_rows(sink: Sink, records: list[tuple[int, Any]]) -> list[tuple[int, bytes]]:
    """`(partition, Avro-encoded row)` of every update in either wire form, chunks of <= 4."""
    schema = parse_row_schema(sink.config.row_schema)
    encode, out = row_encoder(schema), []
    for partition, record in records:
        if isinstance(record, Updates):
            assert len(record.updates) <= 4
            out += [(partition, cast(bytes, u.row)) for u in record.updates]
        elif isinstance(record, UpdatesArrow):
            rows = updates_from_ipc(record.ipc, schema).select(schema.names).to_pylist()
            assert len(rows) <= 4
            out += [(partition, encode(row)) for row in rows]
    return out


@pytest.mark.parametrize(("wire", "partitioning"), [("arrow", 2), ("arrow", 1), ("avro", 1)])
def test_updates_land_on_their_rows_partition_with_progress(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, wire: str, partitioning: int
) -> None:
    sink = Sink.create(
        kafka_bootstrap, s3_settings, tmp_path, partitions=3, partitioning=partitioning
    )
    producer = producer_for(sink, wire=wire)
    rows = [(f"k{i}", i, 0, 1) for i in range(20)]
    assert producer.send(table([*rows, ("zero", 0, 0, 0)])) == 20  # zero diffs are dropped
    producer.advance_to(F(1))
    encode = row_encoder(parse_row_schema(sink.config.row_schema))
    records = read_desired(sink)
    expected_kind = UpdatesArrow if wire == "arrow" else Updates
    assert {type(r) for _, r in records} == {expected_kind, Progress}
    assert {r.partitioning for _, r in records if isinstance(r, UpdatesArrow)} <= {partitioning}
    sent = sent_rows(sink, records)
    schema = parse_row_schema(sink.config.row_schema)
    decode = row_decoder(schema)
    for partition, row in sent:  # each row where the sink's function puts it
        one = normalize_updates(
            pa.Table.from_pylist([{**decode(row), "_time": 0, "_diff": 1}]), schema
        )
        assert partitions_of(one, schema, 3, partitioning).to_pylist() == [partition]
    if partitioning == 1:
        assert all(partition_of(row, 3) == partition for partition, row in sent)
    assert sorted(row for _, row in sent) == sorted(encode({"k": k, "v": v}) for k, v, _, _ in rows)
    progress = {p for p, r in records if isinstance(r, Progress) and r.frontier == F(1)}
    assert progress == {0, 1, 2}  # in-band on every partition, after the updates
    latest = read_compacted(sink.config.kafka_bootstrap, sink.config.topics.frontiers, framing=OWN)
    assert all(
        latest[f"desired:{sink.config.sink_id}:{p}"]
        == DesiredProgress(sink.config.sink_id, p, F(1))
        for p in range(3)
    )


def test_the_v1_wire_form_carries_no_partitioning_but_1(sink: Sink) -> None:
    assert sink.config.partitioning == 2
    with pytest.raises(ContractError, match="implies partitioning 1"):
        producer_for(sink, wire="avro")


def test_updates_below_the_frontier_are_refused(sink: Sink) -> None:
    producer = producer_for(sink)
    producer.advance_to(F(5))
    with pytest.raises(ContractError, match="time 4 is before the frontier"):
        producer.send(table([("a", 1, 4, 1)]))
    with pytest.raises(ContractError, match="cannot move the frontier back"):
        producer.advance_to(F(3))
    producer.send(table([("a", 1, 5, 1)]))  # at the frontier is fine


def test_restart_restores_the_frontier_and_fences_the_predecessor(sink: Sink) -> None:
    first = producer_for(sink, "same-id")
    first.advance_to(F(7))
    first.send(table([("a", 1, 7, 1)]))  # an open transaction...
    second = producer_for(sink, "same-id")  # ...that this start aborts
    assert second.frontier == F(7)
    with pytest.raises(KafkaException):
        first.advance_to(F(8))
    assert not sent_rows(sink, read_desired(sink))


@PUBLISH_PATHS
def test_publish_dataframe_from_the_executors(sink: Sink, spark: Any, one_task_bytes: int) -> None:
    producer = producer_for(sink)
    frame = arrow_frame(
        spark,
        [("a", 1, 0, 1), ("b", 2, 0, 1), ("z", 0, 0, 0)],
        "k string, v long, _time long, _diff long",
    )
    assert publish_dataframe(frame, producer, F(1), one_task_bytes=one_task_bytes) == 2
    assert producer.frontier == F(1)
    with pytest.raises(ContractError, match="must move the frontier forward"):
        publish_dataframe(frame, producer, F(1), one_task_bytes=one_task_bytes)
    records = read_desired(sink)
    assert sorted(row for _, row in sent_rows(sink, records)) == sorted(
        row_encoder(parse_row_schema(sink.config.row_schema))(r)
        for r in ({"k": "a", "v": 1}, {"k": "b", "v": 2})
    )
    assert {p for p, r in records if isinstance(r, Progress) and r.frontier == F(1)} == {0, 1, 2}
    latest = read_compacted(sink.config.kafka_bootstrap, sink.config.topics.frontiers, framing=OWN)
    assert all(latest[f"desired:{sink.config.sink_id}:{p}"].frontier == F(1) for p in range(3))  # type: ignore[union-attr]
    late = arrow_frame(spark, [("c", 3, 0, 1)], "k string, v long, _time long, _diff long")
    with pytest.raises(ContractError, match="update at time 0 is before the frontier"):
        publish_dataframe(late, producer, F(2), one_task_bytes=one_task_bytes)
    producer.send(table([("d", 4, 1, 1)]))
    with pytest.raises(InvalidUsage, match="advance_to"):
        publish_dataframe(late, producer, F(2), one_task_bytes=one_task_bytes)


@pytest.mark.parametrize(("partitions", "tasks"), [(1, 1), (3, 2), (4, 2), (8, 2), (8, 4), (16, 3)])
def test_publish_task_keys_spread_the_partitions_over_the_tasks(
    spark: Any, partitions: int, tasks: int
) -> None:
    """Spark's hash partitioning sends desired partition p's task key to task p % tasks."""
    from pyspark.sql import functions as sql

    keys = _task_keys(spark, partitions, tasks)
    frame = spark.createDataFrame([(p, keys[p]) for p in range(partitions)], "p int, key int")
    placed = frame.repartition(tasks, "key").select("p", sql.spark_partition_id().alias("task"))
    assert {row["p"]: row["task"] for row in placed.collect()} == {
        p: p % tasks for p in range(partitions)
    }
    # Every desired partition's empty marker row carries its task key, made in one JVM task.
    markers = _markers(spark, keys)
    assert markers.rdd.getNumPartitions() == 1
    assert sorted(tuple(row) for row in markers.collect()) == [
        (p, keys[p], b"") for p in range(partitions)
    ]


@PUBLISH_PATHS
def test_publish_dataframe_of_many_arrow_batches_delivers_each_update_once(
    sink: Sink, spark: Any, one_task_bytes: int
) -> None:
    """60,000 updates in 4 DataFrame partitions: several Arrow batches (10,000 rows at most)
    per input task, each split by desired partition, all published once; by one task, or by
    two stages of one wave each."""
    producer = DesiredProducer(
        sink.config, parse_row_schema(sink.config.row_schema), f"t-{uuid.uuid4().hex[:6]}"
    )
    producer.start()
    rows = [(f"k{i}", i, 0, 1 + i % 3) for i in range(60_000)]
    frame = arrow_frame(spark, rows, "k string, v long, _time long, _diff long").repartition(4)
    group = f"publish-{uuid.uuid4().hex[:6]}"
    spark.sparkContext.setJobGroup(group, "publish")
    try:
        assert publish_dataframe(frame, producer, F(1), one_task_bytes=one_task_bytes) == len(rows)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tracker = spark.sparkContext.statusTracker()
    stages = [
        tracker.getStageInfo(s)
        for j in tracker.getJobIdsForGroup(group)
        for s in tracker.getJobInfo(j).stageIds
    ]
    tasks = sorted(stage.numTasks for stage in stages if stage is not None)
    if one_task_bytes:  # the frame's own shuffle (4 tasks), then the publish's one task
        assert tasks[0] == 1 and set(tasks) == {1, 4}, tasks
    else:
        # The frame's 4 partitions are split in one wave of tasks, as many as the 2 slots: that
        # stage (with the markers' task) runs 3 tasks, not 4 + 1; then 2 publishing tasks.
        assert 3 in tasks and 5 not in tasks, tasks
    schema = parse_row_schema(sink.config.row_schema)
    got: Counter[tuple[str, int, int, int]] = Counter()
    for partition, record in read_desired(sink):
        if isinstance(record, UpdatesArrow):
            updates = updates_from_ipc(record.ipc, schema)
            assert set(partitions_of(updates, schema, 3).to_pylist()) == {partition}
            got.update((u["k"], u["v"], u["_time"], u["_diff"]) for u in updates.to_pylist())
    assert got == Counter(rows)
    mixed = arrow_frame(
        spark,
        [("a", None, 1, 1, None), (None, None, 1, 2, "bad row")],
        "k string, v long, _time long, _diff long, _err string",
    )
    assert publish_dataframe(mixed, producer, F(2), one_task_bytes=one_task_bytes) == 2
    empty = arrow_frame(spark, [], "k string, v long, _time long, _diff long")
    assert publish_dataframe(empty, producer, F(3), one_task_bytes=one_task_bytes) == 0
    records = read_desired(sink)
    assert {p for p, r in records if isinstance(r, Progress) and r.frontier == F(3)} == {0, 1, 2}
    late = [u for u in published_updates(sink) if u["_time"] == 1]
    assert sorted((u["k"] or "", u["v"], u["_diff"], u["_err"] or "") for u in late) == [
        ("", None, 2, "bad row"),
        ("a", None, 1, ""),
    ]


def test_a_kept_producer_skips_a_partition_it_already_published(sink: Sink) -> None:
    """A publish fails after some partitions committed and the caller retries it at the same
    frontier: a partition that lands again in the Python worker that committed it (its kept
    producer) is skipped, not published twice; so is one that lands in a new worker (the
    check). Here this process is the worker."""
    producer = producer_for(sink)
    config, row_schema = sink.config, parse_row_schema(sink.config.row_schema)
    spec = PublishSpec(
        config.kafka_bootstrap,
        config.topics.desired,
        config.topics.frontiers,
        config.sink_id,
        config.partitions,
        config.partitioning,
        row_schema,
        producer.producer_id,
        F(0),
        F(1),
        100,
    )
    rows = normalize_updates(table([("a", 1, 0, 1), ("b", 2, 0, 1)]), row_schema)
    worker = PublishWorker()
    assert _publish_partition(spec, 0, rows, worker) == (2, False)
    assert _publish_partition(spec, 0, rows, worker) == (2, True)  # the kept producer
    worker.producers.clear()
    assert _publish_partition(spec, 0, rows, worker) == (2, True)  # a new one, after its check
    assert sorted((u["k"], u["v"]) for u in published_updates(sink)) == [("a", 1), ("b", 2)]


def test_a_kept_producer_another_worker_superseded_is_dropped_before_it_produces(
    sink: Sink, caplog: pytest.LogCaptureFixture
) -> None:
    """Two Python workers of an executor publish a partition by turns, as Spark's choice of an
    idle worker has them do (here this process is both, each turn with its own kept
    producers). The other worker's new producer fenced this worker's kept one: it is dropped
    before it produces, so no transaction fails, and every update lands once."""
    producer = producer_for(sink)
    config, row_schema = sink.config, parse_row_schema(sink.config.row_schema)
    events: list[tuple[str, int]] = []

    def spec(tick: int) -> PublishSpec:
        return PublishSpec(
            config.kafka_bootstrap,
            config.topics.desired,
            config.topics.frontiers,
            config.sink_id,
            config.partitions,
            config.partitioning,
            row_schema,
            producer.producer_id,
            F(tick),
            F(tick + 1),
            100,
            lambda event, partition: events.append((event, partition)),
        )

    def rows(tick: int) -> pa.Table:
        return normalize_updates(table([(f"k{tick}", tick, tick, 1)]), row_schema)

    worker_a, worker_b = PublishWorker(), PublishWorker()
    assert _publish_partition(spec(0), 0, rows(0), worker_a) == (1, False)  # worker A
    assert _publish_partition(spec(1), 0, rows(1), worker_b) == (1, False)  # worker B: fences A's
    # worker A's turn again
    events.clear()
    with caplog.at_level(logging.DEBUG, logger="mvsink.upstream.publish"):
        assert _publish_partition(spec(2), 0, rows(2), worker_a) == (1, False)
    assert "another Python worker of this executor took" in caplog.text
    assert "was fenced" not in caplog.text  # no transaction of the fenced producer
    assert events == [("produced", 0), ("committed", 0)]
    assert sorted(u["k"] for u in published_updates(sink)) == ["k0", "k1", "k2"]


@PUBLISH_PATHS
def test_publish_dataframe_through_killed_tasks_delivers_every_update_once(
    hosted_sinks: Callable[..., Sink], spark: Any, tmp_path: Path, one_task_bytes: int
) -> None:
    """Python workers die (os._exit, as under kill -9) once after queueing a partition's
    records and once after committing another's; Spark reruns the tasks. Every update is read
    exactly once under read_committed, and the sink's shard (served by the session's shared
    deployment) converges to the changelog."""
    sink = hosted_sinks(partitions=3)
    faults = tmp_path / "faults"
    faults.mkdir()
    (faults / "produced-1").touch()
    # P=3 on 2 tasks, one holds 0 and 2 and dies between them; on one task, it holds all three.
    (faults / "committed-0").touch()

    def hook(event: str, partition: int) -> None:
        import os
        from pathlib import Path

        marker = Path(str(faults)) / f"{event}-{partition}"
        if marker.exists():
            marker.unlink()
            os._exit(137)

    producer = producer_for(sink)
    schema = "k string, v long, _time long, _diff long"
    expected: dict[tuple[str, int], int] = {}
    published: list[tuple[str, int, int, int]] = []
    for tick in range(3):
        rows = [(f"k{i}", tick, tick, 1) for i in range(300)]
        if tick:
            rows += [(f"k{i}", tick - 1, tick, -1) for i in range(300)]
        assert publish_dataframe(
            arrow_frame(spark, rows, schema), producer, F(tick + 1), hook, one_task_bytes
        ) == len(rows)
        published += rows
        for k, v, _, d in rows:
            expected[(k, v)] = expected.get((k, v), 0) + d
    assert not list(faults.iterdir())  # both faults happened
    got = Counter((u["k"], u["v"], u["_time"], u["_diff"]) for u in published_updates(sink))
    assert got == Counter(published)  # every update exactly once
    want = {key: d for key, d in expected.items() if d}
    wait_until(
        lambda: sink.shard.upper() == F(3) and contents(sink, 3) == want,
        180,
        "the shard equal to the published changelog",
    )


@PUBLISH_PATHS
def test_publish_dataframe_after_another_instance_took_a_partitions_transactional_id(
    sink: Sink, spark: Any, one_task_bytes: int
) -> None:
    """Workers keep their transactional producers between publishes; one fenced meanwhile (here
    by an outside instance, as by another task attempt) gives way to a new one: the publish
    still lands every update once."""
    producer = producer_for(sink)
    schema = "k string, v long, _time long, _diff long"
    publish_dataframe(
        arrow_frame(spark, [(f"a{i}", i, 0, 1) for i in range(30)], schema),
        producer,
        F(1),
        one_task_bytes=one_task_bytes,
    )
    for partition in range(3):
        other = Producer(
            client_config(
                sink.config.kafka_bootstrap,
                **{"transactional.id": f"{producer.producer_id}.p{partition}"},
            )
        )
        other.init_transactions(30)
    # Hundreds of records a partition: the fencing surfaces at a `produce` as often as at the
    # commit (librdkafka learns it from the transaction's first request, mid-publish).
    rows = [(f"b{i}", i, 1, 1) for i in range(3000)]
    tracker, group = spark.sparkContext.statusTracker(), f"fenced-{uuid.uuid4().hex[:6]}"
    spark.sparkContext.setJobGroup(group, "publish with fenced kept producers")
    try:
        frame = arrow_frame(spark, rows, schema)
        assert publish_dataframe(frame, producer, F(2), one_task_bytes=one_task_bytes) == 3000
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    stages = [s for j in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(j).stageIds]
    failed = sum(tracker.getStageInfo(s).numFailedTasks for s in stages)
    assert failed == 0, f"{failed} task attempts failed: Spark's retry is not the recovery"
    got = Counter(u["k"] for u in published_updates(sink))
    assert got == Counter([f"a{i}" for i in range(30)] + [f"b{i}" for i in range(3000)])


def test_cli_desired_send_and_advance(sink: Sink, tmp_path: Path) -> None:
    path = tmp_path / "updates.parquet"
    pq.write_table(table([("a", 1, 0, 1), ("b", 2, 1, 1)]), path)
    env = {**sink.env(), "MVSINK_ROW_SCHEMA": sink.config.row_schema}
    cli = [sys.executable, "-m", "mvsink.cli", "desired"]
    sent = subprocess.run(
        [*cli, "send", str(path), "--advance-to", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sent.returncode == 0 and "sent 2 updates" in sent.stderr, sent.stderr
    moved = subprocess.run(
        [*cli, "advance", "--to", "5"], env=env, capture_output=True, text=True, timeout=120
    )
    assert moved.returncode == 0 and "desired frontier {5}" in moved.stderr, moved.stderr
    back = subprocess.run(
        [*cli, "advance", "--to", "3"], env=env, capture_output=True, text=True, timeout=120
    )
    assert back.returncode == 2 and "cannot move the frontier back" in back.stderr
    assert os.path.exists(path)

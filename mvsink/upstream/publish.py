"""Publishing a Spark DataFrame as desired updates from the executors: no update passes
through the driver.

```text
 driver      publish_dataframe(df, producer, frontier)
               |  small df (the optimizer's estimate <= one_task_bytes):
               |  df ──coalesce(1)──mapInArrow(split, then publish every partition)──> counts
               |  otherwise:
               |  df ──coalesce(slots)──mapInArrow(split)──> (partition, task key, Arrow IPC)
               |     + one empty row per desired partition       (union: every partition gets Progress)
               |     ──repartition(tasks, task key)──> ──mapInArrow(publish)──> per-partition counts
 executor    for each desired partition p the task holds (a thread each):
               transactional.id = <producer id>.p<p>     init: fences any earlier attempt's
               last committed record of p is Progress(g), g >= frontier?  yes: already published
               begin; p's updates as UpdatesArrow; Progress(frontier) on p;
               DesiredProgress(p, frontier) to frontiers; commit
 driver      producer.frontier = frontier
```

Contract
--------
`DesiredProducer`'s (docs/design.md §3.1), checked by the same functions
(`mvsink.upstream.producer.publishable`, `check_advance`): an update before the producer's
frontier fails its task with `ContractError` and nothing of that partition is committed; the
records are `UpdatesArrow` stamped with the sink's partitioning. A publish must also move the
frontier forward, because a partition whose progress reached it counts as published.

Exactly once per desired partition and publish
----------------------------------------------
Through a task killed at any point and Spark's retry of it (or a speculative twin):

1. `init_transactions` with the partition's own transactional id aborts whatever an earlier
   attempt left open and fences it from committing later;
2. only then does the task read the partition's last committed record. Every committed
   transaction on a desired partition ends with its `Progress` (here and in
   `DesiredProducer.advance_to`), so `Progress(g)` with `g >= frontier` means an earlier attempt
   (or the dead predecessor of a restarted upstream) committed it: the partition is skipped;
3. otherwise one transaction holds the partition's updates and its progress, which become
   visible together to read_committed readers. Partitions commit independently: a reader may
   see one partition's publish before another's, as with any slow partition.

A Python worker keeps its producers between publishes; a kept producer skips steps 1-2 and
decides by the progress its own last commit carried, which is the partition's last unless
another attempt took its transactional id since. Then it is fenced and cannot commit, so it is
replaced (steps 1-2) and the partition, whose updates the task holds until the commit,
published again. Spark runs tasks on any idle
Python worker of an executor, so the newest producer of each transactional id is recorded in
the executor's directory (`_claim`), and a kept producer superseded there is dropped before it
produces (`_superseded`) instead of failing a transaction; dropping a producer is always safe.

Layout: a publish is one stage or two. An input the optimizer estimates at `one_task_bytes`
or less (`ONE_TASK_BYTES` by default, Spark's `sizeInBytes` of the optimized plan, the figure
it picks broadcast joins by) is coalesced to one task (no shuffle), which splits it and
publishes every desired partition itself (`_publish_in_one_task`): a second stage, its shuffle
and its Python tasks cost more than a small input's split is worth spreading. Coalescing also
runs the input's own last stage in that one task, so an input that is cheap to estimate but
costly to compute (a small result of a large stage) wants `one_task_bytes=0`. Otherwise, and
whenever the estimate is unknown (Spark Connect), updates cross between two stages as one
Arrow IPC payload per desired partition and input batch (`_split`), not row by row; task keys
(`_task_keys`) spread the desired partitions evenly over one wave of tasks, and an input of
more partitions than the executors' task slots is coalesced to the slots first (no shuffle):
each Python task has a fixed cost in Spark. Both paths publish each partition with the same
`_publish_partition`, so the exactly-once argument above holds for either.

The upstream's session: Spark 4 checks the size of the Arrow batch it is filling for a
`mapInArrow` after every row (`spark.sql.execution.arrow.maxBytesPerBatch`, 64 MiB by default),
about a quarter of the JVM's CPU in a publish of small rows. An upstream whose rows are small
can set it to 2147483647, which removes the check (a batch is then bounded by
`maxRecordsPerBatch` rows alone), as `mvsink bench`'s upstream does; with large rows the limit
keeps a batch well below Arrow's 2 GiB.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Producer

from mvsink.core.errors import ContractError, DecodeError, InvalidUsage
from mvsink.core.frontier import Frontier
from mvsink.core.messages import DesiredProgress, Progress
from mvsink.core.partitioning import partitions_of, split_by_partition
from mvsink.core.updates import normalize_updates, part_schema, updates_to_ipc
from mvsink.io import registry
from mvsink.io.kafka import client_config, init_transactions, last_record, produce
from mvsink.io.registry import Framing
from mvsink.io.service import quiet_retries
from mvsink.io.spark import (
    each_on_a_thread,
    executor_dir,
    freeze_worker_heap,
    task_slots,
    trim_worker_path,
)
from mvsink.upstream.producer import DesiredProducer, arrow_records, check_advance, publishable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

log = logging.getLogger("mvsink.upstream.publish")

PARTITION, TASK_KEY, PAYLOAD = "_partition", "_task_key", "_updates"
SPLIT_SCHEMA = f"{PARTITION} int, {TASK_KEY} int, {PAYLOAD} binary"
RESULT_SCHEMA = "partition int, updates long, skipped boolean"
#: The largest input (the optimizer's size estimate) published in one task (module docs).
ONE_TASK_BYTES = 64 << 20
#: A fault or progress probe called in the task as `hook(event, partition)` with event
#: "produced" (the partition's records queued, not committed) or "committed".
Hook = Callable[[str, int], None]


@dataclass
class _Kept:
    """A transactional producer of one desired partition, and the partition's progress as far
    as this producer knows: what its last commit carried (or the check found, when new)."""

    producer: Producer
    committed: Frontier | None
    #: What this producer recorded as its transactional id's newest (`_claim`), or None.
    token: str | None = None


class PublishWorker:
    """What one Python worker keeps between the publishing tasks it runs: each desired
    partition's transactional producer, by (bootstrap, transactional id), and the framing of
    each Schema Registry url its tasks name (its ids cached). A worker's first
    publishing task makes it (`publish_worker`) and trims the worker's path then, after the
    imports the tasks need (`trim_worker_path`: an untrimmed worker re-reads PySpark's zips
    before every task)."""

    def __init__(self) -> None:
        self.producers: dict[tuple[str, str], _Kept] = {}
        self.framings = registry.Framings()


#: This Python worker's `PublishWorker`, made by its first publishing task: a Python worker
#: runs task after task, and only the process outlives them.
_WORKER: PublishWorker | None = None


def publish_worker() -> PublishWorker:
    """This Python worker's `PublishWorker` (made, and the path trimmed, on the first call)."""
    global _WORKER
    if _WORKER is None:
        trim_worker_path()
        _WORKER = PublishWorker()
    return _WORKER


@dataclass(frozen=True)
class PublishSpec:
    """What every publishing task needs (pickled to the executors)."""

    bootstrap: str
    desired_topic: str
    frontiers_topic: str
    sink_id: str
    partitions: int
    partitioning: int
    row_schema: pa.Schema
    producer_id: str
    #: Updates must be at or after `lower` (the producer's frontier); progress goes to `upper`.
    lower: Frontier
    upper: Frontier
    #: Updates in one desired record at most (the producer's `chunk`).
    chunk: int
    hook: Hook | None = None
    #: The Schema Registry the records are framed for ("" for mvsink's own framing).
    schema_registry_url: str = ""
    #: s, a task's wait on one Kafka call (its transaction's start and commit).
    call_timeout: float = 60.0


def publish_dataframe(
    df: DataFrame,
    producer: DesiredProducer,
    frontier: Frontier,
    hook: Hook | None = None,
    one_task_bytes: int = ONE_TASK_BYTES,
) -> int:
    """Publish the updates of `df` (`row columns..., _time, _diff[, _err]`) from the executors
    and advance every desired partition to `frontier`; the number of updates published (zero
    diffs dropped), each exactly once whichever task attempt committed it. An input the
    optimizer estimates at `one_task_bytes` or less is published by one task (module docs).

    Raises:
        InvalidUsage: the producer has an open transaction (updates `send` has not committed).
        ContractError: `frontier` is before the producer's, or an update before the producer's
            frontier (a task refuses to produce it; partitions already committed stay
            committed, and a retry with corrected updates skips them).
    """
    if producer.in_transaction:
        raise InvalidUsage("publish_dataframe after send(): advance_to() first")
    check_advance(producer.frontier, frontier)
    if producer.frontier == frontier:  # a partition at `frontier` would count as published
        raise ContractError(
            f"publish_dataframe must move the frontier forward from {frontier}: "
            "a publish is recognised as done by its partitions' progress"
        )
    config = producer.config
    spec = PublishSpec(
        config.kafka_bootstrap,
        config.topics.desired,
        config.topics.frontiers,
        config.sink_id,
        config.partitions,
        config.partitioning,
        producer.row_schema,
        producer.producer_id,
        producer.frontier,
        frontier,
        producer.chunk,
        hook,
        config.schema_registry_url,
        config.kafka_call_timeout,
    )
    try:
        published = _run_publish(df, spec, one_task_bytes, producer.task_keys)
    except Exception as error:  # a task's ContractError arrives as Spark's PythonException
        refused = re.search(r"ContractError: (.*)", str(error))
        if refused is None:
            raise
        raise ContractError(f"publish to {frontier} refused: {refused.group(1)}") from error
    missing = set(range(spec.partitions)) - {row["partition"] for row in published}
    if missing:  # cannot happen: one task publishes them all, or each has a marker
        raise RuntimeError(f"publish covered no task for desired partitions {sorted(missing)}")
    producer.frontier = frontier
    skipped = sorted(row["partition"] for row in published if row["skipped"])
    if skipped:
        log.info("desired partitions %s were already published to %s", skipped, frontier)
    return sum(row["updates"] for row in published)


def _run_publish(
    df: DataFrame,
    spec: PublishSpec,
    one_task_bytes: int,
    cache: dict[tuple[int, int], list[int]] | None = None,
) -> list[Row]:
    """Run the publish's Spark job(s); a result row per desired partition (module docs).
    `cache` keeps `_task_keys` (the producer's `task_keys`)."""
    estimate = estimated_bytes(df)
    if estimate is not None and estimate <= one_task_bytes:
        published = (
            df.coalesce(1)
            .mapInArrow(lambda batches: _publish_in_one_task(batches, spec), RESULT_SCHEMA)
            .collect()
        )
        if published:
            return published
        # An input the optimizer knows is empty loses the task with it (Spark prunes the
        # operators over an empty relation): the markers of the two stages carry it.
    spark = df.sparkSession
    # One wave of publishing tasks: a task more than the slots costs a Python task's start
    # and runs after the others anyway.
    try:
        slots = task_slots(spark)
    except Exception:  # no py4j gateway to ask (Spark Connect): a task per partition
        slots = None
    tasks = min(spec.partitions, slots or spec.partitions)
    keys = _task_keys(spark, spec.partitions, tasks, cache)
    if slots is not None:  # one wave of splitting tasks too (no shuffle: see the module docs)
        df = df.coalesce(slots)
    split = df.mapInArrow(lambda batches: _split(batches, spec, keys), SPLIT_SCHEMA)
    return (
        split.unionByName(_markers(spark, keys))
        .repartition(tasks, TASK_KEY)
        .mapInArrow(lambda batches: _publish(batches, spec), RESULT_SCHEMA)
        .collect()
    )


def estimated_bytes(df: DataFrame) -> int | None:
    """Spark's size estimate of `df`'s optimized plan, or None where it cannot be asked (no
    py4j gateway: Spark Connect)."""
    try:
        return int(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())
    except Exception:
        return None


def _task_keys(
    spark: SparkSession,
    partitions: int,
    tasks: int,
    cache: dict[tuple[int, int], list[int]] | None = None,
) -> list[int]:
    """For each desired partition `p`, the least int that Spark's hash partitioning into
    `tasks` shuffle partitions sends to shuffle partition `p % tasks`: asked of Spark's own
    `hash`, the function `repartition` uses, once per `(partitions, tasks)` of `cache`."""
    cache = {} if cache is None else cache
    keys = cache.get((partitions, tasks))
    if keys is None:
        from pyspark.sql import functions as F

        key = F.col("id").cast("int")
        candidates = spark.range(64 * tasks).select(
            key.alias("key"), F.pmod(F.hash(key), F.lit(tasks)).alias("goes_to")
        )
        found: dict[int, int] = {}
        for row in candidates.collect():
            found.setdefault(row["goes_to"], row["key"])
        # Any key is correct (a task publishes every partition its rows name): a key missing
        # here (never seen) would only put two partitions' work in one task.
        keys = [found.get(p % tasks, p) for p in range(partitions)]
        cache[(partitions, tasks)] = keys
    return keys


def _markers(spark: SparkSession, keys: list[int]) -> DataFrame:
    """One empty row per desired partition `(p, keys[p], b"")`, made in the JVM in one task
    (no Python task per slot, as `createDataFrame` from a Python list would start)."""
    from pyspark.sql import functions as F

    partition = F.col("id").cast("int")
    return spark.range(0, len(keys), numPartitions=1).select(
        partition.alias(PARTITION),
        F.element_at(F.array(*(F.lit(k) for k in keys)), partition + 1).cast("int").alias(TASK_KEY),
        F.lit(b"").cast("binary").alias(PAYLOAD),
    )


def _hashed(batch: pa.RecordBatch, spec: PublishSpec) -> tuple[pa.Table, pa.Array]:
    """A batch's updates normalized to the part schema, and the desired partition of each."""
    table = normalize_updates(batch, spec.row_schema)
    return table, partitions_of(table, spec.row_schema, spec.partitions, spec.partitioning)


def _split(
    batches: Iterable[pa.RecordBatch], spec: PublishSpec, keys: list[int]
) -> Iterator[pa.RecordBatch]:
    """The first of two stages: each batch's updates as one uncompressed Arrow IPC payload per
    desired partition, `(partition, task key, payload)` rows."""
    publish_worker()  # the path trimmed
    freeze_worker_heap()
    for batch in batches:
        split = split_by_partition(*_hashed(batch, spec), spec.partitions)
        payloads = [updates_to_ipc(part, compression=None) for _, part in split]
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([p for p, _ in split], pa.int32()),
                pa.array([keys[p] for p, _ in split], pa.int32()),
                pa.array(payloads, pa.binary()),
            ],
            names=[PARTITION, TASK_KEY, PAYLOAD],
        )


def _publish(batches: Iterable[pa.RecordBatch], spec: PublishSpec) -> Iterator[pa.RecordBatch]:
    """The second of two stages: one transaction per desired partition the task holds (module
    docs), from the payloads `_split` made and the partitions' markers."""
    worker = publish_worker()
    freeze_worker_heap()
    pending: dict[int, list[pa.Table]] = {}
    for batch in batches:
        partitions, payloads = batch.column(PARTITION).to_pylist(), batch.column(PAYLOAD)
        for partition, payload in zip(partitions, payloads, strict=True):
            updates = pending.setdefault(partition, [])
            data = payload.as_buffer()  # empty for the markers
            if data is not None and data.size:
                updates.append(pa.ipc.open_stream(data).read_all())
    yield _publish_pending(spec, pending, worker)


def _publish_in_one_task(
    batches: Iterable[pa.RecordBatch], spec: PublishSpec
) -> Iterator[pa.RecordBatch]:
    """The whole publish in one task: the input split by desired partition, and every desired
    partition published, one with no updates by its progress alone. Each batch is hashed as it
    arrives; the task's updates are then sorted by partition once, so each partition's updates
    are one contiguous table (a record's IPC payload one Arrow batch, not one per input batch)."""
    worker = publish_worker()
    freeze_worker_heap()
    tables, columns = [], []
    for batch in batches:
        table, column = _hashed(batch, spec)
        tables.append(table)
        columns.append(column)
    pending: dict[int, list[pa.Table]] = {p: [] for p in range(spec.partitions)}
    if tables:
        split = split_by_partition(
            pa.concat_tables(tables), pa.concat_arrays(columns), spec.partitions
        )
        tables.clear()  # the split is a copy: the task holds its input once from here
        for partition, part in split:
            pending[partition].append(part)
    yield _publish_pending(spec, pending, worker)


def _publish_pending(
    spec: PublishSpec, pending: dict[int, list[pa.Table]], worker: PublishWorker
) -> pa.RecordBatch:
    """Publish each partition's updates (`_each_partition`); a result row per partition. A
    partition's updates are held until its transaction commits, so a producer found fenced at
    commit can be replaced and the partition published again. A partition's tables are combined
    first (the IPC writer writes a record's every chunk as an Arrow batch of its own), taking
    them out of `pending`, so the task holds its updates about once."""
    quiet_retries()  # one line per outage, not librdkafka's per reconnect (this worker too)
    empty = part_schema(spec.row_schema).empty_table()
    rows = {}
    for partition in sorted(pending):
        tables = pending.pop(partition)  # released as its combined copy is made
        rows[partition] = pa.concat_tables(tables).combine_chunks() if tables else empty
    done = _each_partition(spec, rows, worker)
    return pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([p for p, _, _ in done], pa.int32()),
            "updates": pa.array([n for _, n, _ in done], pa.int64()),
            "skipped": pa.array([skipped for _, _, skipped in done], pa.bool_()),
        }
    )


def _each_partition(
    spec: PublishSpec, rows: dict[int, pa.Table], worker: PublishWorker
) -> list[tuple[int, int, bool]]:
    """`_publish_partition` for each of the task's partitions, on a thread each: their
    transactions are independent, and most of a partition's time is spent waiting on the
    broker (a new producer's init and check, the commit). `(partition, updates, skipped)` in
    partition order."""

    def publish(item: tuple[int, pa.Table]) -> tuple[int, int, bool]:
        return (item[0], *_publish_partition(spec, *item, worker))

    return each_on_a_thread(publish, list(rows.items()), "publish")


def _publish_partition(
    spec: PublishSpec, partition: int, rows: pa.Table, worker: PublishWorker
) -> tuple[int, bool]:
    """Publish one desired partition's updates with its progress, exactly once; the number of
    updates (markers and zero diffs dropped) and whether an earlier attempt had published them.

    A producer `worker` kept from its last publish of the partition is used as it is:
    if another attempt took the transactional id since, it is fenced, cannot commit, and a new
    producer takes over. A new producer fences whatever came before it and then checks the
    partition's last committed record. Either way a partition whose progress already reached
    the publish's is skipped (module docs).

    Raises:
        ContractError: an update before the producer's frontier (nothing is produced).
    """
    rows = publishable(rows, spec.lower, spec.sink_id)
    key = (spec.bootstrap, f"{spec.producer_id}.p{partition}")
    framing = worker.framings.of(spec.schema_registry_url)
    while True:
        kept, reused = worker.producers.get(key), True
        if kept is not None and _superseded(key[1], kept.token):
            log.debug(
                "publish: another Python worker of this executor took desired partition "
                "%d's transactional id since this one's last publish",
                partition,
            )
            del worker.producers[key]
            kept = None
        if kept is None:
            producer = Producer(
                client_config(spec.bootstrap, **{"transactional.id": key[1], "linger.ms": 5})
            )
            init_transactions(producer, spec.call_timeout)
            token = _claim(key[1])
            committed = last_progress(spec.bootstrap, spec.desired_topic, partition, framing)
            kept, reused = _Kept(producer, committed, token), False
            worker.producers[key] = kept
        if kept.committed is not None and spec.upper.less_equal(kept.committed):
            return int(rows.num_rows), True
        producer = kept.producer
        try:
            producer.begin_transaction()
            for record in arrow_records(rows, spec.partitioning, spec.chunk):
                produce(
                    producer, spec.desired_topic, str(partition), record, partition, framing=framing
                )
                producer.poll(0)
            end = Progress(spec.upper)
            produce(producer, spec.desired_topic, str(partition), end, partition, framing=framing)
            progress = DesiredProgress(spec.sink_id, partition, spec.upper)
            produce(producer, spec.frontiers_topic, progress.key, progress, framing=framing)
            if spec.hook is not None:
                spec.hook("produced", partition)
            producer.commit_transaction(spec.call_timeout)
        except BaseException as error:
            # Abort now rather than leave the transaction open until it times out: an open
            # transaction holds back what read_committed readers of the partition may see.
            worker.producers.pop(key, None)
            with contextlib.suppress(Exception):
                producer.abort_transaction(10)
            if reused and is_fenced(error):
                log.info(
                    "publish: the kept producer of desired partition %d was fenced by "
                    "another attempt since its last publish: a new one takes over",
                    partition,
                )
                continue
            raise
        kept.committed = spec.upper
        if spec.hook is not None:
            spec.hook("committed", partition)
        return int(rows.num_rows), False


def _claim_path(transactional_id: str) -> Path:
    return (
        executor_dir() / "publish" / (re.sub(r"[^A-Za-z0-9._-]", "_", transactional_id) + ".newest")
    )


def _claim(transactional_id: str) -> str | None:
    """Record a producer just initialized with `transactional_id` as its newest on this
    executor; its token (None if the record could not be written: it is then never judged
    superseded, and a fencing is found out at its transaction)."""
    token = f"{os.getpid()}.{uuid.uuid4().hex}"
    path = _claim_path(transactional_id)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(token)
        partial.replace(path)
    except OSError:
        return None
    return token


def _superseded(transactional_id: str, token: str | None) -> bool:
    """Whether a producer that claimed `token` is no longer its transactional id's newest on
    this executor: another worker initialized one since, which fenced it."""
    if token is None:
        return False
    try:
        return _claim_path(transactional_id).read_text() != token
    except OSError:
        return False


def is_fenced(error: BaseException) -> bool:
    """Whether `error` is the producer's fatal state (fenced). At the commit it is a fatal
    `KafkaError`; a `produce` after the producer learned it mid-transaction raises plain
    `_FATAL` ("Unable to produce message: Local: Fatal error"), whose `fatal()` is False."""
    if not isinstance(error, KafkaException):
        return False
    kafka_error = error.args[0]
    return bool(kafka_error.fatal() or kafka_error.code() == KafkaError._FATAL)


def last_progress(bootstrap: str, topic: str, partition: int, framing: Framing) -> Frontier | None:
    """The frontier of a desired partition's last committed record if it is a `Progress`."""
    try:
        record = last_record(bootstrap, topic, partition, framing=framing)
    except DecodeError:  # someone else's bytes: not our progress
        return None
    return record.frontier if isinstance(record, Progress) else None

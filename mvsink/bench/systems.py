"""The systems `mvsink bench` measures mvsink against, each run as its own process that
prints one JSON line per unit of durable progress on stdout:

* `peer`: what a user would build instead: Spark Structured Streaming reading `<topic>` with
  Spark's Kafka source (`spark-sql-kafka-0-10`, resolved by `peer_jars`) and writing every
  micro-batch as Parquet to object storage in `foreachBatch` (one object per Kafka partition
  per batch, written by the executors). No read-back, no self-correction, no replicas. Line:
  `{"batch": id, "offsets": {partition: next offset}, "seconds": batch duration, "rows": n}`.
* `delta`: what a user would build to keep a table equal to the view: the same source, each
  micro-batch consolidated to one change per key and applied with Delta Lake's `MERGE` to a
  Delta table over S3A (`delta_jars`, `delta_conf`). Lines as the peer's plus the S3A bytes
  `read` and `written` by the batch; on SIGTERM its table's rows go to `WORKDIR/final.parquet`
  and a `{"final": path, "rows": n}` line.
* `raw`: the limit: one tight loop per partition (a thread each) consuming the topic and
  writing the updates of each tick (up to its in-band `Progress`) as one Parquet object, with
  no coordination at all. Line: `{"partition": p, "offset": next offset, "rows": n}`.

All decode the desired records with the same code as mvsink's write tasks
(`mvsink.core.codec.decode` + `updates_from_ipc`), so they differ only in what they do with the
updates. Run: `python -m mvsink.bench.systems peer|delta|raw TOPIC PARTITIONS PREFIX [WORKDIR]`
with the S3 settings, row schema and bootstrap in the environment (`MVSINK_*`, as for the
services).
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mvsink import Say
from mvsink.core.codec import decode
from mvsink.core.messages import Progress, Record, Updates, UpdatesArrow
from mvsink.core.rows import parse_row_schema, updates_decoder
from mvsink.core.updates import updates_from_ipc
from mvsink.io.config import Config, S3Settings, cache_dir
from mvsink.io.registry import Framing
from mvsink.io.spark import trim_worker_path
from mvsink.stack.state import stack_config

#: The artifacts of `maven/spark-kafka.pom.xml` passed as `spark.jars`.
PEER_ARTIFACTS = (
    "spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2"
)


def peer_jars(say: Say) -> list[str]:
    """The jars of Spark's Kafka source at the installed PySpark version (resolved once)."""
    import pyspark

    from mvsink.stack import jars

    version = pyspark.__version__
    libs = jars.resolve(
        "spark-kafka.pom.xml",
        cache_dir() / "spark-kafka" / version / "libs",
        say,
        f"Spark's Kafka source {version}",
        [f"-Dspark.version={version}", f"-DincludeArtifactIds={PEER_ARTIFACTS}"],
    )
    return sorted(str(p) for p in libs.glob("*.jar"))


#: The groups of `maven/delta-peer.pom.xml` passed as `spark.jars` (see the POM).
DELTA_GROUPS = (
    "io.delta,org.apache.hadoop,software.amazon.awssdk,software.amazon.eventstream,"
    "org.reactivestreams"
)
DELTA_EXCLUDED = (
    "hadoop-client-api,hadoop-client-runtime,delta-kernel-api,delta-kernel-defaults,"
    "delta-kernel-unitycatalog"
)


def delta_jars(say: Say) -> list[str]:
    """Delta Lake for Spark 4.1 and the S3A filesystem (resolved once)."""
    from mvsink.stack import jars

    libs = jars.resolve(
        "delta-peer.pom.xml",
        cache_dir() / "delta-peer" / "libs",
        say,
        "Delta Lake and S3A",
        [f"-DincludeGroupIds={DELTA_GROUPS}", f"-DexcludeArtifactIds={DELTA_EXCLUDED}"],
    )
    return sorted(str(p) for p in libs.glob("*.jar"))


def delta_conf(settings: S3Settings) -> dict[str, str]:
    """Spark settings for Delta tables on `settings`' S3 endpoint through S3A."""
    endpoint = settings.endpoint
    if "://" not in endpoint:
        endpoint = ("https://" if settings.secure else "http://") + endpoint
    return {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": settings.region or "us-east-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": str(settings.secure).lower(),
        "spark.hadoop.fs.s3a.access.key": settings.access_key.reveal(),
        "spark.hadoop.fs.s3a.secret.key": settings.secret_key.reveal(),
        # A commit's snapshot is rebuilt in 50 tasks by default: on a small table on 2 cores
        # that is most of a micro-batch.
        "spark.databricks.delta.snapshotPartitions": "2",
    }


def decode_updates(values: Iterable[bytes], row_schema: pa.Schema) -> pa.Table | None:
    """The updates in desired records `values` in mvsink's own framing (progress records
    skipped): the peers' executors hold no registry client."""
    records = [decode(v, (UpdatesArrow, Updates, Progress)) for v in values]
    return updates_of(records, row_schema)


def updates_of(records: Iterable[Record], row_schema: pa.Schema) -> pa.Table | None:
    """The updates in desired records of either wire form (others skipped), decoded as
    mvsink's write tasks do; None if none."""
    tables, from_v1 = [], updates_decoder(row_schema)
    for record in records:
        if isinstance(record, UpdatesArrow):
            tables.append(updates_from_ipc(record.ipc, row_schema))
        elif isinstance(record, Updates):
            tables.append(from_v1(record))
    return pa.concat_tables(tables) if tables else None


def put_parquet(settings: S3Settings, key: str, table: pa.Table) -> int:
    """Write `table` as one Parquet object; its size."""
    from mvsink.io.s3 import put_bytes, s3_client

    buf = io.BytesIO()
    pq.write_table(table, buf)
    put_bytes(
        s3_client(settings), settings.bucket, key, buf.getvalue(), "application/vnd.apache.parquet"
    )
    return buf.tell()


def _emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


# -- peer ---------------------------------------------------------------------------------------


def run_peer(config: Config, topic: str, prefix: str, work: Path) -> None:
    """Structured Streaming: Kafka source -> foreachBatch -> Parquet (until SIGTERM)."""
    from mvsink.io.spark import spark_session

    jars = peer_jars(lambda line: print(line, file=sys.stderr))
    spark = spark_session("mvsink-bench-peer", conf={"spark.jars": ",".join(jars)}, config=config)
    settings, row_schema = config.s3, parse_row_schema(config.row_schema)
    result = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("rows", pa.int64())])

    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        trim_worker_path()  # the peer's Python workers as lean as mvsink's (fair figures)
        chunks = list(batches)  # none: the range held only transaction markers
        if not chunks or sum(c.num_rows for c in chunks) == 0:
            return
        table = pa.Table.from_batches(chunks)
        partition = table.column("partition")[0].as_py()
        updates = decode_updates(table.column("value").to_pylist(), row_schema)
        if updates is not None:
            put_parquet(settings, f"{prefix}/p{partition}/{uuid.uuid4()}.parquet", updates)
        offset = max(table.column("offset").to_pylist()) + 1
        rows = 0 if updates is None else updates.num_rows
        yield pa.RecordBatch.from_pylist(
            [{"partition": partition, "offset": offset, "rows": rows}], schema=result
        )

    def write_batch(batch: Any, batch_id: int) -> None:
        started = time.monotonic()
        done = (
            batch.select("partition", "offset", "value")
            .mapInArrow(write_partition, "partition int, offset long, rows long")
            .collect()
        )
        _emit(
            {
                "batch": batch_id,
                "offsets": {r["partition"]: r["offset"] for r in done},
                "seconds": time.monotonic() - started,
                "rows": sum(r["rows"] for r in done),
            }
        )

    stream_until_sigterm(spark, config, topic, write_batch, work)
    spark.stop()


def stream_until_sigterm(
    spark: Any, config: Config, topic: str, each_batch: Callable[[Any, int], None], work: Path
) -> None:
    """Read `topic` from the start with Spark's Kafka source (read_committed: desired is written
    transactionally), `each_batch(batch, id)` per micro-batch, until SIGTERM.

    Raises:
        RuntimeError: the stream failed (its error).
    """
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.kafka_bootstrap)
        .option("subscribe", topic)
        .option("kafka.isolation.level", "read_committed")
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    _emit({"ready": True})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5) and query.isActive:
        pass
    if query.exception() is not None:
        raise RuntimeError(f"the stream failed: {query.exception()}")
    query.stop()


# -- delta --------------------------------------------------------------------------------------

#: A micro-batch's changes as one row per key: its latest change, the value inserted at that
#: time or a delete (a tombstone, `value` null), applied only over an older change of the key.
#: Desired is partitioned by row, not by key: a key's retraction and insertion are on different
#: partitions and may arrive in different micro-batches in either order, so the table keeps each
#: key's time (an insertion wins over a delete at the same time) and a tombstone, which keeps a
#: late, older insertion from bringing a deleted key back.
MERGE = """
MERGE INTO delta.`{table}` AS t
USING {changes} AS c
ON t.key = c.key
WHEN MATCHED AND (c._time > t._time OR (c._time = t._time AND t.value IS NULL))
  THEN UPDATE SET t.value = c.value, t._time = c._time
WHEN NOT MATCHED THEN INSERT (key, value, _time) VALUES (c.key, c.value, c._time)
"""


def run_delta(config: Config, topic: str, prefix: str, work: Path) -> None:
    """Structured Streaming: Kafka source -> foreachBatch -> consolidate -> Delta MERGE by key
    into `s3a://<bucket>/<prefix>/table` (until SIGTERM; then the table's rows are written to
    `work/final.parquet` and a `{"final": path, "rows": n}` line is printed). Lines as the
    peer's, with the S3A bytes read and written since the last line."""
    from pyspark.sql import functions as F

    from mvsink.io.spark import spark_session

    say = lambda line: print(line, file=sys.stderr)  # noqa: E731
    jars = peer_jars(say) + delta_jars(say)
    settings, row_schema = config.s3, parse_row_schema(config.row_schema)
    spark = spark_session(
        "mvsink-bench-delta",
        shuffle_partitions=2,
        conf={"spark.jars": ",".join(jars), **delta_conf(settings)},
        config=config,
    )
    table = f"s3a://{settings.bucket}/{prefix}/table"
    spark.createDataFrame([], "key string, value long, _time long").write.format("delta").mode(
        "overwrite"
    ).save(table)
    io_bytes = _s3a_bytes(spark, table)
    schema = "partition int, offset long, key string, value long, _time long, _diff long"

    def decode_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Per Arrow batch (one Kafka partition's range): a marker row with its partition and
        last offset (`key` null), then its updates."""
        trim_worker_path()  # as the peer's
        for batch in batches:
            if batch.num_rows == 0:
                continue
            yield pa.RecordBatch.from_pydict(
                {
                    "partition": pa.array([batch.column("partition")[0].as_py()], pa.int32()),
                    "offset": pa.array([pc.max(batch.column("offset")).as_py()], pa.int64()),
                    "key": pa.nulls(1, pa.string()),
                    "value": pa.nulls(1, pa.int64()),
                    "_time": pa.nulls(1, pa.int64()),
                    "_diff": pa.array([0], pa.int64()),
                }
            )
            updates = decode_updates(batch.column("value").to_pylist(), row_schema)
            if updates is not None:
                n = updates.num_rows
                yield from pa.Table.from_pydict(
                    {
                        "partition": pa.nulls(n, pa.int32()),
                        "offset": pa.nulls(n, pa.int64()),
                        "key": updates.column("key"),
                        "value": updates.column("value"),
                        "_time": updates.column("_time"),
                        "_diff": updates.column("_diff"),
                    }
                ).to_batches()

    def merge_batch(batch: Any, batch_id: int) -> None:
        started = time.monotonic()
        decoded = (
            batch.select("partition", "offset", "value")
            .mapInArrow(decode_partition, schema)
            .persist()
        )
        offsets = {
            r["partition"]: r["offset"] + 1
            for r in decoded.where("key IS NULL")
            .groupBy("partition")
            .agg(F.max("offset").alias("offset"))
            .collect()
        }
        updates = decoded.where("key IS NOT NULL")
        rows = updates.count()
        # Consolidate the micro-batch, then one change per key: the latest (an insertion
        # before a retraction at the same time), its value or null for a delete (see MERGE).
        net = (
            updates.groupBy("key", "value", "_time").agg(F.sum("_diff").alias("d")).where("d != 0")
        )
        latest = F.max(F.struct("_time", (F.col("d") > 0).alias("inserted"), "value")).alias("c")
        changes = (
            net.groupBy("key")
            .agg(latest)
            .select(
                "key",
                F.when(F.col("c.inserted"), F.col("c.value")).alias("value"),
                F.col("c._time").alias("_time"),
            )
        )
        name = f"changes_{batch_id}"
        changes.createOrReplaceTempView(name)
        batch.sparkSession.sql(MERGE.format(table=table, changes=name))
        batch.sparkSession.catalog.dropTempView(name)
        decoded.unpersist()
        read, written = _s3a_bytes(spark, table)
        _emit(
            {
                "batch": batch_id,
                "offsets": offsets,
                "seconds": time.monotonic() - started,
                "rows": rows,
                "read": read - io_bytes[0],
                "written": written - io_bytes[1],
            }
        )
        io_bytes[0], io_bytes[1] = read, written

    stream_until_sigterm(spark, config, topic, merge_batch, work)
    final = (
        spark.read.format("delta").load(table).where("value IS NOT NULL").select("key", "value")
    ).toArrow()
    work.mkdir(parents=True, exist_ok=True)
    pq.write_table(final, work / "final.parquet")
    _emit({"final": str(work / "final.parquet"), "rows": final.num_rows})
    spark.stop()


def _s3a_bytes(spark: Any, path: str) -> list[int]:
    """Bytes the S3A filesystem of `path` has read and written in this process so far."""
    jvm = spark.sparkContext._jvm
    uri = jvm.java.net.URI(path)
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(uri, spark.sparkContext._jsc.hadoopConfiguration())
    stats = fs.getStorageStatistics()
    return [
        int(stats.getLong("stream_read_bytes") or 0),
        int(stats.getLong("stream_write_bytes") or 0),
    ]


# -- raw ----------------------------------------------------------------------------------------


def run_raw(config: Config, topic: str, partitions: int, prefix: str) -> None:
    """One consume-and-write loop per partition (until SIGTERM)."""
    settings, row_schema = config.s3, parse_row_schema(config.row_schema)
    stop, framing = threading.Event(), config.framing()

    def loop(partition: int) -> None:
        bootstrap = config.kafka_bootstrap
        for updates, offset in ticks_of(bootstrap, topic, partition, row_schema, stop, framing):
            if updates is not None:
                put_parquet(settings, f"{prefix}/p{partition}/{uuid.uuid4()}.parquet", updates)
            _emit(
                {
                    "partition": partition,
                    "offset": offset,
                    "rows": 0 if updates is None else updates.num_rows,
                }
            )

    threads = [threading.Thread(target=loop, args=(p,), daemon=True) for p in range(partitions)]
    for thread in threads:
        thread.start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    _emit({"ready": True})
    while not stop.wait(0.5):
        pass
    for thread in threads:
        thread.join(10)


def ticks_of(
    bootstrap: str,
    topic: str,
    partition: int,
    row_schema: pa.Schema,
    stop: threading.Event,
    framing: Framing,
) -> Generator[tuple[pa.Table | None, int], None, None]:
    """A desired partition read from its start, tick by tick, until `stop` is set: each tick's
    updates decoded into Arrow (None if it had none) with the offset after its `Progress` (a
    registry-framed record's schema id looked up through `framing`)."""
    from confluent_kafka import Consumer, TopicPartition

    from mvsink.io.kafka import READ_TO_END, consumer_config

    consumer = Consumer(consumer_config(bootstrap, extra=READ_TO_END))
    consumer.assign([TopicPartition(topic, partition, 0)])
    pending: list[Record] = []
    try:
        while not stop.is_set():
            for message in consumer.consume(1000, 0.1):
                value = message.value()
                if message.error() or value is None:
                    continue
                record = decode(value, (UpdatesArrow, Updates, Progress), framing.lookup)
                if not isinstance(record, Progress):
                    pending.append(record)
                    continue
                yield updates_of(pending, row_schema), (message.offset() or 0) + 1
                pending = []
    finally:
        consumer.close()


def read_load(config: Config, topic: str, partitions: int) -> tuple[float, int]:
    """One plain read of the initial load (tick 0): every partition's records up to its first
    `Progress` consumed and decoded into Arrow, a thread per partition, as the raw loop reads
    them, nothing written. (seconds, updates): the baseline a system's hydration is set against."""
    row_schema, framing = parse_row_schema(config.row_schema), config.framing()
    counts = [0] * partitions

    def read(partition: int) -> None:
        ticks = ticks_of(
            config.kafka_bootstrap, topic, partition, row_schema, threading.Event(), framing
        )
        with contextlib.closing(ticks):  # closes its consumer
            updates, _ = next(ticks)
        counts[partition] = 0 if updates is None else updates.num_rows

    started = time.monotonic()
    threads = [threading.Thread(target=read, args=(p,)) for p in range(partitions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started, sum(counts)


def main(argv: list[str]) -> int:
    """`python -m mvsink.bench.systems peer|delta|raw TOPIC PARTITIONS PREFIX [WORKDIR]`."""
    which, topic, partitions, prefix = argv[0], argv[1], int(argv[2]), argv[3]
    config = stack_config()
    if which == "peer":
        run_peer(config, topic, prefix, Path(argv[4]))
    elif which == "delta":
        run_delta(config, topic, prefix, Path(argv[4]))
    else:
        run_raw(config, topic, partitions, prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

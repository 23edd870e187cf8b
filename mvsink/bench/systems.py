"""The two systems `mvsink bench` measures mvsink against, each run as its own process that
prints one JSON line per unit of durable progress on stdout:

* `peer`: what a user would build instead: Spark Structured Streaming reading `<topic>` with
  Spark's Kafka source (`spark-sql-kafka-0-10`, resolved by `peer_jars`) and writing every
  micro-batch as Parquet to object storage in `foreachBatch` (one object per Kafka partition
  per batch, written by the executors). No read-back, no self-correction, no replicas. Line:
  `{"batch": id, "offsets": {partition: next offset}, "seconds": batch duration, "rows": n}`.
* `raw`: the limit: one tight loop per partition (a thread each) consuming the topic and
  writing the updates of each tick (up to its in-band `Progress`) as one Parquet object, with
  no coordination at all. Line: `{"partition": p, "offset": next offset, "rows": n}`.

Both decode the desired records with the same code as mvsink's write tasks
(`mvsink.codec.decode` + `updates_from_ipc`), so the three differ only in what they do with
the updates. Run: `python -m mvsink.bench.systems peer|raw TOPIC PARTITIONS PREFIX` with the
S3 settings, row schema and bootstrap in the environment (`MVSINK_*`, as for the services).
"""

from __future__ import annotations

import io
import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mvsink import Say
from mvsink.codec import decode
from mvsink.config import Config, S3Settings, cache_dir, load_config
from mvsink.messages import Progress, Record, Updates, UpdatesArrow
from mvsink.rows import parse_row_schema, updates_decoder
from mvsink.updates import updates_from_ipc

#: The artifacts of `maven/spark-kafka.pom.xml` passed as `spark.jars`.
PEER_ARTIFACTS = (
    "spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2"
)


def peer_jars(say: Say) -> list[str]:
    """The jars of Spark's Kafka source at the installed PySpark version (resolved once)."""
    import pyspark

    from mvsink.stack import jars

    version = pyspark.__version__
    libs = jars.resolve("spark-kafka.pom.xml", cache_dir() / "spark-kafka" / version / "libs", say,
                        f"Spark's Kafka source {version}",
                        [f"-Dspark.version={version}", f"-DincludeArtifactIds={PEER_ARTIFACTS}"])  # fmt: skip
    return sorted(str(p) for p in libs.glob("*.jar"))


def decode_updates(values: Iterable[bytes], row_schema: pa.Schema) -> pa.Table | None:
    """The updates in framed desired records `values` (progress records skipped)."""
    return updates_of([decode(v, (UpdatesArrow, Updates, Progress)) for v in values], row_schema)


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
    from mvsink.s3 import put_bytes, s3_client

    buf = io.BytesIO()
    pq.write_table(table, buf)
    put_bytes(s3_client(settings), settings.bucket, key, buf.getvalue(),
              "application/vnd.apache.parquet")  # fmt: skip
    return buf.tell()


def _emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


# -- peer ---------------------------------------------------------------------------------------


def run_peer(config: Config, topic: str, prefix: str, work: Path) -> None:
    """Structured Streaming: Kafka source -> foreachBatch -> Parquet (until SIGTERM)."""
    from mvsink.spark import spark_session

    jars = peer_jars(lambda line: print(line, file=sys.stderr))
    spark = spark_session("mvsink-bench-peer", conf={"spark.jars": ",".join(jars)})
    settings, row_schema = config.s3, parse_row_schema(config.row_schema)
    result = pa.schema([("partition", pa.int32()), ("offset", pa.int64()), ("rows", pa.int64())])

    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
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
        yield pa.RecordBatch.from_pylist([{"partition": partition, "offset": offset, "rows": rows}],
                                         schema=result)  # fmt: skip

    def write_batch(batch: Any, batch_id: int) -> None:
        started = time.monotonic()
        done = (
            batch.select("partition", "offset", "value")
            .mapInArrow(write_partition, "partition int, offset long, rows long")
            .collect()
        )
        _emit({"batch": batch_id, "offsets": {r["partition"]: r["offset"] for r in done},
               "seconds": time.monotonic() - started, "rows": sum(r["rows"] for r in done)})  # fmt: skip

    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", config.kafka_bootstrap)
        .option("subscribe", topic)
        .option("kafka.isolation.level", "read_committed")  # desired is written transactionally
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5) and query.isActive:
        pass
    query.stop()
    spark.stop()


# -- raw ----------------------------------------------------------------------------------------


def run_raw(config: Config, topic: str, partitions: int, prefix: str) -> None:
    """One consume-and-write loop per partition (until SIGTERM)."""
    from confluent_kafka import Consumer, TopicPartition

    from mvsink.kafka import READ_TO_END, consumer_config

    settings, row_schema = config.s3, parse_row_schema(config.row_schema)
    stop = threading.Event()

    def loop(partition: int) -> None:
        consumer = Consumer(consumer_config(config.kafka_bootstrap, extra=READ_TO_END))
        consumer.assign([TopicPartition(topic, partition, 0)])
        pending: list[Record] = []
        try:
            while not stop.is_set():
                for message in consumer.consume(1000, 0.1):
                    value = message.value()
                    if message.error() or value is None:
                        continue
                    record = decode(value, (UpdatesArrow, Updates, Progress))
                    if not isinstance(record, Progress):
                        pending.append(record)
                        continue
                    updates = updates_of(pending, row_schema)
                    rows = 0 if updates is None else updates.num_rows
                    if updates is not None:
                        put_parquet(
                            settings, f"{prefix}/p{partition}/{uuid.uuid4()}.parquet", updates
                        )
                    _emit(
                        {
                            "partition": partition,
                            "offset": (message.offset() or 0) + 1,
                            "rows": rows,
                        }
                    )
                    pending = []
        finally:
            consumer.close()

    threads = [threading.Thread(target=loop, args=(p,), daemon=True) for p in range(partitions)]
    for thread in threads:
        thread.start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    for thread in threads:
        thread.join(10)


def main(argv: list[str]) -> int:
    """`python -m mvsink.bench.systems peer|raw TOPIC PARTITIONS PREFIX [WORKDIR]`."""
    which, topic, partitions, prefix = argv[0], argv[1], int(argv[2]), argv[3]
    config = load_config()
    if which == "peer":
        run_peer(config, topic, prefix, Path(argv[4]))
    else:
        run_raw(config, topic, partitions, prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

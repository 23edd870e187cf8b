"""Spark for mvsink: a session factory tuned for a small box, and executor-side Parquet I/O
against object storage (pyarrow + the S3 client inside `mapInArrow`; no Hadoop S3 connector).

`local[*]` by default; `master` (or `MVSINK_SPARK_MASTER`) points at a cluster instead.
"""

from __future__ import annotations

import io
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from mvsink.settings import S3Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

PART_RESULT_SCHEMA = "key string, rows long, bytes long"


def spark_session(
    app_name: str = "mvsink",
    master: str | None = None,
    *,
    ui: bool = False,
    shuffle_partitions: int | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for this box: few shuffle partitions, UI off unless asked, quiet logs,
    Arrow on, executors running this interpreter, every listener on 127.0.0.1."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    cores = os.cpu_count() or 2
    settings = {
        "spark.master": master or os.environ.get("MVSINK_SPARK_MASTER") or "local[*]",
        "spark.app.name": app_name,
        "spark.ui.enabled": str(ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(shuffle_partitions or 2 * cores),
        "spark.default.parallelism": str(2 * cores),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "2g",
        "spark.python.worker.reuse": "true",
        "spark.log.level": "WARN",
        **(conf or {}),
    }
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def trim_worker_path() -> int:
    """Drop the zip/jar entries PySpark puts on a Python worker's `sys.path`; how many.

    Before every task the PySpark worker calls `importlib.invalidate_caches()`, and CPython's
    `zipimporter.invalidate_caches` re-reads the central directory of every zip on the path:
    for a pip-installed PySpark that is `pyspark.zip`, the py4j zip and the spark-core jar
    (thousands of entries). py-spy on the write service showed half of the executors' samples
    there (~0.1-0.2 s per task wave on 2 cores). Modules already imported from those zips keep
    working (their packages' `__path__` still points into the zip); call this from a module the
    tasks import, after the imports it needs. No effect outside a Spark worker.
    """
    import zipimport

    zips = [p for p in sys.path if p.endswith((".zip", ".jar")) and f"{os.sep}pyspark{os.sep}" in p]
    for path in zips:
        sys.path.remove(path)
    for key in [k for k, v in sys.path_importer_cache.items()
                if isinstance(v, zipimport.zipimporter) and k.startswith(tuple(zips))]:  # fmt: skip
        del sys.path_importer_cache[key]
    return len(zips)


def write_parquet_parts(
    df: DataFrame, settings: S3Settings, prefix: str
) -> list[tuple[str, int, int]]:
    """Write each Spark partition of `df` as one Parquet object under `prefix/`, from the
    executors; the `(key, rows, bytes)` of each object written (empty partitions write none)."""

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from mvsink.s3 import put_bytes, s3_client

        table = pa.Table.from_batches(list(batches))
        if table.num_rows == 0:
            return
        buf = io.BytesIO()
        pq.write_table(table, buf)
        data = buf.getvalue()
        key = f"{prefix}/{uuid.uuid4()}.parquet"
        put_bytes(s3_client(settings), settings.bucket, key, data, "application/vnd.apache.parquet")
        yield pa.RecordBatch.from_pydict(
            {"key": [key], "rows": [table.num_rows], "bytes": [len(data)]},
            schema=pa.schema([("key", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64())]),
        )

    rows = df.mapInArrow(write, PART_RESULT_SCHEMA).collect()
    return [(r["key"], r["rows"], r["bytes"]) for r in rows]


def map_objects(
    spark: SparkSession,
    settings: S3Settings,
    keys: list[str],
    load: Callable[[bytes], pa.Table],
    schema: str | StructType,
) -> DataFrame:
    """A DataFrame of the rows `load` makes of each object in `keys`, fetched and loaded by
    the executors (one task per object, at most 64 tasks); `schema` is the rows' Spark schema.
    `load` runs on executors: it must be picklable (a module-level function or a closure over
    picklable values)."""

    def read(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from mvsink.s3 import get_bytes, s3_client

        client = s3_client(settings)
        for batch in batches:
            for key in batch.column("key").to_pylist():
                yield from load(get_bytes(client, settings.bucket, key)).to_batches()

    if not keys:
        return spark.createDataFrame([], schema)
    keys_df = spark.createDataFrame([(k,) for k in keys], "key string")
    return keys_df.repartition(min(len(keys), 64)).mapInArrow(read, schema)


def _read_parquet(data: bytes) -> pa.Table:
    return pq.read_table(io.BytesIO(data))


def read_parquet_parts(
    spark: SparkSession, settings: S3Settings, keys: list[str], schema: str
) -> DataFrame:
    """A DataFrame of the rows of the Parquet objects `keys`, read by the executors (one task
    per object); `schema` is the Spark DDL of the rows."""
    return map_objects(spark, settings, keys, _read_parquet, schema)

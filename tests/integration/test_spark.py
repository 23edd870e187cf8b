"""Spark `local[*]`: executors write Parquet to object storage (pyarrow + the S3 client inside
`mapInArrow`) and read it back; the helpers the write service schedules its jobs with."""

from __future__ import annotations

import gc
import io
import sys
import types
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from mvsink.io import spark_classes
from mvsink.io.config import S3Settings, cache_dir
from mvsink.io.s3 import get_bytes, s3_client
from mvsink.io.spark import (
    freeze_worker_heap,
    live_executors,
    read_parquet_parts,
    run_pinned,
    task_slots,
    write_parquet_parts,
)

pytestmark = pytest.mark.integration


def test_executors_write_parquet_to_s3_and_read_it_back(
    spark: Any, s3_settings: S3Settings
) -> None:
    rows = [(i, f"customer-{i % 7}", i * 10, 1 if i % 3 else -1) for i in range(1000)]
    schema = "id long, name string, _time long, _diff long"
    df = spark.createDataFrame(rows, schema).repartition(4)
    prefix = f"tests/{uuid.uuid4().hex}/parts"

    written = write_parquet_parts(df, s3_settings, prefix)

    assert len(written) == 4  # one object per non-empty Spark partition
    assert sum(n for _, n, _ in written) == 1000
    client = s3_client(s3_settings)
    for key, count, size in written:  # the objects are really in S3, as Parquet
        data = get_bytes(client, s3_settings.bucket, key)
        assert key.startswith(prefix) and len(data) == size
        assert pq.read_table(io.BytesIO(data)).num_rows == count

    back = read_parquet_parts(spark, s3_settings, [k for k, _, _ in written], schema)
    assert sorted(tuple(r) for r in back.collect()) == sorted(rows)


def test_the_driver_jvm_maps_the_class_archive(spark: Any) -> None:
    """The session's driver JVM was started with this machine's archive of Spark's classes
    and mapped it (built by the fixture, `mvsink.io.spark_classes`)."""
    archive = spark_classes.archive_path(cache_dir())
    assert archive is not None and archive.is_file()
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions")
    assert f"-XX:SharedArchiveFile={archive}" in options
    jvm = spark.sparkContext._gateway.proc.pid  # spark-submit execs the driver's JVM
    assert str(archive) in Path(f"/proc/{jvm}/maps").read_text()


def test_task_slots_are_the_cores_not_the_default_parallelism(spark: Any) -> None:
    """`local[2,4]` runs 2 tasks at once; `defaultParallelism` says 4 (twice the cores), and
    sizing the write jobs by it would run them in two waves."""
    assert spark.sparkContext.defaultParallelism == 4
    assert task_slots(spark) == 2


def test_run_pinned_runs_every_item_once_in_order_over_unix_sockets(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.python.unix.domain.socket.enabled") == "true"
    executor = next(iter(live_executors(spark)))
    work = [("a b", executor), ("c", None), ("d e f", executor), ("", None)]
    assert run_pinned(spark, work, str.split) == ["a", "b", "c", "d", "e", "f"]


def test_a_task_freezes_its_worker_heap_again_only_after_new_imports(spark: Any) -> None:
    """PySpark's daemon collects the whole heap after every task of a reused worker: a task
    run by `run_pinned` has frozen what its worker holds, freezes again only once modules were
    imported since, and nothing is frozen outside a task (the driver's heap stays as it is)."""

    def probe(name: str) -> list[tuple[bool, bool, bool]]:
        frozen = gc.get_freeze_count() > 0  # run_pinned's wrapper froze before this ran
        again = freeze_worker_heap()  # nothing imported since
        sys.modules[name] = types.ModuleType(name)  # as an import the task makes
        try:
            return [(frozen, again, freeze_worker_heap())]
        finally:
            del sys.modules[name]

    before = gc.get_freeze_count()
    assert freeze_worker_heap() is False
    assert gc.get_freeze_count() == before
    results = run_pinned(spark, [(f"_mvsink_probe_{uuid.uuid4().hex}", None)] * 3, probe)
    assert results == [(True, False, True)] * 3


def test_executor_python_workers_allocate_arrow_memory_with_jemalloc(spark: Any) -> None:
    """The write tasks decode and encode Arrow on several threads of a worker at once; their
    workers use the pool `import mvsink` chose for the driver (mvsink/__init__.py)."""

    def pool(_: str) -> list[tuple[str, str | None]]:
        import os

        import pyarrow as pa

        return [
            (pa.default_memory_pool().backend_name, os.environ.get("ARROW_DEFAULT_MEMORY_POOL"))
        ]

    assert run_pinned(spark, [("", None)] * 2, pool) == [("jemalloc", "jemalloc")] * 2

"""Spark `local[*]`: executors write Parquet to object storage (pyarrow + the S3 client inside
`mapInArrow`) and read it back."""

from __future__ import annotations

import io
import uuid
from typing import Any

import pyarrow.parquet as pq
import pytest

from mvsink.config import S3Settings
from mvsink.s3 import get_bytes, s3_client
from mvsink.spark import read_parquet_parts, write_parquet_parts

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

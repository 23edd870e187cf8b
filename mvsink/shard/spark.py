"""The Spark reader of a shard: `read_shard(spark, shard_id, as_of, s3)` returns the shard's
consolidated contents at `as_of` as a DataFrame; the executors read the Parquet parts (pyarrow +
the S3 client inside `mapInArrow`), Spark consolidates."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from mvsink.core.errors import InvalidUsage
from mvsink.core.frontier import Frontier
from mvsink.core.settings import S3Settings
from mvsink.core.updates import DIFF, ERR, TIME, part_schema
from mvsink.io.spark import map_objects
from mvsink.shard import open_shard
from mvsink.shard.parts import decode_part

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def read_shard(
    spark: SparkSession, shard_id: str, as_of: Frontier | int, s3: S3Settings
) -> DataFrame:
    """Columns: the row columns, `_time` (= `as_of - 1`), `_diff` (net, non-zero), `_err`.

    Raises:
        InvalidUsage: `as_of` beyond the shard's upper (not final yet).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    frontier = Frontier.at(as_of) if isinstance(as_of, int) else as_of
    if frontier.time is None:
        raise InvalidUsage("read_shard needs a finite as_of")
    shard = open_shard(shard_id, None, s3)
    state = shard.state()
    if not frontier.less_equal(state.upper):
        raise InvalidUsage(f"as_of {frontier} is beyond the upper {state.upper} of {shard_id}")
    keys = [p.key for b in state.batches if b.lower.less_than(frontier) for p in b.parts]
    row_schema = shard.schema
    arrow_schema = part_schema(row_schema)
    until = frontier.time

    def load(data: bytes) -> pa.Table:
        table = decode_part(data, row_schema)
        return table.filter(pc.less(table.column(TIME), until))

    updates = map_objects(spark, s3, keys, load, from_arrow_schema(arrow_schema))
    group = [*row_schema.names, ERR]
    consolidated = (
        updates.groupBy(*group)
        .agg(F.sum(DIFF).cast("long").alias(DIFF))
        .where(F.col(DIFF) != 0)
        .withColumn(TIME, F.lit(until - 1).cast("long"))
    )
    return consolidated.select(*arrow_schema.names)

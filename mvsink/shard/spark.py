"""The Spark reader of a shard: `read_shard(spark, shard_id, as_of, s3)` is a context manager
whose value is the shard's consolidated contents at `as_of` as a DataFrame; the executors read
the Parquet parts (pyarrow + the S3 client inside `mapInArrow`), Spark consolidates::

    with read_shard(spark, "sink-orders", 100, s3) as frame:
        frame.write.parquet("s3a://exports/orders-at-100")

Inside the block a reader lease holds `since` at or before `as_of` and pins the version whose
parts the DataFrame names (`mvsink.shard.pin.PinnedRead`): merges and the collector may run
meanwhile, yet every action on the DataFrame reads the same parts, however long it takes. A
daemon thread renews the lease every third of `Timing.reader_lease`; leaving the block
releases it. Use the DataFrame inside the block only (cache it there to keep it longer).

Time: a driver paused longer than the lease (or whose renewals fail for that long) loses the
pin; an action may then fail with `PartGone` (a part it needs was collected), never read a
wrong row (parts are immutable). `ShardRead.lapsed` says so, the renewer logs it, and the read
must start over.
"""

from __future__ import annotations

import logging
import threading
import uuid
from types import TracebackType
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from mvsink.core.errors import InvalidUsage
from mvsink.core.frontier import Frontier
from mvsink.core.settings import S3Settings, Timing
from mvsink.core.updates import DIFF, ERR, TIME, part_schema
from mvsink.io.spark import map_objects
from mvsink.shard import open_shard
from mvsink.shard.parts import decode_part
from mvsink.shard.pin import PinnedRead

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
#: The share of the lease after which the renewer renews.
RENEW_SHARE = 1 / 3


def read_shard(
    spark: SparkSession,
    shard_id: str,
    as_of: Frontier | int,
    s3: S3Settings,
    timing: Timing | None = None,
) -> ShardRead:
    """A read of `shard_id` at `as_of` (use it with `with`). The DataFrame's columns: the row
    columns, `_time` (= `as_of - 1`), `_diff` (net, non-zero), `_err`.

    Raises (on entering the block):
        InvalidUsage: `as_of` not finite, or beyond the shard's upper (not final yet).
        AsOfBeforeSince: `as_of` before the shard's `since` (that history was merged away).
    """
    frontier = Frontier.at(as_of) if isinstance(as_of, int) else as_of
    if frontier.time is None:
        raise InvalidUsage("read_shard needs a finite as_of")
    return ShardRead(spark, shard_id, frontier, s3, timing)


class ShardRead:
    """A lease-held read of a shard: `with` gives the DataFrame (module docs)."""

    def __init__(
        self,
        spark: SparkSession,
        shard_id: str,
        as_of: Frontier,
        s3: S3Settings,
        timing: Timing | None = None,
    ) -> None:
        self.spark, self.shard_id, self.as_of, self.s3 = spark, shard_id, as_of, s3
        self.timing = timing
        self.reader_id = f"read.{uuid.uuid4().hex[:12]}"
        self._pin: PinnedRead | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def lapsed(self) -> bool:
        """Whether the pin lapsed while the block ran (actions since may fail: module docs)."""
        return self._pin is not None and self._pin.lapsed

    def __enter__(self) -> DataFrame:
        shard = open_shard(self.shard_id, None, self.s3, self.timing)
        self._pin = pin = PinnedRead(shard, self.reader_id, self.as_of)
        self._renewer = threading.Thread(
            target=self._renew, name=f"mvsink-{self.reader_id}", daemon=True
        )
        self._renewer.start()
        return _frame(self.spark, self.s3, pin)

    def _renew(self) -> None:
        pin = self._pin
        assert pin is not None
        interval = pin.shard.timing.reader_lease * RENEW_SHARE
        while not self._stop.wait(interval):
            try:
                if not pin.renew():
                    return
            except Exception:
                log.warning("renewing the read lease %s failed", self.reader_id, exc_info=True)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self._pin is not None and not self._pin.lapsed:
            self._pin.release()


def _frame(spark: SparkSession, s3: S3Settings, pin: PinnedRead) -> DataFrame:
    """The pinned version's contents at its `as_of`, read and consolidated by Spark."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    frontier, state = pin.as_of, pin.state
    keys = [p.key for b in state.batches if b.lower.less_than(frontier) for p in b.parts]
    row_schema = state.schema
    arrow_schema = part_schema(row_schema)
    until = frontier.time
    assert until is not None  # `read_shard` refuses an unbounded `as_of`

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

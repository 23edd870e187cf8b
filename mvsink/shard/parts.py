"""Staged parts: update tables (`mvsink.updates`) checked against their batch bounds, encoded as
Parquet, and consolidated for readers and merges. Everything here is vectorised Arrow; nothing
loops over rows in Python."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mvsink.errors import InvalidUsage
from mvsink.frontier import Frontier
from mvsink.updates import TIME, advance_times, consolidate, normalize_updates


class UpdateNotBeyondLower(InvalidUsage):
    """An update's time is before its batch's `lower` (persist's `UpdateNotBeyondLower`)."""


class UpdateBeyondUpper(InvalidUsage):
    """An update's time is not before its batch's `upper`."""


def check_bounds(table: pa.Table, lower: Frontier, upper: Frontier) -> None:
    """Every update's time is in `[lower, upper)`, and the bounds are not empty.

    Raises:
        InvalidUsage: `lower >= upper`.
        UpdateNotBeyondLower: a time `< lower`.
        UpdateBeyondUpper: a time `>= upper`.
    """
    if lower.is_empty or not lower.less_than(upper):
        raise InvalidUsage(f"batch bounds [{lower}, {upper}) are empty")
    if table.num_rows == 0:
        return
    bounds = pc.min_max(table.column(TIME))
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if not lower.less_equal_time(low):
        raise UpdateNotBeyondLower(f"update at time {low} is before the batch lower {lower}")
    if upper.less_equal_time(high):
        raise UpdateBeyondUpper(f"update at time {high} is not before the batch upper {upper}")


def encode_part(table: pa.Table, metadata: dict[str, str]) -> bytes:
    """Parquet bytes of a part, with `metadata` (bounds, partition, writer) in its footer."""
    buf = io.BytesIO()
    meta = {k.encode(): v.encode() for k, v in metadata.items()}
    pq.write_table(table.replace_schema_metadata(meta), buf, compression="zstd")
    return buf.getvalue()


def decode_part(data: bytes, row_schema: pa.Schema) -> pa.Table:
    """The updates of a part, in the part schema of `row_schema`."""
    table = pq.read_table(io.BytesIO(data))
    return normalize_updates(table.replace_schema_metadata(None), row_schema)


def consolidate_at(table: pa.Table, row_schema: pa.Schema, as_of: Frontier) -> pa.Table:
    """The collection at frontier `as_of`: the updates with time `< as_of`, with diffs summed per
    `(row, err)` and zero sums dropped, every time advanced to `as_of - 1` (the last time before
    the frontier; for the closed frontier `{}`, the largest time present). Rows come in no
    particular order."""
    if table.num_rows == 0:
        return table
    if as_of.time is not None and not pc.max(table.column(TIME)).as_py() < as_of.time:
        table = table.filter(pc.less(table.column(TIME), as_of.time))  # copy only if needed
        if table.num_rows == 0:
            return table
    last = as_of.time - 1 if as_of.time is not None else pc.max(table.column(TIME)).as_py()
    return consolidate(advance_times(table, last + 1, last), row_schema)


def merge_updates(table: pa.Table, row_schema: pa.Schema, advance_before: Frontier) -> pa.Table:
    """The updates of a merged batch from its inputs' (`MergeRequest.advance_before`): every
    time before `advance_before` advanced to the last time before it (for `{}`, the largest time
    present), then diffs summed per `(row, err, time)`, zero sums dropped. The contents at every
    frontier `>= advance_before` are unchanged (invariant 5 of `mvsink.shard.state`)."""
    if table.num_rows == 0:
        return table
    before = advance_before.time
    if before is None:
        before = pc.max(table.column(TIME)).as_py() + 1
    return consolidate(advance_times(table, before, before - 1), row_schema)

"""Staged parts: update tables (`mvsink.core.updates`) checked against their batch bounds, encoded as
Parquet, and consolidated for readers and merges. Everything here is vectorised Arrow; nothing
loops over rows in Python."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mvsink.core.errors import InvalidUsage
from mvsink.core.frontier import Frontier
from mvsink.core.updates import TIME, advance_times, consolidate, normalize_updates


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
    """Parquet bytes of a part (zstd), with `metadata` (bounds, partition, writer) in its
    footer; its columns dictionary-encoded as `dictionary_columns` judges."""
    buf = io.BytesIO()
    meta = {k.encode(): v.encode() for k, v in metadata.items()}
    pq.write_table(
        table.replace_schema_metadata(meta),
        buf,
        compression="zstd",
        use_dictionary=dictionary_columns(table),
    )
    return buf.getvalue()


#: Rows of a part whose values `dictionary_columns` looks at.
DICTIONARY_SAMPLE = 1024


def dictionary_columns(table: pa.Table) -> bool | list[str]:
    """Which columns of a part to dictionary-encode: those whose first `DICTIONARY_SAMPLE` rows
    repeat values (at most half of them distinct), as a list; True (all, Parquet's default)
    when every column does, or the schema is nested. A column of mostly distinct values (a
    view's key) gains nothing from a dictionary: Arrow builds one as large as the column (up to
    its 1 MiB page limit) and writes indices besides, so a plain key column makes parts smaller
    and cheaper to encode. A part's rows come in the order received or consolidated, not
    sorted, so its first rows are as good a sample as any."""
    if any(pa.types.is_nested(f.type) for f in table.schema) or table.num_rows == 0:
        return True
    sample = table.slice(0, DICTIONARY_SAMPLE)
    repeating = [
        name
        for name in table.column_names
        if 2 * pc.count_distinct(sample.column(name), mode="all").as_py() <= sample.num_rows
    ]
    return True if len(repeating) == table.num_columns else repeating


def decode_part(data: bytes, row_schema: pa.Schema) -> pa.Table:
    """The updates of a part, in the part schema of `row_schema`. Read as one file
    (`ParquetFile`), not through `read_table`'s dataset layer, which adds CPU to every part."""
    table = pq.ParquetFile(pa.BufferReader(data)).read()
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


def footer_metadata(tail: bytes) -> dict[bytes, bytes] | None:
    """The key-value metadata of a Parquet file's footer from the file's last bytes `tail`
    (`Shard.stage` writes a part's bounds there), or None if `tail` does not hold all of the
    footer (read more). Raises `pa.ArrowException` for bytes that are no Parquet footer."""
    if len(tail) < 8 or tail[-4:] != b"PAR1":
        raise pa.ArrowInvalid("not the end of a Parquet file")
    length = int.from_bytes(tail[-8:-4], "little")
    if length + 8 > len(tail):
        return None
    # The reader wants a file: the leading magic and the footer are all it reads of it.
    metadata = pq.read_metadata(pa.BufferReader(b"PAR1" + tail[-(length + 8) :])).metadata
    return dict(metadata or {})

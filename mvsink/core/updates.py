"""Update tables: the columns every update carries besides the row, and the functions on whole
tables of updates that the shard, the write tasks, the producer and the wire codec share.

An update table has the sink's row columns (nullable: error updates have no row) plus
`_time int64`, `_diff int64` and `_err string` (null for a row update; set, with null row
columns, for an error update). The same table is a staged part's content (Parquet, in
`mvsink.shard.parts`), a write task's corrections, and the Arrow IPC payload of `UpdatesArrow`
(DesiredRecord v2): `updates_to_ipc` writes it, `updates_from_ipc` is the one reader and checks
it against the sink's row schema. Everything here is vectorised Arrow; nothing loops over rows.

This module sits below `mvsink.core.messages` and `mvsink.shard` (it imports neither).
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.compute as pc

from mvsink.core.errors import ContractError, DecodeError, InvalidUsage
from mvsink.core.frontier import MAX_TIME

#: Columns every update carries besides the row columns.
TIME, DIFF, ERR = "_time", "_diff", "_err"
RESERVED = (TIME, DIFF, ERR)


def check_row_schema(schema: pa.Schema) -> None:
    """A row schema must not use the reserved column names."""
    clash = [name for name in schema.names if name in RESERVED]
    if clash:
        raise ContractError(f"row schema uses reserved column names {clash}")


def part_schema(row_schema: pa.Schema) -> pa.Schema:
    """The schema of a part: the row columns (nullable: error updates have no row) plus
    `_time int64`, `_diff int64`, `_err string`."""
    fields = [f.with_nullable(True) for f in row_schema]
    return pa.schema(
        [
            *fields,
            pa.field(TIME, pa.int64(), False),
            pa.field(DIFF, pa.int64(), False),
            pa.field(ERR, pa.string(), True),
        ]
    )


def normalize_updates(updates: pa.Table | pa.RecordBatch, row_schema: pa.Schema) -> pa.Table:
    """The updates as a table of the part schema: row columns cast to the shard's types, `_err`
    added as nulls if absent, columns in schema order.

    Raises:
        InvalidUsage: a missing column, an uncastable type, or a null `_time`/`_diff`.
    """
    table = pa.Table.from_batches([updates]) if isinstance(updates, pa.RecordBatch) else updates
    target = part_schema(row_schema)
    columns = []
    for field in target:
        if field.name in table.column_names:
            column = table.column(field.name)
        elif field.name == ERR:
            column = pa.nulls(table.num_rows, pa.string())
        else:
            raise InvalidUsage(f"updates lack column {field.name!r} (have {table.column_names})")
        try:
            columns.append(column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise InvalidUsage(f"column {field.name!r} is not {field.type}: {error}") from error
    for name in (TIME, DIFF):
        if table.column(name).null_count:
            raise InvalidUsage(f"updates have null {name}")
    return pa.Table.from_arrays(columns, schema=target)


def updates_to_ipc(table: pa.Table, compression: str | None = "lz4") -> bytes:
    """`table` (part schema) as one Arrow IPC stream, buffers compressed with `compression`."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


#: The most bytes one desired record may decode to (`[sink] max_record_bytes`): an Arrow IPC
#: payload compresses well, and a few kilobytes of zstd can stand for gigabytes of zeros.
MAX_RECORD_BYTES = 256 * 1024 * 1024


#: What the flatbuffer readers below read from: bytes, or a view of an Arrow buffer.
Bytes = bytes | memoryview


def ipc_decoded_size(ipc: bytes) -> tuple[int, int]:
    """The rows and bytes the record and dictionary batches of Arrow IPC stream `ipc` decode
    to, read from each message's metadata and the uncompressed length Arrow writes before each
    compressed buffer: nothing is decompressed or allocated.

    Raises:
        DecodeError: not an Arrow IPC stream, or metadata that does not parse.
    """
    rows = size = 0
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(ipc))
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            if message.type not in ("record batch", "dictionary"):
                continue
            # Read in place: the body is most of the record, and this runs on every one.
            body = b"" if message.body is None else memoryview(message.body)
            batch_rows, batch_size = _batch_size(
                memoryview(message.metadata), body, message.type == "dictionary"
            )
            rows, size = rows + batch_rows, size + batch_size
    except (pa.ArrowException, OSError, struct.error, IndexError, ValueError) as error:
        raise DecodeError(f"UpdatesArrow payload is not an Arrow IPC stream: {error!r}") from error
    return rows, size


def _batch_size(meta: Bytes, body: Bytes, dictionary: bool) -> tuple[int, int]:
    """Rows and decoded bytes of one IPC message (its flatbuffer `Message` `meta`, and `body`):
    `Message.header` is a `RecordBatch` (or a `DictionaryBatch` whose `data` is one), with its
    row count `length`, its `buffers` (offset, length) in the body and, when compressed, each
    buffer's uncompressed length as its first 8 bytes (-1: stored uncompressed)."""
    header = _field_table(meta, _root(meta), 2)
    batch = _field_table(meta, header, 1) if dictionary else header
    length = _field(meta, batch, 0)
    rows = 0 if length is None else struct.unpack_from("<q", meta, length)[0]
    compressed = _field(meta, batch, 3) is not None
    vector, size = _field(meta, batch, 2), 0
    if vector is not None:
        vector += struct.unpack_from("<I", meta, vector)[0]
        for i in range(struct.unpack_from("<I", meta, vector)[0]):
            offset, stored = struct.unpack_from("<qq", meta, vector + 4 + 16 * i)
            if compressed and stored >= 8:
                raw = struct.unpack_from("<q", body, offset)[0]
                size += stored - 8 if raw == -1 else raw
            else:
                size += stored
    if rows < 0 or size < 0:
        raise ValueError(f"negative rows {rows} or size {size}")
    return rows, size


def _root(buf: Bytes) -> int:
    """Where a flatbuffer's root table starts."""
    return int(struct.unpack_from("<I", buf, 0)[0])


def _field(buf: Bytes, table: int, index: int) -> int | None:
    """Where field `index` of the flatbuffer table at `table` is stored, None if absent."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    slot = 4 + 2 * index
    if slot >= struct.unpack_from("<H", buf, vtable)[0]:
        return None
    offset = struct.unpack_from("<H", buf, vtable + slot)[0]
    return None if offset == 0 else table + offset


def _field_table(buf: Bytes, table: int, index: int) -> int:
    """The table field `index` of the table at `table` refers to."""
    at = _field(buf, table, index)
    if at is None:
        raise ValueError(f"flatbuffer table at {table} has no field {index}")
    return at + int(struct.unpack_from("<I", buf, at)[0])


def updates_from_ipc(
    ipc: bytes, row_schema: pa.Schema, max_bytes: int = MAX_RECORD_BYTES
) -> pa.Table:
    """The updates of an `UpdatesArrow` payload as a table of the part schema of `row_schema`.

    Raises:
        DecodeError: not an Arrow IPC stream (whatever reading it raises), one that decodes to
            more than `max_bytes` (checked before anything is decompressed,
            `ipc_decoded_size`), a column twice or a column the rows do not have (refused, not
            trimmed: rows differing only there would merge), columns that do not fit the row
            schema, or updates `check_updates` refuses.
    """
    rows, size = ipc_decoded_size(ipc)
    if size > max_bytes:
        raise DecodeError(
            f"UpdatesArrow payload of {len(ipc):,} bytes decodes to {size:,} bytes ({rows:,} "
            f"rows), over the limit of {max_bytes:,} (`[sink] max_record_bytes`)"
        )
    try:
        table = pa.ipc.open_stream(ipc).read_all()
    except Exception as error:  # ArrowInvalid, OSError, MemoryError, ...: all bad input
        raise DecodeError(f"UpdatesArrow payload is not an Arrow IPC stream: {error!r}") from error
    names = table.column_names
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DecodeError(f"UpdatesArrow payload has columns more than once: {twice}")
    unknown = sorted(set(names) - set(part_schema(row_schema).names))
    if unknown:
        raise DecodeError(f"UpdatesArrow payload has columns the sink's rows do not: {unknown}")
    try:
        table = normalize_updates(table, row_schema)
    except (InvalidUsage, pa.ArrowException) as error:
        raise DecodeError(f"UpdatesArrow payload does not fit the sink's rows: {error}") from error
    check_updates(table, row_schema, "UpdatesArrow payload")
    return table


def check_updates(table: pa.Table, row_schema: pa.Schema, what: str) -> None:
    """Refuse (`DecodeError`, naming `what`) updates of the part schema with a `_time` outside
    `[0, 2^63)`, a zero `_diff`, or a row update (null `_err`) with a null in a non-nullable row
    column: every desired wire form is checked the same."""
    if table.num_rows == 0:
        return
    times, diffs = table.column(TIME), table.column(DIFF)
    if pc.min(times).as_py() < 0 or pc.max(times).as_py() > MAX_TIME:
        raise DecodeError(f"{what} has a _time outside [0, 2^63)")
    if not pc.all(pc.not_equal(diffs, 0)).as_py():
        raise DecodeError(f"{what} has a zero _diff")
    ok = pc.is_null(table.column(ERR))
    for field in row_schema:
        if not field.nullable and pc.any(pc.and_(ok, pc.is_null(table.column(field.name)))).as_py():
            raise DecodeError(f"{what} has a row update with null {field.name!r}")


def describe_ipc(ipc: bytes) -> str:
    """A one-line summary of an `UpdatesArrow` payload for humans (`mvsink inspect`)."""
    try:
        rows, size = ipc_decoded_size(ipc)
    except DecodeError as error:
        return f"<{len(ipc)} bytes, not Arrow IPC: {error}>"
    if size > MAX_RECORD_BYTES:
        return f"<{len(ipc):,} bytes decoding to {size:,} bytes ({rows:,} rows): not decoded>"
    try:
        table = pa.ipc.open_stream(ipc).read_all()
    except (pa.ArrowInvalid, OSError) as error:
        return f"<{len(ipc)} bytes, not Arrow IPC: {error}>"
    head = table.slice(0, 3).to_pylist()
    more = f", ... {table.num_rows - 3} more" if table.num_rows > 3 else ""
    return f"{table.num_rows} rows, {len(ipc)} bytes: {head}{more}"


def consolidate(table: pa.Table, row_schema: pa.Schema) -> pa.Table:
    """Sum diffs per `(row, err, time)` and drop zero sums (rows in no particular order)."""
    if table.num_rows == 0:
        return table
    # Row updates (null `_err`, nearly all of them) are grouped without the `_err` key: an
    # all-null string key makes Arrow's group-by several times slower.
    keys = [*row_schema.names, TIME]
    errors = table.column(ERR)
    if errors.null_count == table.num_rows:
        return _group(table, keys, row_schema)
    is_ok = pc.is_null(errors)
    return pa.concat_tables(
        [
            _group(table.filter(is_ok), keys, row_schema),
            _group(table.filter(pc.invert(is_ok)), [*keys, ERR], row_schema),
        ]
    )


def _group(table: pa.Table, keys: list[str], row_schema: pa.Schema) -> pa.Table:
    # Single-threaded: on the few cores a sink process gets, Arrow's threaded hash aggregation
    # costs more than it saves.
    schema = part_schema(row_schema)
    if table.num_rows == 0:
        return schema.empty_table()
    bounds = pc.min_max(table.column(TIME))
    single_time = bounds["min"].as_py() == bounds["max"].as_py()
    if single_time:  # the usual case after times were advanced to a frontier: one key fewer
        keys = [k for k in keys if k != TIME]
    summed = table.group_by(keys, use_threads=False).aggregate([(DIFF, "sum")])
    if single_time:
        summed = summed.append_column(TIME, pa.repeat(bounds["min"], summed.num_rows))
    summed = summed.filter(pc.not_equal(summed.column(f"{DIFF}_sum"), 0))
    columns = {
        name: summed.column(f"{DIFF}_sum" if name == DIFF else name).cast(schema.field(name).type)
        if name in keys or name in (DIFF, TIME)
        else pa.nulls(summed.num_rows, schema.field(name).type)
        for name in schema.names
    }
    return pa.table(columns, schema=schema)


def advance_times(table: pa.Table, before: int, to: int) -> pa.Table:
    """`table` with every `_time < before` replaced by `to` (a no-op copy is avoided)."""
    if table.num_rows == 0 or pc.min(table.column(TIME)).as_py() >= before:
        return table
    times = table.column(TIME)
    advanced = pc.if_else(pc.less(times, before), pa.scalar(to, pa.int64()), times)
    index = table.schema.get_field_index(TIME)
    return table.set_column(index, table.schema.field(index), advanced)  # keeps `not null`

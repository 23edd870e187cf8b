"""Rows of a sink: the row schema (Arrow) and its Avro form, the encoded row.

Contract (docs/design.md §3.1): an update's row travels as Avro binary under `avro_row_schema(schema)`
of the sink's Arrow row schema (the v1 `Updates` wire form, and the key of partitioning version
1, `mvsink.core.partitioning`).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import fastavro
import pyarrow as pa

from mvsink.core.errors import ContractError
from mvsink.core.updates import DIFF, ERR, TIME, check_updates, part_schema

if TYPE_CHECKING:
    from mvsink.core.messages import Updates

_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int32": pa.int32(),
    "int": pa.int32(),
    "int64": pa.int64(),
    "long": pa.int64(),
    "double": pa.float64(),
    "float64": pa.float64(),
    "float": pa.float32(),
    "float32": pa.float32(),
    "bool": pa.bool_(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "bytes": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
}


def parse_row_schema(text: str) -> pa.Schema:
    """Parse `"name type[ not null], ..."` (types: string, int32, int64/long, float, double,
    bool, binary, date, timestamp) into an Arrow schema.

    Raises:
        ConfigError: naming the column that does not parse.
    """
    from mvsink.core.errors import ConfigError

    fields = []
    for column in (c.strip() for c in text.split(",")):
        words = column.split()
        nullable = not (len(words) == 4 and [w.lower() for w in words[2:]] == ["not", "null"])
        if len(words) not in (2, 4) or (len(words) == 4 and nullable):
            raise ConfigError(
                f"row schema column {column!r}: use 'name type' or 'name type not null'"
            )
        name, type_name = words[0], words[1].lower()
        if type_name not in _TYPES:
            raise ConfigError(f"row schema column {column!r}: unknown type (use {sorted(_TYPES)})")
        fields.append(pa.field(name, _TYPES[type_name], nullable))
    return pa.schema(fields)


def _avro_type(arrow_type: pa.DataType) -> Any:
    if pa.types.is_boolean(arrow_type):
        return "boolean"
    if (
        pa.types.is_int8(arrow_type)
        or pa.types.is_int16(arrow_type)
        or pa.types.is_int32(arrow_type)
    ):
        return "int"
    if pa.types.is_int64(arrow_type):
        return "long"
    if pa.types.is_float32(arrow_type):
        return "float"
    if pa.types.is_float64(arrow_type):
        return "double"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "bytes"
    if pa.types.is_date32(arrow_type):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_timestamp(arrow_type) and arrow_type.unit == "us":
        return {"type": "long", "logicalType": "timestamp-micros"}
    raise ContractError(f"row column type {arrow_type} has no Avro mapping in mvsink")


def avro_row_schema(schema: pa.Schema, name: str = "Row") -> dict[str, Any]:
    """The Avro record schema of rows of the Arrow `schema` (nullable fields become
    `["null", T]`)."""
    fields = []
    for field in schema:
        avro = _avro_type(field.type)
        fields.append({"name": field.name, "type": ["null", avro] if field.nullable else avro})
    return {"type": "record", "name": name, "namespace": "mvsink.rows", "fields": fields}


def row_encoder(schema: pa.Schema) -> Callable[[dict[str, Any]], bytes]:
    """A function encoding one row (a dict of column values) as Avro binary."""
    parsed = fastavro.parse_schema(avro_row_schema(schema), named_schemas={})

    def encode(row: dict[str, Any]) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, row)
        return buf.getvalue()

    return encode


def row_decoder(schema: pa.Schema) -> Callable[[bytes], dict[str, Any]]:
    """A function decoding one Avro-encoded row; corrupt bytes raise `DecodeError`."""
    from mvsink.core.errors import DecodeError

    parsed = fastavro.parse_schema(avro_row_schema(schema), named_schemas={})

    def decode(data: bytes) -> dict[str, Any]:
        try:
            return cast(dict[str, Any], fastavro.schemaless_reader(io.BytesIO(data), parsed, None))
        except Exception as error:  # corrupt row bytes in an otherwise valid record
            raise DecodeError(
                f"row is not valid Avro for the sink's row schema: {error!r}"
            ) from error

    return decode


def updates_decoder(schema: pa.Schema) -> Callable[[Updates], pa.Table]:
    """A function decoding a v1 `Updates` record (one Avro row per update, decoded row by row)
    into a table of the part schema; v2 `UpdatesArrow` is `updates.updates_from_ipc`."""
    decode_row = row_decoder(schema)
    nullable = pa.schema([f.with_nullable(True) for f in schema])  # error rows
    target = part_schema(schema)

    def decode(record: Updates) -> pa.Table:
        rows = [decode_row(u.row) if u.row is not None else {} for u in record.updates]
        table = pa.Table.from_pylist(rows, schema=nullable)
        table = table.append_column(TIME, pa.array([u.time for u in record.updates], pa.int64()))
        table = table.append_column(DIFF, pa.array([u.diff for u in record.updates], pa.int64()))
        table = table.append_column(ERR, pa.array([u.err for u in record.updates], pa.string()))
        table = table.cast(target)
        check_updates(table, schema, "Updates record")
        return table

    return decode

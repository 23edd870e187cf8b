"""Avro codecs for the records of docs/design.md §3.1: one module maps `schemas/` to `mvsink.core.messages`.

Two wire formats, both always read. mvsink's own, the default::

    byte 0      MAGIC (0x6D, 'm')
    byte 1      record kind (see `KINDS`: which schema family)
    byte 2      schema version of the writer (the `vN` in `schemas/<Kind>/vN.avsc`)
    bytes 3..   Avro binary of the record, written with that schema

and the Confluent Schema Registry's, written where a registry is configured
(`mvsink.io.registry`), so generic tools (Kafka Connect, ksqlDB, Flink, kcat) decode it::

    byte 0      REGISTRY_MAGIC (0x00)
    bytes 1..4  the writer schema's id in the registry, big-endian
    bytes 5..   Avro binary of the record, written with that schema

A registry-framed value does not say its kind and version itself: the reader maps the id to one
of `schemas/` through the registry (a `SchemaLookup`, `match_schema`), or, with no registry at
hand, trusts the `SCHEMA_HEADER` every mvsink producer sets (`schema_of_header`).

Readers always decode with the *latest* version of the kind's schema as reader schema and the
writer's version (from the header) as writer schema, so records written by any version kept in
`schemas/` stay readable (Avro schema resolution). Versions are never edited once released: a
change adds `v(N+1).avsc` with defaults for new fields.

Decoding never raises anything but `DecodeError`; `decode_message` adds topic, partition and
offset so the record can be quarantined and found again.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import fastavro

from mvsink.core.errors import DecodeError, MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.messages import (
    BatchDescription,
    BatchId,
    DesiredProgress,
    Part,
    Progress,
    Record,
    RepairedPartition,
    ShardUpper,
    SinkControl,
    SinkDefinition,
    SinkRepair,
    StagedBatch,
    Update,
    Updates,
    UpdatesArrow,
)

MAGIC = 0x6D
HEADER_LEN = 3
REGISTRY_MAGIC = 0x00
REGISTRY_HEADER_LEN = 5
#: Kafka header naming the schema of a value, for humans and generic tools (kcat).
SCHEMA_HEADER = "mvsink-schema"

#: Record kind id -> schema family (folder under `schemas/`). Ids are part of the contract.
KINDS: Mapping[int, str] = {
    1: "DesiredRecord",
    2: "DesiredProgress",
    3: "ShardUpper",
    4: "BatchDescription",
    5: "StagedBatch",
    6: "SinkControl",
    7: "SinkRepair",
    8: "SinkDefinition",
}
_KIND_IDS = {name: kind for kind, name in KINDS.items()}


def _schemas_dir() -> Traversable:
    """`schemas/` beside the package: a folder, or inside the zip a Spark driver shipped to its
    executors (`mvsink.io.spark.code_zip`)."""
    root = Path(__file__).resolve().parents[2]
    return zipfile.Path(root, "schemas/") if zipfile.is_zipfile(root) else root / "schemas"


SCHEMAS_DIR = _schemas_dir()

T = TypeVar("T")
#: The schema version a registry's schema id stands for (`mvsink.io.registry`).
SchemaLookup = Callable[[int], "SchemaVersion"]


@dataclass(frozen=True)
class SchemaVersion:
    """One released version of a record kind's schema."""

    kind: str
    version: int
    path: Traversable
    parsed: Any


@cache
def schema_versions(kind: str) -> tuple[SchemaVersion, ...]:
    """All released versions of `kind`, oldest first."""
    folder = SCHEMAS_DIR / kind
    found: list[SchemaVersion] = []
    for path in folder.iterdir() if folder.is_dir() else ():
        if not (path.name.startswith("v") and path.name.endswith(".avsc")):
            continue
        version = int(path.name[1:].removesuffix(".avsc"))
        parsed = fastavro.parse_schema(json.loads(path.read_text()), named_schemas={})
        found.append(SchemaVersion(kind, version, path, parsed))
    if not found:
        raise MvsinkError(f"no schema versions for {kind} under {folder}")
    return tuple(sorted(found, key=lambda v: v.version))


def latest(kind: str) -> SchemaVersion:
    """The current (reader and writer) version of `kind`."""
    return schema_versions(kind)[-1]


def schema_text(version: SchemaVersion) -> str:
    """The released schema as JSON text, as it is registered in a Schema Registry."""
    return version.path.read_text()


@cache
def _canonical_versions() -> Mapping[str, SchemaVersion]:
    found: dict[str, SchemaVersion] = {}
    for kind in KINDS.values():
        for version in schema_versions(kind):
            found[fastavro.schema.to_parsing_canonical_form(version.parsed)] = version
    return found


def match_schema(text: str) -> SchemaVersion:
    """The released version whose schema is `text` (compared in Avro's parsing canonical form,
    so a registry's reformatting or dropped docs do not matter).

    Raises:
        DecodeError: `text` is not Avro, or not one of `schemas/`.
    """
    try:
        canonical = fastavro.schema.to_parsing_canonical_form(
            fastavro.parse_schema(json.loads(text), named_schemas={})
        )
    except Exception as error:  # fastavro and json raise many types for bad schemas
        raise DecodeError(f"registered schema is not Avro: {error!r}") from error
    found = _canonical_versions().get(canonical)
    if found is None:
        raise DecodeError("the registered writer schema is none of mvsink's (schemas/)")
    return found


def schema_of_header(value: str) -> SchemaVersion:
    """The version a `SCHEMA_HEADER` value (`Kind/vN`) names.

    Raises:
        DecodeError: a value of another form, or a kind or version this reader does not know.
    """
    kind, _, version = value.partition("/v")
    if kind not in _KIND_IDS or not version.isdigit():
        raise DecodeError(f"{SCHEMA_HEADER} {value!r} names no mvsink schema")
    return _writer_version(kind, int(version))


def _writer_version(kind: str, version: int) -> SchemaVersion:
    for candidate in schema_versions(kind):
        if candidate.version == version:
            return candidate
    raise DecodeError(f"{kind} schema version {version} is unknown to this reader")


# -- record <-> Avro datum ----------------------------------------------------------------------


def _frontier(elements: list[int]) -> Frontier:
    return Frontier.from_elements(elements)


def _batch_id(datum: Mapping[str, Any]) -> BatchId:
    return BatchId(epoch=datum["epoch"], seq=datum["seq"])


def _id_datum(batch_id: BatchId) -> dict[str, int]:
    return {"epoch": batch_id.epoch, "seq": batch_id.seq}


def _part_datum(part: Part) -> dict[str, Any]:
    return {
        "key": part.key,
        "partition": part.partition,
        "partitions_total": part.partitions_total,
        "updates": part.updates,
        "bytes": part.bytes,
        "partitioning": part.partitioning,
    }


def to_datum(record: Record) -> tuple[str, Any]:
    """The record's kind and its Avro datum (for the latest schema)."""
    match record:
        case Updates(updates=updates):
            rows = [{"row": u.row, "err": u.err, "time": u.time, "diff": u.diff} for u in updates]
            return "DesiredRecord", ("mvsink.Updates", {"updates": rows})
        case UpdatesArrow(ipc=ipc, partitioning=partitioning):
            return "DesiredRecord", (
                "mvsink.UpdatesArrow",
                {"ipc": ipc, "partitioning": partitioning},
            )
        case Progress(frontier=frontier):
            return "DesiredRecord", ("mvsink.Progress", {"frontier": frontier.elements()})
        case DesiredProgress():
            datum = {
                "sink_id": record.sink_id,
                "partition": record.partition,
                "frontier": record.frontier.elements(),
            }
            return "DesiredProgress", datum
        case ShardUpper():
            datum = {
                "shard_id": record.shard_id,
                "upper": record.upper.elements(),
                "seqno": record.seqno,
            }
            return "ShardUpper", datum
        case BatchDescription():
            datum = {
                "sink_id": record.sink_id,
                "id": _id_datum(record.id),
                "lower": record.lower.elements(),
                "upper": record.upper.elements(),
                "append_worker": record.append_worker,
            }
            return "BatchDescription", datum
        case StagedBatch():
            datum = {
                "desc_id": _id_datum(record.desc_id),
                "lower": record.lower.elements(),
                "upper": record.upper.elements(),
                "covers": list(record.covers),
                "parts": [_part_datum(p) for p in record.parts],
                "writer_id": record.writer_id,
            }
            return "StagedBatch", datum
        case SinkControl(read_only=read_only):
            return "SinkControl", {"read_only": read_only}
        case SinkRepair():
            datum = {
                "sink_id": record.sink_id,
                "shard_id": record.shard_id,
                "repaired_by": record.repaired_by,
                "at_ms": record.at_ms,
                "shard_upper": record.shard_upper.elements(),
                "shard_since": record.shard_since.elements(),
                "partitions": [
                    {
                        "partition": p.partition,
                        "frontier": p.frontier.elements(),
                        "folded_offset": p.folded_offset,
                        "log_start": p.log_start,
                        "version": p.version,
                        "replaced": p.replaced,
                        "ahead": p.ahead,
                    }
                    for p in record.partitions
                ],
            }
            return "SinkRepair", datum
        case SinkDefinition():
            return "SinkDefinition", {
                name: getattr(record, name) for name in SinkDefinition.__dataclass_fields__
            }
    raise TypeError(f"not an mvsink record: {record!r}")


def from_datum(kind: str, datum: Any) -> Record:
    """Build and validate the record of `kind` from an Avro datum of its latest schema."""
    match kind:
        case "DesiredRecord":
            name, body = datum
            if name == "mvsink.Progress":
                return Progress(_frontier(body["frontier"]))
            if name == "mvsink.UpdatesArrow":
                return UpdatesArrow(body["ipc"], body["partitioning"])
            return Updates(tuple(Update(**u) for u in body["updates"]))
        case "DesiredProgress":
            return DesiredProgress(
                datum["sink_id"], datum["partition"], _frontier(datum["frontier"])
            )
        case "ShardUpper":
            return ShardUpper(datum["shard_id"], _frontier(datum["upper"]), datum["seqno"])
        case "BatchDescription":
            return BatchDescription(
                sink_id=datum["sink_id"],
                id=_batch_id(datum["id"]),
                lower=_frontier(datum["lower"]),
                upper=_frontier(datum["upper"]),
                append_worker=datum["append_worker"],
            )
        case "StagedBatch":
            return StagedBatch(
                desc_id=_batch_id(datum["desc_id"]),
                lower=_frontier(datum["lower"]),
                upper=_frontier(datum["upper"]),
                covers=tuple(datum["covers"]),
                parts=tuple(Part(**p) for p in datum["parts"]),
                writer_id=datum["writer_id"],
            )
        case "SinkControl":
            return SinkControl(read_only=datum["read_only"])
        case "SinkRepair":
            return SinkRepair(
                sink_id=datum["sink_id"],
                shard_id=datum["shard_id"],
                repaired_by=datum["repaired_by"],
                at_ms=datum["at_ms"],
                shard_upper=_frontier(datum["shard_upper"]),
                shard_since=_frontier(datum["shard_since"]),
                partitions=tuple(
                    RepairedPartition(**{**p, "frontier": _frontier(p["frontier"])})
                    for p in datum["partitions"]
                ),
            )
        case "SinkDefinition":
            return SinkDefinition(**datum)
    raise DecodeError(f"unknown record kind {kind!r}")


# -- bytes ----------------------------------------------------------------------------------------


def encode_with(record: Record, version: SchemaVersion) -> bytes:
    """Encode `record` with a specific schema version (tests of old versions use this)."""
    kind, datum = to_datum(record)
    if kind != version.kind:
        raise TypeError(f"{type(record).__name__} is a {kind}, not a {version.kind}")
    return encode_datum(kind, datum, version)


def encode_datum(kind: str, datum: Any, version: SchemaVersion) -> bytes:
    """Frame and encode a raw Avro datum of `kind` under `version`."""
    buf = io.BytesIO()
    buf.write(bytes((MAGIC, _KIND_IDS[kind], version.version)))
    fastavro.schemaless_writer(buf, version.parsed, datum)
    return buf.getvalue()


def encode_registered(record: Record, schema_id: int) -> bytes:
    """Encode `record` with the latest version of its schema in the Schema Registry wire format,
    `schema_id` being that version's id in the registry (`mvsink.io.registry`)."""
    kind, datum = to_datum(record)
    buf = io.BytesIO()
    buf.write(bytes((REGISTRY_MAGIC,)))
    buf.write(schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(buf, latest(kind).parsed, datum)
    return buf.getvalue()


def registered_id(data: bytes) -> int | None:
    """The schema id of a registry-framed value, None for any other."""
    if len(data) < REGISTRY_HEADER_LEN or data[0] != REGISTRY_MAGIC:
        return None
    return int.from_bytes(data[1:REGISTRY_HEADER_LEN], "big")


def encode(record: Record) -> bytes:
    """Encode `record` with the latest version of its schema, framed (see module docs)."""
    kind, _ = to_datum(record)
    return encode_with(record, latest(kind))


def schema_header(record: Record) -> str:
    """Value of the `SCHEMA_HEADER` Kafka header for `record`, e.g. `ShardUpper/v1`."""
    kind, _ = to_datum(record)
    return f"{kind}/v{latest(kind).version}"


def decode_datum(
    data: bytes, lookup: SchemaLookup | None = None, header: str | None = None
) -> tuple[str, Any]:
    """Decode framed bytes (either format) to `(kind, datum)` resolved to the latest schema.

    A registry-framed value's writer schema is `lookup(id)` where a lookup is given, else the
    version `header` (the message's `SCHEMA_HEADER`) names.

    Raises:
        DecodeError: bad frame, unknown kind, version or schema id, or bytes that are not valid
            Avro.
    """
    schema_id = registered_id(data)
    if schema_id is not None:
        if lookup is not None:
            writer = lookup(schema_id)
        elif header is not None:
            writer = schema_of_header(header)
        else:
            raise DecodeError(
                f"a Schema Registry framed record (schema id {schema_id}) without an "
                f"{SCHEMA_HEADER} header: set schema_registry_url to read it"
            )
        start = REGISTRY_HEADER_LEN
    elif len(data) >= HEADER_LEN and data[0] == MAGIC:
        kind = KINDS.get(data[1])
        if kind is None:
            raise DecodeError(f"unknown record kind id {data[1]}")
        writer = _writer_version(kind, data[2])
        start = HEADER_LEN
    else:
        raise DecodeError(f"not an mvsink record (first bytes {data[:HEADER_LEN]!r})")
    return writer.kind, _read_datum(data, start, writer)


def _read_datum(data: bytes, start: int, writer: SchemaVersion) -> Any:
    kind = writer.kind
    reader = latest(kind)
    buf = io.BytesIO(data)
    buf.seek(start)
    try:
        datum = fastavro.schemaless_reader(
            buf,
            writer.parsed,
            None if writer is reader else reader.parsed,
            return_record_name=True,
        )
    except Exception as error:  # fastavro raises many types for corrupt input
        raise DecodeError(f"{kind}/v{writer.version}: invalid Avro: {error!r}") from error
    if buf.tell() != len(data):
        raise DecodeError(f"{kind}/v{writer.version}: {len(data) - buf.tell()} trailing bytes")
    return datum


def decode(
    data: bytes,
    expect: type[T] | tuple[type, ...] | None = None,
    lookup: SchemaLookup | None = None,
    header: str | None = None,
) -> Record:
    """Decode framed bytes into a validated record.

    Args:
        data: a value produced by `encode` or `encode_registered`.
        expect: if given, the record type(s) acceptable here; any other is a `DecodeError`.
        lookup, header: how a registry-framed value's schema is found (`decode_datum`).

    Raises:
        DecodeError: undecodable bytes, a record violating its contract, or an unexpected type.
    """
    kind, datum = decode_datum(data, lookup, header)
    try:
        record = from_datum(kind, datum)
    except MvsinkError as error:
        if isinstance(error, DecodeError):
            raise
        raise DecodeError(f"{kind}: {error}") from error
    except (KeyError, TypeError, ValueError) as error:
        raise DecodeError(f"{kind}: malformed datum: {error!r}") from error
    if expect is not None and not isinstance(record, expect):
        raise DecodeError(f"expected {_names(expect)}, got {type(record).__name__}")
    return record


class KafkaMessage(Protocol):
    """The parts of `confluent_kafka.Message` the codec needs."""

    def value(self) -> bytes | None: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def headers(self) -> Any: ...


def message_schema_header(message: KafkaMessage) -> str | None:
    """The message's `SCHEMA_HEADER` value, if it has one."""
    for name, value in message.headers() or ():
        if name == SCHEMA_HEADER and value is not None:
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return None


def decode_message(
    message: KafkaMessage,
    expect: type[T] | tuple[type, ...] | None = None,
    lookup: SchemaLookup | None = None,
) -> Record:
    """`decode` a Kafka message's value (a registry-framed one's schema by `lookup`, else by its
    `SCHEMA_HEADER`); errors carry its topic, partition and offset."""
    try:
        value = message.value()
        if value is None:
            raise DecodeError("null value (tombstone)")
        header = message_schema_header(message) if registered_id(value) is not None else None
        return decode(value, expect, lookup, header)
    except DecodeError as error:
        raise error.located(
            cast(str, message.topic()), cast(int, message.partition()), cast(int, message.offset())
        ) from error


def _names(expect: type | tuple[type, ...]) -> str:
    types = expect if isinstance(expect, tuple) else (expect,)
    return " | ".join(t.__name__ for t in types)

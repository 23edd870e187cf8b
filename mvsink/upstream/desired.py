"""Reading the desired collection back from its topic (docs/design.md §3.1): one decoder for
every record a desired partition holds, used by the write tasks as they fold desired, and a
reader of the whole collection as of a time, for tools that check a shard against it from
outside the services (`mvsink compose verify`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, Message, TopicPartition

from mvsink.core.errors import DecodeError, MvsinkError
from mvsink.core.messages import Progress, Updates, UpdatesArrow
from mvsink.core.rows import updates_decoder
from mvsink.core.updates import (
    MAX_RECORD_BYTES,
    TIME,
    advance_times,
    consolidate,
    part_schema,
    updates_from_ipc,
)
from mvsink.io.kafka import NO_RESET, READ_TO_END, consumer_config, decode_message, poll_message
from mvsink.io.registry import Framing, RegistryError


def decode_desired(
    message: Message,
    row_schema: pa.Schema,
    decode_rows: Callable[[Updates], pa.Table],
    partitioning: int | None,
    framing: Framing,
    max_bytes: int = MAX_RECORD_BYTES,
) -> Progress | pa.Table:
    """A desired record: its `Progress`, or its updates as a table (Arrow IPC or Avro rows,
    decoded by `decode_rows = updates_decoder(row_schema)`); a registry-framed record's schema
    id looked up through `framing`; Arrow IPC that decodes to more than `max_bytes` refused
    before it is decompressed (`updates_from_ipc`).

    Raises:
        DecodeError: a record that does not decode, whatever decoding it raises (a record that
            fails the same way at every attempt must be quarantined, not retried forever), or
            updates partitioned by another function than `partitioning` (unchecked if None):
            they are in the wrong partition for it.
    """
    try:
        return _decode_desired(message, row_schema, decode_rows, partitioning, framing, max_bytes)
    except (DecodeError, RegistryError):  # a registry out of reach is not the record's fault
        raise
    except Exception as error:  # any other failure to decode is the record's
        raise DecodeError(f"desired record does not decode: {error!r}") from error


def _decode_desired(
    message: Message,
    row_schema: pa.Schema,
    decode_rows: Callable[[Updates], pa.Table],
    partitioning: int | None,
    framing: Framing,
    max_bytes: int,
) -> Progress | pa.Table:
    record = decode_message(message, (UpdatesArrow, Updates, Progress), framing=framing)
    if isinstance(record, Progress):
        return record
    used = record.partitioning if isinstance(record, UpdatesArrow) else 1
    if partitioning is not None and used != partitioning:
        raise DecodeError(
            f"updates partitioned with function {used}, but the sink uses {partitioning}: "
            f"publish with partitioning {partitioning}, or set MVSINK_PARTITIONING={used} for "
            "a desired topic written that way (schemas/README.md)"
        )
    if isinstance(record, UpdatesArrow):
        return updates_from_ipc(record.ipc, row_schema, max_bytes)
    return decode_rows(cast(Updates, record))


def read_desired(
    bootstrap: str,
    topic: str,
    partitions: int,
    row_schema: pa.Schema,
    as_of: int,
    timeout: float = 60.0,
    *,
    framing: Framing,
) -> pa.Table:
    """The desired collection at `as_of`: every committed update with a time before `as_of`,
    read to the end of each partition, with times advanced to `as_of` and consolidated. A caller must know that
    desired's progress passed `as_of` (e.g. a shard's upper: nothing is minted before it).
    Raises `MvsinkError` if the partitions are not all read to their end within `timeout`, or
    if records of a partition were deleted (its log start is past 0: the collection is no
    longer on the topic alone)."""
    consumer = Consumer(consumer_config(bootstrap, extra={**READ_TO_END, **NO_RESET}))
    decode_rows = updates_decoder(row_schema)
    tables: list[pa.Table] = []
    try:
        for p in range(partitions):
            low, _ = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=timeout, cached=False
            )
            if low > 0:
                raise MvsinkError(
                    f"{topic}[{p}]: records below offset {low} were deleted, so "
                    "the desired collection cannot be read from the topic alone"
                )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ended: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(ended) < partitions:
            if time.monotonic() > deadline:
                raise MvsinkError(
                    f"reading {topic} to its end took over {timeout}s "
                    f"(partitions at their end: {sorted(ended)})"
                )
            message = poll_message(consumer, 0.5, on_eof=ended.add)
            if message is None:
                continue
            decoded = decode_desired(message, row_schema, decode_rows, None, framing)
            if isinstance(decoded, pa.Table) and decoded.num_rows:
                tables.append(decoded.filter(pc.less(decoded.column(TIME), as_of)))
    finally:
        consumer.close()
    if not tables:
        return part_schema(row_schema).empty_table()
    return consolidate(advance_times(pa.concat_tables(tables), as_of, as_of), row_schema)

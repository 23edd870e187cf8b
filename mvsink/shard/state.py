"""Shard state versions as data: immutable models and the pure functions that change them.

A state version is what `state/<seqno:020d>` holds (JSON). A change is computed by a pure
function from the previous version (`apply_append`), in the manner of a commit-as-data table
format: the I/O shell (`mvsink.shard.store`) only reads a version, calls the function, and
writes the result conditionally.

Invariants of a chain of versions `0, 1, 2, ...` (checked by `apply_append`):

1. `seqno` increases by exactly one from a version to the next;
2. `upper` never regresses, and an append moves it from exactly `expected_upper`;
3. every batch in `batches` has `lower < upper`, batches are contiguous in time
   (each batch's `lower` is the previous batch's `upper`, gaps allowed only where the upper was
   advanced without data), and a part key appears at most once in the whole chain;
4. `since <= upper` (this version never advances `since`; compaction will).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from mvsink.errors import InvalidUsage, MvsinkError
from mvsink.frontier import Frontier
from mvsink.messages import Part, StagedBatch
from mvsink.updates import check_row_schema

FORMAT = 1


class SchemaMismatch(MvsinkError):
    """The shard exists with another row schema than the caller's."""


@dataclass(frozen=True, slots=True)
class PartRef:
    """A staged Parquet part as the state records it.

    `partition`/`partitions_total` are the desired partition all its rows hash to, under P =
    `partitions_total`; both `None` for a part of unknown partitioning (a foreign writer).
    """

    key: str
    lower: Frontier
    upper: Frontier
    writer_id: str
    updates: int
    bytes: int
    partition: int | None = None
    partitions_total: int | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form inside a state version."""
        return {
            "key": self.key,
            "lower": self.lower.elements(),
            "upper": self.upper.elements(),
            "writer_id": self.writer_id,
            "updates": self.updates,
            "bytes": self.bytes,
            "partition": self.partition,
            "partitions_total": self.partitions_total,
        }

    def to_message(self) -> Part:
        """The `Part` record that travels in a `StagedBatch` (bounds and writer go in the batch)."""
        return Part(self.key, self.partition, self.partitions_total, self.updates, self.bytes)

    @classmethod
    def from_transmittable(cls, part: Part, batch: StagedBatch) -> PartRef:
        """The part as staged, from its `StagedBatch` (the seed's
        `batch_from_transmittable_batch`)."""
        return cls(part.key, batch.lower, batch.upper, batch.writer_id, part.updates, part.bytes,
                   part.partition, part.partitions_total)  # fmt: skip

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PartRef:
        """Inverse of `to_json`."""
        return cls(
            key=raw["key"],
            lower=Frontier.from_elements(raw["lower"]),
            upper=Frontier.from_elements(raw["upper"]),
            writer_id=raw["writer_id"],
            updates=raw["updates"],
            bytes=raw["bytes"],
            partition=raw["partition"],
            partitions_total=raw["partitions_total"],
        )


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One appended batch: its bounds, the version that appended it, and its parts."""

    lower: Frontier
    upper: Frontier
    seqno: int
    parts: tuple[PartRef, ...]

    def to_json(self) -> dict[str, Any]:
        """JSON form inside a state version."""
        return {
            "lower": self.lower.elements(),
            "upper": self.upper.elements(),
            "seqno": self.seqno,
            "parts": [p.to_json() for p in self.parts],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> BatchRecord:
        """Inverse of `to_json`."""
        return cls(
            lower=Frontier.from_elements(raw["lower"]),
            upper=Frontier.from_elements(raw["upper"]),
            seqno=raw["seqno"],
            parts=tuple(PartRef.from_json(p) for p in raw["parts"]),
        )


@dataclass(frozen=True)
class ShardState:
    """One version of a shard's state.

    `batches` holds every batch with data (empty appends only move `upper` and are not kept);
    `appended` is the batch this very version appended (possibly without parts), `None` for
    version 0. `nonce` makes the bytes of every written version unique to its writer's attempt,
    so a retried conditional create can be recognised as its own (see `mvsink.s3`).
    """

    shard_id: str
    seqno: int
    upper: Frontier
    since: Frontier
    schema: pa.Schema
    batches: tuple[BatchRecord, ...] = ()
    appended: BatchRecord | None = None
    nonce: str = ""
    _part_keys: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        keys = frozenset(p.key for b in self.batches for p in b.parts)
        object.__setattr__(self, "_part_keys", keys)

    @property
    def part_keys(self) -> frozenset[str]:
        """Keys of every part this version references."""
        return self._part_keys

    def parts(self) -> list[PartRef]:
        """Every part this version references, in append order."""
        return [p for b in self.batches for p in b.parts]

    def total_bytes(self) -> int:
        """Sum of the referenced parts' sizes."""
        return sum(p.bytes for p in self.parts())

    def total_updates(self) -> int:
        """Sum of the referenced parts' update counts."""
        return sum(p.updates for p in self.parts())

    # -- serialisation ----------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """The JSON document stored at `state/<seqno>`."""
        document = {
            "format": FORMAT,
            "shard_id": self.shard_id,
            "seqno": self.seqno,
            "upper": self.upper.elements(),
            "since": self.since.elements(),
            "schema": schema_to_json(self.schema),
            "batches": [b.to_json() for b in self.batches],
            "appended": None if self.appended is None else self.appended.to_json(),
            "nonce": self.nonce,
        }
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ShardState:
        """Parse a stored state version.

        Raises:
            MvsinkError: not a state document of a format this code reads.
        """
        try:
            raw = json.loads(data)
            if raw.get("format") != FORMAT:
                raise MvsinkError(f"shard state format {raw.get('format')!r} is not {FORMAT}")
            return cls(
                shard_id=raw["shard_id"],
                seqno=raw["seqno"],
                upper=Frontier.from_elements(raw["upper"]),
                since=Frontier.from_elements(raw["since"]),
                schema=schema_from_json(raw["schema"]),
                batches=tuple(BatchRecord.from_json(b) for b in raw["batches"]),
                appended=None
                if raw["appended"] is None
                else BatchRecord.from_json(raw["appended"]),
                nonce=raw["nonce"],
            )
        except (KeyError, TypeError, ValueError) as error:
            raise MvsinkError(f"corrupt shard state document: {error!r}") from error


def initial_state(shard_id: str, schema: pa.Schema, nonce: str) -> ShardState:
    """Version 0: `upper = since = {0}`, no batches."""
    check_row_schema(schema)
    return ShardState(shard_id, 0, Frontier.minimum(), Frontier.minimum(), schema, nonce=nonce)


def apply_append(
    state: ShardState,
    parts: tuple[PartRef, ...],
    expected_upper: Frontier,
    new_upper: Frontier,
    nonce: str,
) -> ShardState:
    """The version after appending `parts` as one batch `[expected_upper, new_upper)`.

    The caller has checked `state.upper == expected_upper` (a mismatch is an expected outcome,
    not an error). Raises `InvalidUsage` for anything that could never be appended.
    """
    if state.upper != expected_upper:
        raise InvalidUsage(f"apply_append on upper {state.upper}, expected {expected_upper}")
    if not expected_upper.less_than(new_upper):
        raise InvalidUsage(f"append bounds [{expected_upper}, {new_upper}) are empty")
    for part in parts:
        if (part.lower, part.upper) != (expected_upper, new_upper):
            raise InvalidUsage(
                f"part {part.key} was staged for [{part.lower}, {part.upper}), "
                f"not [{expected_upper}, {new_upper})"
            )
    keys = [p.key for p in parts]
    if len(set(keys)) != len(keys) or state.part_keys & set(keys):
        raise InvalidUsage(f"a part is appended twice: {sorted(keys)}")
    batch = BatchRecord(expected_upper, new_upper, state.seqno + 1, parts)
    batches = (*state.batches, batch) if parts else state.batches
    return replace(
        state, seqno=state.seqno + 1, upper=new_upper, batches=batches, appended=batch, nonce=nonce
    )


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """Readable field list plus the exact Arrow IPC form."""
    return {
        "fields": [[f.name, str(f.type), f.nullable] for f in schema],
        "arrow_ipc": base64.b64encode(schema.serialize().to_pybytes()).decode(),
    }


def schema_from_json(raw: dict[str, Any]) -> pa.Schema:
    """Inverse of `schema_to_json`."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw["arrow_ipc"])))


def same_schema(a: pa.Schema, b: pa.Schema) -> bool:
    """Whether two row schemas are the same (names, types, nullability; metadata ignored)."""
    return bool(a.remove_metadata().equals(b.remove_metadata()))

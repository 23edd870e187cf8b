"""The records of docs/design.md §3.1 as frozen dataclasses that validate on construction.

A message that exists is a valid message: constructors raise `ContractError` naming the record
and the offending field, so a bad record is rejected at the edge (decode) and never travels
further. `mvsink.core.codec` maps these to and from the Avro schemas in `schemas/`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mvsink.core.errors import ContractError
from mvsink.core.frontier import MAX_TIME, Frontier
from mvsink.core.updates import describe_ipc

INT32_MAX = 2**31 - 1


def _require(condition: bool, record: object, reason: str) -> None:
    if not condition:
        raise ContractError(f"invalid {type(record).__name__}: {reason}: {record!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Update:
    """One desired update `(data, time, diff)`: `data` is `Ok(row)` or `Err(err)`.

    `row` is the row encoded as Avro binary under the sink's row schema.
    """

    row: bytes | None
    err: str | None
    time: int
    diff: int

    def __post_init__(self) -> None:
        _require((self.row is None) != (self.err is None), self, "exactly one of row/err")
        _require(_is_int(self.time) and 0 <= self.time <= MAX_TIME, self, "time outside u64")
        _require(_is_int(self.diff) and self.diff != 0, self, "diff must be a non-zero int")

    @classmethod
    def ok(cls, row: bytes, time: int, diff: int) -> Update:
        """A row update."""
        return cls(row=row, err=None, time=time, diff=diff)

    @classmethod
    def error(cls, err: str, time: int, diff: int) -> Update:
        """An error update (the seed's `DataflowError` stream)."""
        return cls(row=None, err=err, time=time, diff=diff)


@dataclass(frozen=True, slots=True)
class Updates:
    """A chunk of updates for one desired partition."""

    updates: tuple[Update, ...]

    def __post_init__(self) -> None:
        _require(isinstance(self.updates, tuple), self, "updates must be a tuple")


@dataclass(frozen=True, slots=True)
class Progress:
    """In-band progress: no update with `time < frontier` follows on this partition."""

    frontier: Frontier


@dataclass(frozen=True, slots=True)
class UpdatesArrow:
    """A chunk of updates for one desired partition as one Arrow IPC stream (DesiredRecord v2).

    The columns are the sink's row columns (nullable), `_err`, `_time` and `_diff`; what they must
    hold is checked against the sink's row schema by `mvsink.core.updates.updates_from_ipc`, the one
    decoder, because only the sink knows its schema. `partitioning` names the function that
    chose the record's partition (`mvsink.core.partitioning`; v3, absent in v2 records: 1).
    """

    ipc: bytes
    partitioning: int = 1

    def __post_init__(self) -> None:
        _require(isinstance(self.ipc, bytes) and bool(self.ipc), self, "empty ipc payload")
        _require(_is_int(self.partitioning) and self.partitioning >= 1, self, "partitioning")

    def __repr__(self) -> str:
        return f"UpdatesArrow({describe_ipc(self.ipc)})"


#: A record of `<sink>.desired`.
DesiredRecord = Updates | UpdatesArrow | Progress


@dataclass(frozen=True, slots=True)
class DesiredProgress:
    """Progress of desired partition `partition` of sink `sink_id` (`frontiers` topic)."""

    sink_id: str
    partition: int
    frontier: Frontier

    def __post_init__(self) -> None:
        _require(bool(self.sink_id), self, "empty sink_id")
        _require(_is_int(self.partition) and 0 <= self.partition <= INT32_MAX, self, "partition")

    @property
    def key(self) -> str:
        """The compacted `frontiers` key."""
        return desired_progress_key(self.sink_id, self.partition)


@dataclass(frozen=True, slots=True)
class ShardUpper:
    """The upper of shard `shard_id` at state version `seqno` (`frontiers` topic)."""

    shard_id: str
    upper: Frontier
    seqno: int

    def __post_init__(self) -> None:
        _require(bool(self.shard_id), self, "empty shard_id")
        _require(_is_int(self.seqno) and 0 <= self.seqno <= MAX_TIME, self, "seqno")

    @property
    def key(self) -> str:
        """The compacted `frontiers` key."""
        return shard_upper_key(self.shard_id)


@dataclass(frozen=True, slots=True, order=True)
class BatchId:
    """Identity of a batch description: minting epoch, then sequence within the epoch."""

    epoch: int
    seq: int

    def __post_init__(self) -> None:
        _require(_is_int(self.epoch) and 0 <= self.epoch <= MAX_TIME, self, "epoch")
        _require(_is_int(self.seq) and 0 <= self.seq <= MAX_TIME, self, "seq")

    def __str__(self) -> str:
        return f"{self.epoch}.{self.seq}"


def _require_bounds(record: object, lower: Frontier, upper: Frontier) -> None:
    _require(not lower.is_empty, record, "lower is the empty frontier")
    _require(lower.less_than(upper), record, f"lower {lower} is not less than upper {upper}")


@dataclass(frozen=True, slots=True)
class BatchDescription:
    """A batch to write for times in `[lower, upper)`, appended by worker `append_worker`."""

    sink_id: str
    id: BatchId
    lower: Frontier
    upper: Frontier
    append_worker: int

    def __post_init__(self) -> None:
        _require(bool(self.sink_id), self, "empty sink_id")
        _require_bounds(self, self.lower, self.upper)
        _require(
            _is_int(self.append_worker) and 0 <= self.append_worker <= INT32_MAX,
            self,
            "append_worker",
        )

    def __str__(self) -> str:
        return f"desc {self.id} [{self.lower}, {self.upper}) -> append {self.append_worker}"


@dataclass(frozen=True, slots=True)
class Part:
    """One staged Parquet part as a `StagedBatch` carries it (its bounds and writer are the
    batch's; `mvsink.shard.state.PartRef` is the part with them). `partition` is `None` for a
    foreign writer's part; its rows all hash to `partition` under P = `partitions_total` and
    function `partitioning` (`mvsink.core.partitioning`; StagedBatch v2, absent in v1 records: 1).
    """

    key: str
    partition: int | None
    partitions_total: int | None
    updates: int
    bytes: int
    partitioning: int = 1

    def __post_init__(self) -> None:
        _require(bool(self.key), self, "empty key")
        _require((self.partition is None) == (self.partitions_total is None), self, "partition")
        if self.partition is not None and self.partitions_total is not None:
            _require(0 <= self.partition < self.partitions_total, self, "partition out of range")
        _require(_is_int(self.updates) and self.updates >= 0, self, "updates")
        _require(_is_int(self.bytes) and self.bytes >= 0, self, "bytes")
        _require(_is_int(self.partitioning) and self.partitioning >= 1, self, "partitioning")


@dataclass(frozen=True, slots=True)
class StagedBatch:
    """Parts staged by writer `writer_id` for description `desc_id`, complete for `covers`."""

    desc_id: BatchId
    lower: Frontier
    upper: Frontier
    covers: tuple[int, ...]
    parts: tuple[Part, ...]
    writer_id: str

    def __post_init__(self) -> None:
        _require_bounds(self, self.lower, self.upper)
        _require(bool(self.writer_id), self, "empty writer_id")
        _require(all(_is_int(p) and p >= 0 for p in self.covers), self, "covers")
        _require(len(set(self.covers)) == len(self.covers), self, "covers has duplicates")
        covered = set(self.covers)
        _require(
            all(part.partition is None or part.partition in covered for part in self.parts),
            self,
            "a part's partition is not in covers",
        )


@dataclass(frozen=True, slots=True)
class SinkControl:
    """Operator control of a sink replica (`<sink>.control`, key = sink id)."""

    read_only: bool = field(default=False)

    def __post_init__(self) -> None:
        _require(isinstance(self.read_only, bool), self, "read_only must be a bool")


@dataclass(frozen=True, slots=True)
class RepairedPartition:
    """Where one desired partition continues after a repair (`SinkRepair`)."""

    partition: int
    #: Trusted: the shard's contents before it are taken as desired's.
    frontier: Frontier
    folded_offset: int
    log_start: int
    version: int
    #: The checkpoint version replaced (-1: none).
    replaced: int
    #: Updates kept as corrections (read before `folded_offset`, at times `>= frontier`).
    ahead: int

    def __post_init__(self) -> None:
        _require(self.partition >= 0, self, "partition must be >= 0")
        _require(self.frontier.time is not None, self, "the trusted frontier must not be closed")
        _require(
            min(self.folded_offset, self.log_start, self.version, self.ahead) >= 0,
            self,
            "offsets, versions and counts must be >= 0",
        )


@dataclass(frozen=True, slots=True)
class SinkRepair:
    """An operator's re-seeding of a sink's checkpoints from its shard (`mvsink repair`), on
    `<sink>.control` under key `repair:<sink>`: an audit record no service acts on."""

    sink_id: str
    shard_id: str
    repaired_by: str
    at_ms: int
    shard_upper: Frontier
    shard_since: Frontier
    partitions: tuple[RepairedPartition, ...]

    @property
    def key(self) -> str:
        """Its key on `<sink>.control` (not the sink id: a repair is no control record)."""
        return f"repair:{self.sink_id}"


@dataclass(frozen=True, slots=True)
class SinkDefinition:
    """A sink as data (the `sinks` topic, key = sink id): the settings every replica of the
    sink must share. `provision` and `mvsink sink create` write it, `mvsink sink drop` writes it
    `dropped`; a service whose settings disagree with it, or of a dropped sink, refuses to
    start."""

    sink_id: str
    shard_id: str
    partitions: int
    append_workers: int
    partitioning: int
    as_of: int
    retain_history: int
    frontiers_topic: str
    #: The row schema as configured (`name type, ...`); empty: the shard's.
    row_schema: str
    #: The writing process (host and pid), for people.
    defined_by: str
    at_ms: int
    #: No replica serves the sink (`mvsink sink drop`); provisioning defines it again.
    dropped: bool = False

    def __post_init__(self) -> None:
        _require(bool(self.sink_id) and bool(self.shard_id), self, "ids must not be empty")
        _require(isinstance(self.dropped, bool), self, "dropped must be a bool")
        _require(bool(self.frontiers_topic), self, "frontiers_topic must not be empty")
        _require(
            all(_is_int(n) and 1 <= n <= INT32_MAX for n in (self.partitions, self.append_workers)),
            self,
            "partitions and append_workers must be in [1, 2^31)",
        )
        _require(_is_int(self.partitioning) and self.partitioning >= 1, self, "partitioning >= 1")
        _require(_is_int(self.as_of) and 0 <= self.as_of <= MAX_TIME, self, "as_of outside u64")
        _require(_is_int(self.retain_history) and self.retain_history >= 0, self, "retain_history")


#: Every record type that travels on our topics.
Record = (
    Updates
    | UpdatesArrow
    | Progress
    | DesiredProgress
    | ShardUpper
    | BatchDescription
    | StagedBatch
    | SinkControl
    | SinkRepair
    | SinkDefinition
)


def desired_progress_key(sink_id: str, partition: int) -> str:
    """`frontiers` key of a desired partition's progress."""
    return f"desired:{sink_id}:{partition}"


def shard_upper_key(shard_id: str) -> str:
    """`frontiers` key of a shard's upper."""
    return f"persist:{shard_id}"


def frontier_keys(sink_id: str, partitions: int, shard_id: str) -> frozenset[bytes]:
    """The `frontiers` keys one sink's services follow: its desired partitions' progress and its
    shard's upper. The topic is shared by every sink of a cluster, so a follower reading it from
    the start skips the others' records by key instead of decoding them."""
    desired = (desired_progress_key(sink_id, p).encode() for p in range(partitions))
    return frozenset([*desired, shard_upper_key(shard_id).encode()])

"""The desired producer: how an upstream pipeline publishes the collection a sink must keep the
shard equal to (`<sink>.desired` + desired progress in `frontiers`, docs/design.md §3.1).

* `send(updates)`: an Arrow table of `(row columns..., _time, _diff[, _err])`; each update is
  hashed to its desired partition (`mvsink.core.partitioning.partitions_of`, under the sink's
  `partitioning`) and the updates of a partition go out in chunks: `UpdatesArrow` records
  (DesiredRecord v3, one Arrow IPC stream each stamped with the partitioning, the default
  `wire="arrow"`), or `Updates` records with one Avro row per update (`wire="avro"`, the v1
  form, for readers older than v2; partitioning 1 only).
* `advance_to(frontier)`: writes `Progress(frontier)` in-band on every desired partition and
  `DesiredProgress` to `frontiers` for every partition, and commits everything sent since the
  last advance in one Kafka transaction. Readers use `read_committed`, so a crash before the
  commit publishes nothing of it.
* Updates at a time before the frontier already advanced to are refused, and so is a frontier
  that moves back (`ContractError`, `publishable` and `check_advance`, which
  `mvsink.upstream.publish` applies too): the in-band contract is that after `Progress(f)` no
  update with `time < f` follows.

With partitioning 2 nothing here touches rows one by one: the hash runs on the Arrow columns,
the table is sorted by partition once and sliced, and each slice is one IPC stream.
Partitioning 1 encodes every row as Avro to hash it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer

from mvsink.core.errors import ContractError
from mvsink.core.frontier import Frontier, meet_all
from mvsink.core.messages import (
    DesiredProgress,
    Progress,
    Update,
    Updates,
    UpdatesArrow,
    desired_progress_key,
)
from mvsink.core.partitioning import partition_keys, partition_of, partitions_of, split_by_partition
from mvsink.core.updates import DIFF, ERR, TIME, normalize_updates, updates_to_ipc
from mvsink.io.config import Config
from mvsink.io.kafka import client_config, init_transactions, produce, read_compacted

log = logging.getLogger("mvsink.upstream.producer")
#: Upper bound on one record's bytes: below Kafka's default `message.max.bytes` (1 MiB).
MAX_RECORD_BYTES = 900_000
#: Updates in one desired record at most.
CHUNK = 20_000
#: Column holding the Avro-encoded row (the partition key) while v1 `Updates` are built.
_AVRO_ROW = "_avro_row"


class DesiredProducer:
    """Publishes the desired changelog of one sink. Not thread-safe; one per upstream.

    `producer_id` is the Kafka `transactional.id`: a second producer with the same id fences
    the first, so a restarted upstream never interleaves with its dead predecessor.
    """

    def __init__(
        self,
        config: Config,
        row_schema: pa.Schema,
        producer_id: str,
        chunk: int = CHUNK,
        wire: str = "arrow",
    ) -> None:
        if wire not in ("arrow", "avro"):
            raise ContractError(f"desired wire form {wire!r}: use 'arrow' (v2) or 'avro' (v1)")
        if wire == "avro" and config.partitioning != 1:
            raise ContractError(
                "the v1 wire form (wire='avro') implies partitioning 1: use "
                f"wire='arrow' or partitioning 1, not {config.partitioning}"
            )
        self.config = config
        self.framing = config.framing()
        self.producer_id = producer_id
        self.row_schema = row_schema
        self.chunk = chunk
        self.wire = wire
        self.producer = Producer(
            client_config(
                config.kafka_bootstrap, **{"transactional.id": producer_id, "linger.ms": 20}
            )
        )
        self.frontier = Frontier.minimum()
        self.in_transaction = False
        #: `publish_dataframe`'s task keys by (desired partitions, publishing tasks), asked of
        #: Spark once per pair (`mvsink.upstream.publish._task_keys`).
        self.task_keys: dict[tuple[int, int], list[int]] = {}

    def start(self) -> Frontier:
        """Fence predecessors and restore the frontier from `frontiers`; the frontier. Waits on
        Kafka at most the config's `kafka_call_timeout`."""
        init_transactions(self.producer, self.config.kafka_call_timeout)
        latest = read_compacted(
            self.config.kafka_bootstrap, self.config.topics.frontiers, framing=self.framing
        )
        mine = [
            record.frontier
            for p in range(self.config.partitions)
            if isinstance(
                record := latest.get(desired_progress_key(self.config.sink_id, p)), DesiredProgress
            )
        ]
        if len(mine) == self.config.partitions:
            self.frontier = meet_all(mine)
        log.info("desired producer for %s at frontier %s", self.config.sink_id, self.frontier)
        return self.frontier

    def send(self, updates: pa.Table) -> int:
        """Queue `updates` in the current transaction; the number queued (zero diffs dropped).

        Raises:
            ContractError: an update before the current frontier, or columns that do not fit.
        """
        records, count = self.records(updates)
        if records:
            self._begin()
        for partition, record in records:
            topic = self.config.topics.desired
            produce(self.producer, topic, str(partition), record, partition, framing=self.framing)
        return count

    def records(self, updates: pa.Table) -> tuple[list[tuple[int, Updates | UpdatesArrow]], int]:
        """What `send` would produce for `updates`: `(partition, record)` in order, and the
        number of updates (zero diffs dropped). Benchmarks use it to publish the same bytes to
        several systems.

        Raises:
            ContractError: an update before the current frontier, or columns that do not fit.
        """
        normalized = normalize_updates(updates, self.row_schema)
        table = publishable(normalized, self.frontier, self.config.sink_id)
        if table.num_rows == 0:
            return [], 0
        if self.wire == "avro":  # v1 sends the Avro rows it hashes
            keys = partition_keys(table, self.row_schema)
            table = table.append_column(_AVRO_ROW, pa.array(keys, pa.binary()))
            partitions = pa.array(
                [partition_of(k, self.config.partitions) for k in keys], pa.int32()
            )
        else:
            partitions = partitions_of(
                table, self.row_schema, self.config.partitions, self.config.partitioning
            )
        records = [
            (partition, record)
            for partition, rows in split_by_partition(table, partitions, self.config.partitions)
            for record in self._records(rows)
        ]
        return records, int(table.num_rows)

    def progress(
        self, frontier: Frontier
    ) -> list[tuple[str, int | None, Progress | DesiredProgress]]:
        """What `advance_to(frontier)` produces: `(topic, partition, record)` in order."""
        topics = self.config.topics
        out: list[tuple[str, int | None, Progress | DesiredProgress]] = []
        for partition in range(self.config.partitions):
            out.append((topics.desired, partition, Progress(frontier)))
            out.append(
                (topics.frontiers, None, DesiredProgress(self.config.sink_id, partition, frontier))
            )
        return out

    def _records(self, table: pa.Table) -> list[Updates | UpdatesArrow]:
        """The updates of one partition in records of at most `chunk` updates and about
        `MAX_RECORD_BYTES`."""
        if self.wire == "arrow":
            return list(arrow_records(table, self.config.partitioning, self.chunk))
        out: list[Updates | UpdatesArrow] = []
        for start in range(0, table.num_rows, self.chunk):
            out.extend(self._avro_record(table.slice(start, self.chunk)))
        return out

    def _avro_record(self, table: pa.Table) -> list[Updates | UpdatesArrow]:
        updates = tuple(self._avro_updates(table))
        if sum(len(u.row or b"") + 24 for u in updates) <= MAX_RECORD_BYTES or len(updates) == 1:
            return [Updates(updates)]
        half = table.num_rows // 2
        return [*self._avro_record(table.slice(0, half)), *self._avro_record(table.slice(half))]

    def _avro_updates(self, table: pa.Table) -> list[Update]:
        columns = zip(
            table.column(_AVRO_ROW).to_pylist(),
            table.column(ERR).to_pylist(),
            table.column(TIME).to_pylist(),
            table.column(DIFF).to_pylist(),
            strict=True,
        )
        return [
            Update.ok(row, time_, diff) if err is None else Update.error(err, time_, diff)
            for row, err, time_, diff in columns
        ]

    def advance_to(self, frontier: Frontier) -> None:
        """Declare every time before `frontier` complete and commit the transaction (waiting at
        most the config's `kafka_call_timeout`).

        Raises:
            ContractError: `frontier` is before the current one.
        """
        check_advance(self.frontier, frontier)
        self._begin()
        for topic, partition, record in self.progress(frontier):
            key = str(partition) if isinstance(record, Progress) else record.key
            produce(self.producer, topic, key, record, partition, framing=self.framing)
        self.producer.commit_transaction(self.config.kafka_call_timeout)
        self.in_transaction = False
        self.frontier = frontier

    def _begin(self) -> None:
        if not self.in_transaction:
            self.producer.begin_transaction()
            self.in_transaction = True


def publishable(table: pa.Table, frontier: Frontier, sink_id: str) -> pa.Table:
    """The updates of `table` (part schema) a producer at `frontier` may publish for sink
    `sink_id`: all of them but the zero diffs, which change nothing.

    Raises:
        ContractError: an update at a time before `frontier` (`Progress(frontier)` is published:
            no update before it may follow).
    """
    nonzero = pc.not_equal(table.column(DIFF), 0)
    if not pc.all(nonzero).as_py():  # a copy of every column: only when there are zeros
        table = table.filter(nonzero)
    if table.num_rows == 0:
        return table
    low = pc.min(table.column(TIME)).as_py()
    if not frontier.less_equal_time(low):
        raise ContractError(
            f"update at time {low} is before the frontier {frontier} of sink {sink_id}: it was "
            "already advanced past"
        )
    return table


def check_advance(current: Frontier, frontier: Frontier) -> None:
    """Refuse to move a producer's frontier from `current` back to `frontier`.

    Raises:
        ContractError: `frontier` is before `current`.
    """
    if not current.less_equal(frontier):
        raise ContractError(f"cannot move the frontier back from {current} to {frontier}")


def arrow_records(table: pa.Table, partitioning: int, chunk: int = CHUNK) -> Iterator[UpdatesArrow]:
    """The updates of one desired partition (part schema) as `UpdatesArrow` records of at most
    `chunk` updates and about `MAX_RECORD_BYTES`, stamped with `partitioning`."""

    def split(part: pa.Table) -> Iterator[UpdatesArrow]:
        record = UpdatesArrow(updates_to_ipc(part), partitioning)
        if len(record.ipc) <= MAX_RECORD_BYTES or part.num_rows == 1:
            yield record
            return
        half = part.num_rows // 2
        yield from split(part.slice(0, half))
        yield from split(part.slice(half))

    for start in range(0, table.num_rows, chunk):
        yield from split(table.slice(start, chunk))

"""The desired producer: how an upstream pipeline publishes the collection a sink must keep the
shard equal to (`<sink>.desired` + desired progress in `frontiers`, DESIGN §3.1).

* `send(updates)`: an Arrow table of `(row columns..., _time, _diff[, _err])`; each update is
  Avro-encoded under the sink's row schema and hashed to its desired partition
  (`mvsink.rows.partition_of`); updates go out in chunked `Updates` records.
* `advance_to(frontier)`: writes `Progress(frontier)` in-band on every desired partition and
  `DesiredProgress` to `frontiers` for every partition, and commits everything sent since the
  last advance in one Kafka transaction. Readers use `read_committed`, so a crash before the
  commit publishes nothing of it.
* Updates at a time before the frontier already advanced to are refused (`ContractError`): the
  in-band contract is that after `Progress(f)` no update with `time < f` follows.

Encoding is per row (the v1 wire format carries each row as Avro bytes); that is the
producer's cost, paid once per update.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer

from mvsink.config import Config
from mvsink.errors import ContractError
from mvsink.frontier import Frontier, meet_all
from mvsink.kafka import client_config, produce, read_compacted
from mvsink.messages import DesiredProgress, Progress, Update, Updates, desired_progress_key
from mvsink.rows import error_key, partition_of, row_encoder
from mvsink.shard.parts import normalize_updates
from mvsink.shard.state import DIFF, ERR, TIME

log = logging.getLogger("mvsink.producer")


class DesiredProducer:
    """Publishes the desired changelog of one sink. Not thread-safe; one per upstream.

    `producer_id` is the Kafka `transactional.id`: a second producer with the same id fences
    the first, so a restarted upstream never interleaves with its dead predecessor.
    """

    def __init__(self, config: Config, row_schema: pa.Schema, producer_id: str,
                 chunk: int = 5000) -> None:  # fmt: skip
        self.config = config
        self.row_schema = row_schema
        self.chunk = chunk
        self.encode = row_encoder(row_schema)
        self.producer = Producer(client_config(config.kafka_bootstrap, **{
            "transactional.id": producer_id, "linger.ms": 20}))  # fmt: skip
        self.frontier = Frontier.minimum()
        self.in_transaction = False

    def start(self, timeout: float = 60.0) -> Frontier:
        """Fence predecessors and restore the frontier from `frontiers`; the frontier."""
        self.producer.init_transactions(timeout)
        latest = read_compacted(self.config.kafka_bootstrap, self.config.topics.frontiers)
        mine = [
            record.frontier
            for p in range(self.config.partitions)
            if isinstance(record := latest.get(desired_progress_key(self.config.sink_id, p)),
                          DesiredProgress)
        ]  # fmt: skip
        if len(mine) == self.config.partitions:
            self.frontier = meet_all(mine)
        log.info("desired producer for %s at frontier %s", self.config.sink_id, self.frontier)
        return self.frontier

    def send(self, updates: pa.Table) -> int:
        """Queue `updates` in the current transaction; the number queued (zero diffs dropped).

        Raises:
            ContractError: an update before the current frontier, or columns that do not fit.
        """
        table = normalize_updates(updates, self.row_schema)
        table = table.filter(pc.not_equal(table.column(DIFF), 0))
        if table.num_rows == 0:
            return 0
        low = pc.min(table.column(TIME)).as_py()
        if not self.frontier.less_equal_time(low):
            raise ContractError(
                f"update at time {low} is before the frontier {self.frontier} of sink "
                f"{self.config.sink_id}: it was already advanced past"
            )
        by_partition: dict[int, list[Update]] = defaultdict(list)
        rows = table.select(self.row_schema.names).to_pylist()
        columns = zip(rows, table.column(ERR).to_pylist(), table.column(TIME).to_pylist(),
                      table.column(DIFF).to_pylist(), strict=True)  # fmt: skip
        for row, err, time_, diff in columns:
            if err is None:
                encoded = self.encode(row)
                update = Update.ok(encoded, time_, diff)
            else:
                encoded = error_key(err)
                update = Update.error(err, time_, diff)
            by_partition[partition_of(encoded, self.config.partitions)].append(update)
        self._begin()
        for partition, items in by_partition.items():
            for start in range(0, len(items), self.chunk):
                chunk = Updates(tuple(items[start : start + self.chunk]))
                produce(self.producer, self.config.topics.desired, str(partition), chunk, partition)
        return int(table.num_rows)

    def advance_to(self, frontier: Frontier, timeout: float = 60.0) -> None:
        """Declare every time before `frontier` complete and commit the transaction.

        Raises:
            ContractError: `frontier` is before the current one.
        """
        if not self.frontier.less_equal(frontier):
            raise ContractError(f"cannot move the frontier back from {self.frontier} to {frontier}")
        self._begin()
        topics = self.config.topics
        for partition in range(self.config.partitions):
            produce(self.producer, topics.desired, str(partition), Progress(frontier), partition)
            record = DesiredProgress(self.config.sink_id, partition, frontier)
            produce(self.producer, topics.frontiers, record.key, record)
        self.producer.commit_transaction(timeout)
        self.in_transaction = False
        self.frontier = frontier

    def _begin(self) -> None:
        if not self.in_transaction:
            self.producer.begin_transaction()
            self.in_transaction = True


def publish_dataframe(df: object, producer: DesiredProducer) -> int:
    """Send a Spark DataFrame of `(row columns..., _time, _diff[, _err])` through `producer`
    (collected to the driver as Arrow); the number of updates sent."""
    table = df.toArrow()  # type: ignore[attr-defined]
    return producer.send(table)

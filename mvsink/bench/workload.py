"""The generated workload of the benchmarks and its publisher: a view of `keys` rows
`(key string, value long)`; tick 0 inserts every key, each later tick changes `change` of the
keys (a retraction and an insertion each). Ticks are generated and encoded once, untimed, so
every system gets the same bytes; `Feeder` publishes a tick to a sink's desired topic with its
progress, as the upstream does.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from confluent_kafka import KafkaError, Message, Producer

from mvsink import Say
from mvsink.codec import SCHEMA_HEADER, encode, schema_header
from mvsink.config import Config
from mvsink.errors import MvsinkError
from mvsink.frontier import Frontier
from mvsink.kafka import client_config
from mvsink.messages import DesiredProgress, Progress
from mvsink.producer import DesiredProducer
from mvsink.rows import parse_row_schema

ROW_SCHEMA = "key string not null, value long"


class BenchError(MvsinkError):
    """A system under benchmark failed or stopped making progress."""


@dataclass(frozen=True)
class Workload:
    """The generated changelog (see the module docs)."""

    keys: int
    change: float
    ticks: int  # steady-state ticks after the initial load
    partitions: int
    seed: int = 1

    @property
    def changed(self) -> int:
        """Keys changed per steady-state tick."""
        return max(1, int(self.keys * self.change))

    def generate(self) -> tuple[list[pa.Table], pa.Table]:
        """The update tables of ticks 0..N and the final contents `(key, value)`."""
        rng = np.random.default_rng(self.seed)
        names = pa.array([f"key-{i}" for i in range(self.keys)], pa.string())
        values = np.ones(self.keys, dtype=np.int64)
        ticks = [_updates(names, values, 0, np.ones(self.keys, dtype=np.int64))]
        for tick in range(1, self.ticks + 1):
            chosen = rng.choice(self.keys, self.changed, replace=False)
            old = values[chosen].copy()
            values[chosen] += 1
            chosen_names = names.take(pa.array(chosen))
            retract = _updates(chosen_names, old, tick, -np.ones(len(chosen), dtype=np.int64))
            insert = _updates(
                chosen_names, values[chosen], tick, np.ones(len(chosen), dtype=np.int64)
            )
            ticks.append(pa.concat_tables([retract, insert]))
        return ticks, pa.table({"key": names, "value": values})


def _updates(names: pa.Array, values: np.ndarray, tick: int, diffs: np.ndarray) -> pa.Table:
    # A copy: Arrow would share the numpy buffer that later ticks change in place.
    return pa.table({"key": names, "value": pa.array(values.copy()), "_time": pa.array(np.full(len(values), tick)),
                     "_diff": pa.array(diffs)})  # fmt: skip


@dataclass(frozen=True)
class EncodedTick:
    """One tick as published: `(partition, framed DesiredRecord)` and the progress after it."""

    time: int
    updates: int
    records: list[tuple[int, bytes]]
    progress: bytes


def encode_ticks(
    config: Config, workload: Workload, say: Say, wire: str = "arrow"
) -> tuple[list[EncodedTick], pa.Table]:
    """Generate and encode the workload once (untimed), in desired wire form `wire`."""
    started = time.monotonic()
    tables, final = workload.generate()
    name = f"bench-encode-{uuid.uuid4().hex[:6]}"
    producer = DesiredProducer(config, parse_row_schema(ROW_SCHEMA), name, wire=wire)
    out = []
    for tick, table in enumerate(tables):
        records, count = producer.records(table)
        out.append(EncodedTick(tick, count, [(p, encode(r)) for p, r in records],
                               encode(Progress(Frontier.at(tick + 1)))))  # fmt: skip
    total = sum(t.updates for t in out)
    say(f"workload: {workload.keys:,} keys, {workload.changed:,} changed per tick "
        f"({2 * workload.changed:,} updates), {workload.ticks} ticks after the initial load; "
        f"{total:,} updates, {sum(len(v) for t in out for _, v in t.records) / 1e6:.1f} MB encoded "
        f"in {time.monotonic() - started:.1f}s")  # fmt: skip
    return out, final


class Feeder:
    """Publishes encoded ticks; returns each tick's end offsets per partition."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(client_config(bootstrap, **{"linger.ms": 5}))
        self.header: list[tuple[str, str | bytes | None]] = [
            (SCHEMA_HEADER, schema_header(Progress(Frontier.at(0))).encode())
        ]

    def feed(self, config: Config, tick: EncodedTick) -> dict[int, int]:
        ends: dict[int, int] = {}

        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is not None:
                raise BenchError(f"publishing to {message.topic()} failed: {error}")
            partition, offset = int(message.partition() or 0), int(message.offset() or 0)
            ends[partition] = max(ends.get(partition, 0), offset + 1)

        desired = config.topics.desired
        for partition, value in tick.records:
            self._produce(desired, partition, value)
        for partition in range(config.partitions):
            self._produce(desired, partition, tick.progress, delivered)
            record = DesiredProgress(config.sink_id, partition, Frontier.at(tick.time + 1))
            self.producer.produce(config.topics.frontiers, key=record.key.encode(), value=encode(record),
                                  headers=self.header)  # fmt: skip
        if self.producer.flush(60) != 0:
            raise BenchError("the broker did not take a tick within 60 s")
        return ends

    def _produce(self, topic: str, partition: int, value: bytes,
                 on_delivery: Callable[[KafkaError | None, Message], None] | None = None) -> None:  # fmt: skip
        while True:
            try:
                self.producer.produce(topic, key=str(partition).encode(), value=value, partition=partition,
                                      headers=self.header, on_delivery=on_delivery)  # fmt: skip
                return
            except BufferError:
                self.producer.poll(0.1)

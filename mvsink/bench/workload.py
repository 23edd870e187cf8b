"""The generated workload of the benchmarks and its publisher: a view of `keys` rows
`(key string, value long)`; tick 0 inserts every key, each later tick changes `change` of the
keys (a retraction and an insertion each). Ticks are generated and encoded once, untimed, so
every system gets the same bytes; `Feeder` publishes a tick to a sink's desired topic with its
progress, as the upstream does.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from mvsink import Say
from mvsink.core.codec import SCHEMA_HEADER, encode, schema_header
from mvsink.core.errors import MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.messages import DesiredProgress, Progress
from mvsink.core.rows import parse_row_schema
from mvsink.io import registry
from mvsink.io.config import Config
from mvsink.io.kafka import client_config, consumer_config
from mvsink.upstream.producer import DesiredProducer

ROW_SCHEMA = "key string not null, value long"
#: Spark 4's byte limit of an Arrow batch sent to Python, and its "no limit" (Int.MaxValue).
ARROW_MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
ARROW_UNLIMITED = 2**31 - 1
#: The upstream's warm-up stops once the JIT compiled for at most this share of a pass ...
WARM_JIT_SHARE = 0.15
#: ... or after this many passes over the ticks.
WARM_PASSES = 4


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
        names = self._names()
        values = np.ones(self.keys, dtype=np.int64)
        ticks = [_updates(names, values, 0, np.ones(self.keys, dtype=np.int64))]
        for tick, chosen in self._changes(self.ticks):
            old = values[chosen].copy()
            values[chosen] += 1
            chosen_names = names.take(pa.array(chosen))
            retract = _updates(chosen_names, old, tick, -np.ones(len(chosen), dtype=np.int64))
            insert = _updates(
                chosen_names, values[chosen], tick, np.ones(len(chosen), dtype=np.int64)
            )
            ticks.append(pa.concat_tables([retract, insert]))
        return ticks, pa.table({"key": names, "value": values})

    def view_at(self, tick: int) -> pa.Table:
        """The contents `(key, value)` once ticks 0..`tick` are applied: what a system fed
        only that far must hold (a run whose steady window was bounded by time)."""
        values = np.ones(self.keys, dtype=np.int64)
        for _, chosen in self._changes(tick):
            values[chosen] += 1
        return pa.table({"key": self._names(), "value": values})

    def _names(self) -> pa.Array:
        return pa.array([f"key-{i}" for i in range(self.keys)], pa.string())

    def _changes(self, last: int) -> Iterator[tuple[int, np.ndarray]]:
        """The keys each steady tick 1..`last` changes (the same draws for every caller)."""
        rng = np.random.default_rng(self.seed)
        for tick in range(1, last + 1):
            yield tick, rng.choice(self.keys, self.changed, replace=False)


def _updates(names: pa.Array, values: np.ndarray, tick: int, diffs: np.ndarray) -> pa.Table:
    # A copy: Arrow would share the numpy buffer that later ticks change in place.
    return pa.table(
        {
            "key": names,
            "value": pa.array(values.copy()),
            "_time": pa.array(np.full(len(values), tick)),
            "_diff": pa.array(diffs),
        }
    )


@dataclass(frozen=True)
class EncodedTick:
    """One tick as published: `(partition, framed DesiredRecord)` and the progress after it."""

    time: int
    updates: int
    records: list[tuple[int, bytes]]
    progress: bytes


@dataclass(frozen=True)
class ProducerRate:
    """How fast the desired producer turned the workload's tables into framed records
    (partitioning, sorting, IPC encoding, framing: what an upstream pays per update), and the
    same for partitioning 1 on a sample of the same run (the baseline)."""

    updates: int
    wall_s: float
    cpu_s: float
    partitioning: int
    baseline_updates: int
    baseline_cpu_s: float

    def figures(self) -> dict[str, float | int]:
        per_cpu = self.updates / self.cpu_s if self.cpu_s else 0.0
        base = self.baseline_updates / self.baseline_cpu_s if self.baseline_cpu_s else 0.0
        return {
            "producer_partitioning": self.partitioning,
            "producer_updates_per_s": round(self.updates / self.wall_s, 1) if self.wall_s else 0.0,
            "producer_updates_per_cpu_s": round(per_cpu, 1),
            "producer_v1_updates_per_cpu_s": round(base, 1),
        }


def encode_ticks(
    config: Config, workload: Workload, say: Say, wire: str = "arrow"
) -> tuple[list[EncodedTick], pa.Table]:
    """Generate and encode the workload once (untimed), in desired wire form `wire`."""
    out, final, _ = encode_ticks_timed(config, workload, say, wire)
    return out, final


def encode_ticks_timed(
    config: Config, workload: Workload, say: Say, wire: str = "arrow"
) -> tuple[list[EncodedTick], pa.Table, ProducerRate]:
    """`encode_ticks`, and how fast the producer encoded (`ProducerRate`; CPU time counts
    every thread of this process, so updates per CPU second is a rate per core)."""
    started = time.monotonic()
    tables, final = workload.generate()
    name = f"bench-encode-{uuid.uuid4().hex[:6]}"
    producer = DesiredProducer(config, parse_row_schema(ROW_SCHEMA), name, wire=wire)
    out, wall, cpu = [], 0.0, 0.0
    for tick, table in enumerate(tables):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        records, count = producer.records(table)
        framed = [(p, producer.framing.encode(config.topics.desired, r)) for p, r in records]
        wall, cpu = wall + time.perf_counter() - wall0, cpu + time.process_time() - cpu0
        progress = producer.framing.encode(config.topics.desired, Progress(Frontier.at(tick + 1)))
        out.append(EncodedTick(tick, count, framed, progress))
    total = sum(t.updates for t in out)
    sample = tables[min(1, len(tables) - 1)].slice(0, 50_000)  # partitioning 1, same rows
    v1 = DesiredProducer(replace(config, partitioning=1), parse_row_schema(ROW_SCHEMA), name)
    cpu0 = time.process_time()
    v1_records, v1_count = v1.records(sample)
    [encode(r) for _, r in v1_records]
    rate = ProducerRate(
        total,
        wall,
        cpu,
        producer.config.partitioning if wire == "arrow" else 1,
        v1_count,
        time.process_time() - cpu0,
    )
    say(
        f"workload: {workload.keys:,} keys, {workload.changed:,} changed per tick "
        f"({2 * workload.changed:,} updates), {workload.ticks} ticks after the initial load; "
        f"{total:,} updates, {sum(len(v) for t in out for _, v in t.records) / 1e6:.1f} MB encoded "
        f"in {time.monotonic() - started:.1f}s"
    )
    figures = rate.figures()
    say(
        f"producer (partitioning {rate.partitioning}): {figures['producer_updates_per_s']:,.0f} "
        f"updates/s, {figures['producer_updates_per_cpu_s']:,.0f} per CPU second; partitioning 1 "
        f"on {v1_count:,} of the same updates: {figures['producer_v1_updates_per_cpu_s']:,.0f} "
        "per CPU second"
    )
    return out, final, rate


class Feeder:
    """Publishes encoded ticks, and each partition's `DesiredProgress` framed as the fed sink's
    configuration says; returns each tick's end offsets per partition."""

    def __init__(self, bootstrap: str) -> None:
        self.framings = registry.Framings()
        # Idempotent: without it a retried request (e.g. the first tick's, sent before a new
        # topic's leaders were known) can land after the tick's `Progress`, and the sinks then
        # rightly refuse its updates as below the partition's progress.
        self.producer = Producer(
            client_config(bootstrap, **{"linger.ms": 5, "enable.idempotence": True})
        )
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

        desired, framing = config.topics.desired, self.framings.of(config.schema_registry_url)
        for partition, value in tick.records:
            self._produce(desired, partition, value)
        for partition in range(config.partitions):
            self._produce(desired, partition, tick.progress, delivered)
            record = DesiredProgress(config.sink_id, partition, Frontier.at(tick.time + 1))
            self.producer.produce(
                config.topics.frontiers,
                key=record.key.encode(),
                value=framing.encode(config.topics.frontiers, record),
                headers=[(SCHEMA_HEADER, schema_header(record).encode())],
            )
        if self.producer.flush(60) != 0:
            raise BenchError("the broker did not take a tick within 60 s")
        return ends

    def _produce(
        self,
        topic: str,
        partition: int,
        value: bytes,
        on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
    ) -> None:
        while True:
            try:
                self.producer.produce(
                    topic,
                    key=str(partition).encode(),
                    value=value,
                    partition=partition,
                    headers=self.header,
                    on_delivery=on_delivery,
                )
                return
            except BufferError:
                self.producer.poll(0.1)


class DataFrameFeeder:
    """Publishes a tick as an upstream Spark job does: the tick's updates are a DataFrame read
    from its source, published from the executors with
    `mvsink.upstream.publish.publish_dataframe`, so reading, partitioning, encoding and
    producing count in the system's figures. Same interface as `Feeder`.

    The source is one Parquet file per tick in `directory`, written before anything is timed;
    the upstream's executors read it by path, so they must share this machine's filesystem
    (local mode, or the embedded stack's cluster). The ticks are not held in Spark's block
    manager: ~200 ticks outgrow its storage memory, and each publish would read its tick back
    from disk and evict another, both through Java serialization. Spark sizes a Parquet
    input by its compressed bytes, so a tick takes `publish_dataframe`'s one-task path up to
    several times `ONE_TASK_BYTES` of rows in memory. The session lifts Spark 4's Arrow batch
    byte limit, as the publish module's docs advise for an upstream of small rows."""

    def __init__(
        self,
        bootstrap: str,
        workload: Workload,
        say: Say,
        directory: Path,
        ticks: int | None = None,
    ) -> None:
        from mvsink.io.spark import spark_session

        started = time.monotonic()
        #: The ticks held (0..held-1): all of the workload's, or its first `ticks` (the same
        #: draws, so the same updates).
        self.held = min(workload.ticks + 1, ticks or workload.ticks + 1)
        tables, _ = replace(workload, ticks=self.held - 1).generate()
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        paths = [directory / f"tick-{time_:06d}.parquet" for time_ in range(len(tables))]
        for table, path in zip(tables, paths, strict=True):
            pq.write_table(table, path)
        self.spark = spark_session(
            "mvsink-bench-upstream",
            shuffle_partitions=workload.partitions,
            conf={ARROW_MAX_BYTES: str(ARROW_UNLIMITED)},
        )
        self.frames = [self.spark.read.parquet(str(path)) for path in paths]
        self.producers: dict[str, DesiredProducer] = {}
        self.offsets = Consumer(consumer_config(bootstrap))
        say(
            f"upstream DataFrames: {len(self.frames)} ticks as Parquet files read by Spark "
            f"({self.spark.sparkContext.master}), ready in {time.monotonic() - started:.1f}s"
        )

    def _producer(self, config: Config) -> DesiredProducer:
        producer = self.producers.get(config.sink_id)
        if producer is None:
            producer = self.producers[config.sink_id] = DesiredProducer(
                config, parse_row_schema(ROW_SCHEMA), f"bench-upstream.{config.sink_id}"
            )
            producer.start()
        return producer

    def warm_up(
        self, scratch: Callable[[int], Config], discard: Callable[[Config], None], say: Say
    ) -> None:
        """Publish every tick to scratch sinks nothing reads (`scratch(n)` makes pass n's,
        `discard` deletes it after the pass), untimed, before any system is fed: passes over the
        ticks until the JIT compiler's share of a pass is at most `WARM_JIT_SHARE`, or
        `WARM_PASSES` passes. Spark's JVM compiles the publish path (planning, closure cleaning,
        task serialization, the Arrow conversion) over hundreds of publishes: without the
        warm-up the first end-to-end column would run on a colder upstream than the second, and
        the first repeat on a colder one than the last, which a long-running upstream is not.
        Where the JVM cannot be asked (no py4j gateway), one pass."""
        from mvsink.upstream.publish import publish_dataframe

        for n in range(1, WARM_PASSES + 1):
            sink = scratch(n)
            try:
                producer = self._producer(sink)
                compiled, started = self._jit_ms(), time.monotonic()
                for time_, frame in enumerate(self.frames):
                    publish_dataframe(frame, producer, Frontier.at(time_ + 1))
                seconds = time.monotonic() - started
                now = self._jit_ms()
                jit = (now - compiled) / 1000 if now is not None and compiled is not None else None
            finally:
                self.producers.pop(sink.sink_id, None)
                discard(sink)
            say(
                f"upstream warm-up pass {n}: {len(self.frames)} publishes to a scratch topic in "
                f"{seconds:.1f}s, {seconds / len(self.frames):.3f}s each"
                + (f"; the JIT compiled for {jit:.1f}s of it" if jit is not None else "")
            )
            if jit is None or jit <= WARM_JIT_SHARE * seconds:
                break

    def _jit_ms(self) -> float | None:
        """The upstream JVM's JIT compilation time so far (ms), or None where it cannot be
        asked."""
        jvm: Any = self.spark._jvm
        try:
            bean = jvm.java.lang.management.ManagementFactory.getCompilationMXBean()
            return float(bean.getTotalCompilationTime())
        except Exception:
            return None

    def feed(self, config: Config, tick: EncodedTick) -> dict[int, int]:
        from mvsink.upstream.publish import publish_dataframe

        producer = self._producer(config)
        publish_dataframe(self.frames[tick.time], producer, Frontier.at(tick.time + 1))
        ends = {}
        for partition in range(config.partitions):  # [..., Progress, commit marker]
            _, high = self.offsets.get_watermark_offsets(
                TopicPartition(config.topics.desired, partition), timeout=30
            )
            ends[partition] = high - 1
        return ends

    def stop(self) -> None:
        self.offsets.close()
        self.spark.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

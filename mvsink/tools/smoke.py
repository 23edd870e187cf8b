"""The smoke demo: one record of each contract through each provisioned topic, and the
conditional writes the shard's compare-and-append is built on, against the running stack.

This is what `mvsink demo` runs until the pipeline demo lands; it proves the stack and the
contracts end to end and prints what it saw.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from mvsink import Say
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
    SinkRepair,
    StagedBatch,
    Update,
    Updates,
    desired_progress_key,
    shard_upper_key,
)
from mvsink.io.config import Config
from mvsink.io.kafka import (
    client_config,
    consumer_config,
    decode_message,
    init_transactions,
    poll_message,
    produce,
)
from mvsink.io.registry import OWN, Framing
from mvsink.io.s3 import probe_conditional_writes
from mvsink.io.sinks import definition_of


@dataclass(frozen=True)
class Sample:
    """One contract record on its topic, as its real producer would send it."""

    topic: str
    partition: int
    key: str
    record: Record
    #: The producer's `transactional.id` when the contract says it is transactional.
    transactional_id: str | None = None


def contract_samples(config: Config, run: str) -> list[Sample]:
    """One record of each contract (docs/design.md §3.1) for the sink of `config`."""
    topics = config.topics
    lower, upper = Frontier.at(0), Frontier.at(10)
    desc = BatchDescription(config.sink_id, BatchId(1, 0), lower, upper, append_worker=0)
    part = Part(
        f"shards/{config.shard_id}/parts/smoke-{run}/x.parquet", 0, config.partitions, 1, 42
    )
    producer_id = f"producer.{config.sink_id}.{run}"
    updates = Updates((Update.ok(b"\x02a", 3, 1), Update.error("boom", 4, 1)))
    repair = SinkRepair(
        config.sink_id,
        config.shard_id,
        f"smoke-{run}",
        0,
        upper,
        lower,
        (RepairedPartition(0, lower, 0, 0, 0, -1, 0),),
    )
    return [
        Sample(topics.desired, 0, "row-a", updates, producer_id),
        Sample(topics.desired, 0, "row-a", Progress(upper), producer_id),
        Sample(
            topics.frontiers,
            0,
            desired_progress_key(config.sink_id, 0),
            DesiredProgress(config.sink_id, 0, upper),
            producer_id,
        ),
        Sample(
            topics.frontiers,
            0,
            shard_upper_key(config.shard_id),
            ShardUpper(config.shard_id, lower, 0),
        ),
        Sample(topics.descs, 0, config.sink_id, desc, f"mint.{config.sink_id}"),
        Sample(
            topics.batches,
            desc.append_worker,
            str(desc.append_worker),
            StagedBatch(desc.id, lower, upper, (0,), (part,), f"smoke-{run}"),
        ),
        Sample(topics.control, 0, config.sink_id, SinkControl(read_only=False)),
        Sample(topics.control, 0, repair.key, repair),
        Sample(topics.sinks, 0, config.sink_id, definition_of(config)),
    ]


def roundtrip(
    bootstrap: str, sample: Sample, framing: Framing = OWN, timeout: float = 30.0
) -> Record:
    """Produce `sample` (in a transaction if its contract says so) framed by `framing`, read it
    back with a read_committed consumer from the offset it was written at, and return what was
    decoded."""
    txn = sample.transactional_id
    producer = Producer(client_config(bootstrap, **({"transactional.id": txn} if txn else {})))
    delivered: list[Message] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            raise KafkaException(error)
        delivered.append(message)

    if txn:
        init_transactions(producer, timeout)
        producer.begin_transaction()
    produce(
        producer,
        sample.topic,
        sample.key,
        sample.record,
        sample.partition,
        on_delivery,
        framing=framing,
    )
    if txn:
        producer.commit_transaction(timeout)
    producer.flush(timeout)
    offset = delivered[0].offset()
    if offset is None:
        raise KafkaException(f"no offset in the delivery report for {sample.topic}")
    consumer = Consumer(consumer_config(bootstrap))
    try:
        consumer.assign([TopicPartition(sample.topic, sample.partition, offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = poll_message(consumer, 0.5)
            if message is not None:
                return decode_message(message, framing=framing)
        raise TimeoutError(f"did not read back {sample.topic}[{sample.partition}]@{offset}")
    finally:
        consumer.close()


def run_smoke(config: Config, say: Say) -> None:
    """Run the smoke demo against the stack `config` points at (topics already provisioned).

    Raises:
        RuntimeError: a record did not come back equal, or S3 ignored a precondition.
    """
    run = uuid.uuid4().hex[:8]
    say(f"Kafka at {config.kafka_bootstrap}: one record of each contract per topic")
    framing = config.framing()
    for sample in contract_samples(config, run):
        started = time.monotonic()
        got = roundtrip(config.kafka_bootstrap, sample, framing)
        if got != sample.record:
            raise RuntimeError(f"{sample.topic}: sent {sample.record!r}, read back {got!r}")
        how = "transactional" if sample.transactional_id else "plain"
        say(
            f"  {sample.topic:<22} [{sample.partition}] {how:<13} {type(got).__name__:<17} "
            f"read back in {1000 * (time.monotonic() - started):.0f} ms"
        )
    _conditional_writes(config, run, say)
    say("smoke demo OK: every topic round-trips its contract; conditional writes hold.")


def _conditional_writes(config: Config, run: str, say: Say) -> None:
    key = f"smoke/{run}/state/{0:020d}"
    say(f"MinIO at {config.s3.endpoint}: conditional writes on {config.s3.bucket}/{key}")
    probe_conditional_writes(config.s3, key, say)

"""Kafka against a real broker: provisioning per the contracts, every topic round-trips its
records through the codecs, transactional fencing (what mint relies on), compaction of
`frontiers` (latest value per key), and a stalled reader reading on with a new consumer."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from mvsink.core import codec
from mvsink.core.frontier import Frontier
from mvsink.core.messages import DesiredProgress, ShardUpper, frontier_keys
from mvsink.io import kafka
from mvsink.io.config import Config, S3Settings, Topics
from mvsink.io.kafka import (
    ProvisionError,
    TopicSpec,
    client_config,
    consumer_config,
    desired_refusal,
    ensure_topics,
    is_fencing,
    poll_message,
    produce,
    producer_error,
    read_compacted,
    sink_topics,
    sinks_topic,
    tail_consumer,
    topic_configs,
)
from mvsink.io.registry import OWN
from mvsink.tools.smoke import contract_samples, roundtrip

pytestmark = pytest.mark.integration

FAST_COMPACTION = {
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "100",
}


def _config(
    bootstrap: str, s3: S3Settings, sink: str, partitions: int = 3, workers: int = 2
) -> Config:
    return Config(
        sink_id=sink,
        shard_id=sink,
        partitions=partitions,
        append_workers=workers,
        as_of=0,
        read_only=False,
        topics=Topics.for_sink(sink, frontiers=f"{sink}.frontiers"),
        kafka_bootstrap=bootstrap,
        s3=s3,
        spark_master="local[*]",
    )


def _partition_counts(bootstrap: str) -> dict[str, int]:
    topics = AdminClient(client_config(bootstrap)).list_topics(timeout=10).topics
    return {name: len(meta.partitions) for name, meta in topics.items()}


def _cleanup_policy(bootstrap: str, topic: str) -> str:
    return topic_configs(bootstrap, topic)["cleanup.policy"]


def test_provision_creates_contract_topics_idempotently(
    kafka_bootstrap: str, s3_settings: S3Settings, unique: str
) -> None:
    config = _config(kafka_bootstrap, s3_settings, f"prov-{unique}", partitions=3, workers=2)
    created = ensure_topics(kafka_bootstrap, sink_topics(config))
    topics = config.topics
    assert sorted(created) == sorted(
        [
            topics.desired,
            topics.descs,
            topics.batches,
            topics.control,
            topics.frontiers,
            topics.dead_letter,
        ]
    )
    counts = _partition_counts(kafka_bootstrap)
    assert counts[topics.desired] == 3  # P
    assert counts[topics.descs] == 1  # exactly one: a single ordered broadcast
    assert counts[topics.batches] == 2  # A
    assert _cleanup_policy(kafka_bootstrap, topics.frontiers) == "compact"
    assert _cleanup_policy(kafka_bootstrap, topics.control) == "compact"
    assert _cleanup_policy(kafka_bootstrap, topics.desired) == "delete"
    assert ensure_topics(kafka_bootstrap, sink_topics(config)) == []  # idempotent


def test_provision_bounds_an_existing_frontiers_topics_uncompacted_tail(
    kafka_bootstrap: str, s3_settings: S3Settings, unique: str
) -> None:
    """A `frontiers` made before (compacted, the broker's 7-day `segment.ms`) is set to roll
    and compact within the hour when a sink is provisioned on it."""
    config = _config(kafka_bootstrap, s3_settings, f"front-{unique}")
    topic = config.topics.frontiers
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1, {"cleanup.policy": "compact"})])
    before = topic_configs(kafka_bootstrap, topic)
    assert before["segment.ms"] == "604800000"
    ensure_topics(kafka_bootstrap, sink_topics(config))
    after = topic_configs(kafka_bootstrap, topic)
    assert after["cleanup.policy"] == "compact"
    assert after["segment.ms"] == after["max.compaction.lag.ms"] == "3600000"


def test_provision_makes_a_compacted_desired_topic_deleted_which_the_check_refused(
    kafka_bootstrap: str, s3_settings: S3Settings, unique: str
) -> None:
    """A desired topic made compacted (by hand, or by a tool's defaults) is what the write
    service refuses (`desired_refusal`); provisioning sets it back to `cleanup.policy=delete`."""
    config = _config(kafka_bootstrap, s3_settings, f"compacted-{unique}")
    topic = config.topics.desired
    ensure_topics(
        kafka_bootstrap, [TopicSpec(topic, config.partitions, {"cleanup.policy": "compact"})]
    )
    why = desired_refusal(topic, topic_configs(kafka_bootstrap, topic))
    assert why is not None and f"topic {topic} has cleanup.policy=compact" in why
    ensure_topics(kafka_bootstrap, sink_topics(config))
    assert _cleanup_policy(kafka_bootstrap, topic) == "delete"
    assert desired_refusal(topic, topic_configs(kafka_bootstrap, topic)) is None


def test_provision_rejects_a_topic_that_breaks_the_contract(
    kafka_bootstrap: str, s3_settings: S3Settings, unique: str
) -> None:
    config = _config(kafka_bootstrap, s3_settings, f"bad-{unique}")
    ensure_topics(kafka_bootstrap, [TopicSpec(config.topics.descs, 2)])
    with pytest.raises(ProvisionError, match=rf"{config.topics.descs} has 2 partitions.*exactly 1"):
        ensure_topics(kafka_bootstrap, sink_topics(config))


def test_every_topic_round_trips_its_contract(
    kafka_bootstrap: str, s3_settings: S3Settings, unique: str
) -> None:
    config = _config(kafka_bootstrap, s3_settings, f"rt-{unique}")
    ensure_topics(kafka_bootstrap, [*sink_topics(config), sinks_topic(config.topics)])
    samples = contract_samples(config, unique)
    assert {s.topic for s in samples} >= {
        config.topics.desired,
        config.topics.frontiers,
        config.topics.descs,
        config.topics.batches,
        config.topics.control,
        config.topics.sinks,
    }
    assert {type(s.record).__name__ for s in samples} >= set(codec.KINDS.values()) - {
        "DesiredRecord"  # Updates and Progress
    }
    for sample in samples:
        assert roundtrip(kafka_bootstrap, sample) == sample.record, sample.topic


def test_second_transactional_producer_fences_the_first(
    kafka_bootstrap: str, s3_settings: S3Settings, unique: str
) -> None:
    """The mechanism that makes a second mint fence the first: same `transactional.id`."""
    config = _config(kafka_bootstrap, s3_settings, f"fence-{unique}")
    ensure_topics(kafka_bootstrap, sink_topics(config))
    txn = {"transactional.id": f"mint.{config.sink_id}"}
    samples = [s for s in contract_samples(config, unique) if s.topic == config.topics.descs]
    desc = samples[0].record

    first = Producer(client_config(kafka_bootstrap, **txn))
    first.init_transactions(30)
    first.begin_transaction()
    produce(first, config.topics.descs, config.sink_id, desc, framing=OWN)
    first.flush(30)

    second = Producer(client_config(kafka_bootstrap, **txn))
    second.init_transactions(30)  # bumps the epoch: the first producer is now fenced

    with pytest.raises(KafkaException) as caught:
        first.commit_transaction(30)
    error = caught.value.args[0]
    assert is_fencing(producer_error(first, error)), error
    # Once fatal, a produce raises plain _FATAL; the transaction API names the fencing behind it.
    with pytest.raises(KafkaException) as caught:
        produce(first, config.topics.descs, config.sink_id, desc, framing=OWN)
    fatal = caught.value.args[0]
    assert fatal.code() == KafkaError._FATAL and not is_fencing(fatal), fatal
    assert is_fencing(producer_error(first, fatal))

    second.begin_transaction()
    produce(second, config.topics.descs, config.sink_id, desc, framing=OWN)
    second.commit_transaction(30)

    # A read_committed reader sees only the second producer's record.
    consumer = Consumer(consumer_config(kafka_bootstrap, extra={"enable.partition.eof": True}))
    consumer.assign([TopicPartition(config.topics.descs, 0, 0)])
    seen, done = [], []
    deadline = time.monotonic() + 30
    while not done and time.monotonic() < deadline:
        message = poll_message(consumer, 0.5, on_eof=done.append)
        if message is not None:
            seen.append(codec.decode_message(message))
    consumer.close()
    assert seen == [desc]


def test_a_drain_without_a_limit_takes_the_whole_backlog(
    kafka_bootstrap: str, s3_settings: S3Settings, unique: str
) -> None:
    """`drain` takes at most `limit` records a call; with `limit=None` all that its reader has,
    so a follower that starts behind a shared `frontiers` reads it in one call."""
    config = _config(kafka_bootstrap, s3_settings, f"drain-{unique}")
    ensure_topics(kafka_bootstrap, sink_topics(config))
    topic = config.topics.frontiers
    # Idempotent: the records must land in the order sent. Without it, a produce request that
    # is retried (a busy broker) lands after the ones sent behind it.
    producer = Producer(client_config(kafka_bootstrap, **{"enable.idempotence": True}))
    # a key each: `frontiers` is compacted with small segments, and the cleaner may run before
    # the reader (records of one key would leave only the newest)
    sent = [DesiredProgress(config.sink_id, t, Frontier.at(t)) for t in range(3000)]
    for record in sent:
        produce(producer, topic, record.key, record, framing=OWN)
    assert producer.flush(30) == 0
    reader = tail_consumer(kafka_bootstrap, topic)
    try:
        bounded = [r for _, r in kafka.drain(reader, 10.0, framing=OWN)]
        assert bounded == sent[:500]
        rest = [r for _, r in kafka.drain(reader, 10.0, limit=None, framing=OWN)]
        while len(bounded) + len(rest) < len(sent):  # what was not fetched yet: next calls
            more = [r for _, r in kafka.drain(reader, 10.0, limit=None, framing=OWN)]
            assert more, "the backlog stopped short"
            rest += more
    finally:
        reader.close()
    assert len(rest) > 500  # one call took more than a bounded drain could
    assert bounded + rest == sent


def test_a_drain_by_keys_skips_other_sinks_records_undecoded(
    kafka_bootstrap: str, s3_settings: S3Settings, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On a shared `frontiers`, a follower reads only its sink's keys (`frontier_keys`): other
    sinks' progress and shard uppers are skipped, and so is a record under another key that is
    not even decodable; one under its own key still is decoded, and logged if bad."""
    config = _config(kafka_bootstrap, s3_settings, f"keys-{unique}", partitions=2)
    ensure_topics(kafka_bootstrap, sink_topics(config))
    topic = config.topics.frontiers
    mine = [
        DesiredProgress(config.sink_id, 1, Frontier.at(3)),
        ShardUpper(config.shard_id, Frontier.at(2), 1),
    ]
    others = [
        DesiredProgress(f"{config.sink_id}x", 0, Frontier.at(9)),  # a sink id extending ours
        DesiredProgress(config.sink_id, 2, Frontier.at(9)),  # a partition the sink does not have
        ShardUpper(f"{config.shard_id}x", Frontier.at(9), 1),
    ]
    producer = Producer(client_config(kafka_bootstrap))
    produce(producer, topic, others[0].key, others[0], framing=OWN)
    producer.produce(topic, key=b"persist:elsewhere", value=b"\x01not avro")
    produce(producer, topic, mine[0].key, mine[0], framing=OWN)
    produce(producer, topic, others[1].key, others[1], framing=OWN)
    produce(producer, topic, others[2].key, others[2], framing=OWN)
    produce(producer, topic, mine[1].key, mine[1], framing=OWN)
    producer.produce(topic, key=mine[1].key.encode(), value=b"\x01not avro")
    assert producer.flush(30) == 0
    keys = frontier_keys(config.sink_id, config.partitions, config.shard_id)
    assert keys == {
        f"desired:{config.sink_id}:0".encode(),
        f"desired:{config.sink_id}:1".encode(),
        f"persist:{config.shard_id}".encode(),
    }
    reader = tail_consumer(kafka_bootstrap, topic)
    read: list[object] = []
    try:
        with caplog.at_level(logging.ERROR, logger="mvsink.io.kafka"):
            deadline = time.monotonic() + 30
            while len(read) < len(mine) and time.monotonic() < deadline:
                read += [r for _, r in kafka.drain(reader, 1.0, limit=None, keys=keys, framing=OWN)]
            read += [r for _, r in kafka.drain(reader, 2.0, limit=None, keys=keys, framing=OWN)]
    finally:
        reader.close()
    assert read == mine
    bad = [r.getMessage() for r in caplog.records if "skipping bad record" in r.getMessage()]
    assert len(bad) == 1, bad  # the one under the sink's own key, not the other


def test_compacted_frontiers_keeps_the_latest_value_per_key(
    kafka_bootstrap: str, s3_settings: S3Settings, unique: str
) -> None:
    config = _config(kafka_bootstrap, s3_settings, f"compact-{unique}")
    ensure_topics(kafka_bootstrap, sink_topics(config, frontiers_config=FAST_COMPACTION))
    topic = config.topics.frontiers
    producer = Producer(client_config(kafka_bootstrap))
    for t in range(20):
        produce(
            producer,
            topic,
            f"persist:{config.shard_id}",
            ShardUpper(config.shard_id, Frontier.at(t), t),
            framing=OWN,
        )
        produce(
            producer,
            topic,
            f"desired:{config.sink_id}:0",
            DesiredProgress(config.sink_id, 0, Frontier.at(100 + t)),
            framing=OWN,
        )
    producer.flush(30)

    latest = read_compacted(kafka_bootstrap, topic, framing=OWN)
    assert latest[f"persist:{config.shard_id}"] == ShardUpper(config.shard_id, Frontier.at(19), 19)
    assert latest[f"desired:{config.sink_id}:0"] == DesiredProgress(
        config.sink_id, 0, Frontier.at(119)
    )

    # The log cleaner really drops the superseded values: roll segments until it has run.
    deadline = time.monotonic() + 90
    while True:
        time.sleep(1.0)
        produce(producer, topic, "roll", ShardUpper("roll", Frontier.at(0), 0), framing=OWN)
        producer.flush(10)
        per_key = _count_per_key(kafka_bootstrap, topic)
        if (
            per_key[f"persist:{config.shard_id}"] == 1
            and per_key[f"desired:{config.sink_id}:0"] == 1
        ):
            break
        assert time.monotonic() < deadline, f"not compacted after 90s: {per_key}"
    assert read_compacted(kafka_bootstrap, topic, framing=OWN) | {"roll": None} == latest | {
        "roll": None
    }


def _count_per_key(bootstrap: str, topic: str) -> dict[str, int]:
    consumer = Consumer(consumer_config(bootstrap, extra={"enable.partition.eof": True}))
    consumer.assign([TopicPartition(topic, 0, 0)])
    counts: dict[str, int] = {}
    done: list[int] = []
    try:
        while not done:
            message = poll_message(consumer, 0.5, on_eof=done.append)
            if message is not None:
                key = (message.key() or b"").decode()
                counts[key] = counts.get(key, 0) + 1
    finally:
        consumer.close()
    return counts


def _read(reader: kafka.Reader, want: int, timeout: float) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        message = poll_message(reader, 0.1)
        if message is not None:
            got.append(message.value() or b"")
    return got


def test_a_stalled_reader_reads_on_with_a_new_consumer_but_never_past_an_open_transaction(
    kafka_bootstrap: str,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """librdkafka#5153: after a broker restart an assigned consumer may never fetch again. A
    paused partition looks the same (assigned, not fetched): the reader must notice committed
    records waiting past its position and read them with a new consumer, from its position
    (nothing twice, nothing lost). An open transaction past the position is no stall."""
    monkeypatch.setattr(kafka, "STUCK_AFTER", 1.0)
    monkeypatch.setattr(kafka, "STUCK_CHECK", 0.2)
    topic = f"stall-{unique}"
    ensure_topics(kafka_bootstrap, [TopicSpec(topic, 1)])
    producer = Producer(client_config(kafka_bootstrap, **{"transactional.id": f"stall.{unique}"}))
    producer.init_transactions(30)

    def commit(*values: bytes) -> None:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value)
        producer.commit_transaction(30)

    commit(b"a", b"b")
    reader = tail_consumer(kafka_bootstrap, topic)
    caplog.set_level(logging.WARNING, logger="mvsink.io.kafka")
    try:
        assert _read(reader, 2, 30) == [b"a", b"b"]
        # An open transaction: its records are past the high watermark, not the stable offset.
        producer.begin_transaction()
        producer.produce(topic, b"open")
        producer.flush(10)
        first = reader.consumer
        assert _read(reader, 1, 3.0) == []
        assert reader.consumer is first and "stalled" not in caplog.text
        producer.commit_transaction(30)
        assert _read(reader, 1, 30) == [b"open"]

        # The stall: assigned, never fetched again, while records are committed.
        reader.consumer.pause([TopicPartition(topic, 0)])
        commit(b"c", b"d")
        assert _read(reader, 2, 30) == [b"c", b"d"]
        assert reader.consumer is not first, "read on with a new consumer"
        assert "stalled after a broker restart" in caplog.text
        commit(b"e")
        assert _read(reader, 1, 30) == [b"e"]
        assert _read(reader, 1, 1.5) == [], "nothing read twice"
    finally:
        reader.close()

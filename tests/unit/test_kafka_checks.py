"""What the services decide from Kafka's answers alone (`mvsink.io.kafka`): which producer errors
are a fencing, which desired topic configurations the write service refuses, and which topic
partition counts a replica refuses to serve."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from mvsink.io.config import load_config
from mvsink.io.kafka import DELETED, desired_refusal, is_fencing, partition_refusal, sink_topics


@pytest.mark.parametrize(
    ("error", "fencing"),
    [
        (KafkaError(KafkaError._FENCED, fatal=True), True),
        (KafkaError(KafkaError.PRODUCER_FENCED, fatal=True), True),
        (KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, fatal=True), True),
        # fatal, but no newer producer took over: a new producer clears it
        (KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, fatal=True), False),
        (KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fatal=True), False),
        # a produce in the fatal state: the cause is asked of the producer (`producer_error`)
        (KafkaError(KafkaError._FATAL), False),
        (KafkaError(KafkaError._TRANSPORT, retriable=True), False),
    ],
)
def test_is_fencing(error: KafkaError, fencing: bool) -> None:
    assert is_fencing(error) is fencing


@pytest.mark.parametrize(
    ("policy", "refused"),
    [
        (None, False),  # the broker's default, `delete`
        ("delete", False),
        ("compact", True),
        ("compact,delete", True),
        ("delete,compact", True),
    ],
)
def test_a_compacted_desired_topic_is_refused_naming_the_setting_and_the_fix(
    policy: str | None, refused: bool
) -> None:
    configs = {"retention.ms": "-1"} if policy is None else {"cleanup.policy": policy}
    why = desired_refusal("s.desired", configs)
    assert (why is not None) is refused
    if why is not None:
        assert f"topic s.desired has cleanup.policy={policy}" in why
        assert "cleanup.policy=delete" in why and "mvsink provision" in why


def test_provisioning_makes_desired_deleted_from_on_new_and_existing_topics() -> None:
    config = load_config(env={"MVSINK_KAFKA_BOOTSTRAP": "k:1", "MVSINK_S3_ENDPOINT": "s:1"})
    (desired,) = [s for s in sink_topics(config) if s.name == config.topics.desired]
    assert desired.config["cleanup.policy"] == DELETED["cleanup.policy"] == "delete"
    assert desired.enforced


@pytest.mark.parametrize(
    ("topic", "count", "refused"),
    [
        ("s.desired", 4, None),
        ("s.desired", 8, "[sink] partitions (MVSINK_PARTITIONS) is 4: set it to 8"),
        ("s.desired", 3, "[sink] partitions (MVSINK_PARTITIONS) is 4: set it to 3"),
        ("s.batches", 2, None),
        ("s.batches", 1, "[sink] append_workers (MVSINK_APPEND_WORKERS) is 2: set it to 1"),
        ("s.descs", 1, None),  # other topics: provisioning's shape check (`ensure_topics`)
        ("other.desired", 9, None),
    ],
)
def test_a_replica_refuses_a_topic_whose_partitions_are_not_its_p_or_a(
    topic: str, count: int, refused: str | None
) -> None:
    config = load_config(
        env={
            "MVSINK_KAFKA_BOOTSTRAP": "k:1",
            "MVSINK_S3_ENDPOINT": "s:1",
            "MVSINK_SINK_ID": "s",
            "MVSINK_PARTITIONS": "4",
            "MVSINK_APPEND_WORKERS": "2",
        }
    )
    why = partition_refusal(config, topic, count)
    if refused is None:
        assert why is None
    else:
        assert why is not None and why.startswith(f"topic {topic} has {count} partitions")
        assert refused.split(":")[0] in why and refused.split(": ")[1] in why

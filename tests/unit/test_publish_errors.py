"""Which errors of a kept transactional producer mean it was fenced (`mvsink.upstream.publish`)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from mvsink.upstream.publish import is_fenced


@pytest.mark.parametrize(
    ("error", "fenced"),
    [
        # a `produce` once librdkafka knows: plain _FATAL, not flagged fatal (the bench's case)
        (KafkaException(KafkaError(KafkaError._FATAL)), True),
        # the commit's error: flagged fatal
        (KafkaException(KafkaError(KafkaError._FENCED, fatal=True)), True),
        (KafkaException(KafkaError(KafkaError.PRODUCER_FENCED, fatal=True)), True),
        # retriable or other failures are not a fencing: they reach the caller
        (KafkaException(KafkaError(KafkaError._TRANSPORT)), False),
        (KafkaException(KafkaError(KafkaError._TIMED_OUT, retriable=True)), False),
        (ValueError("not Kafka"), False),
    ],
)
def test_is_fenced(error: BaseException, fenced: bool) -> None:
    assert is_fenced(error) is fenced

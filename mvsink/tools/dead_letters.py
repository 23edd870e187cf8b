"""`mvsink dead-letters list|replay SINK`: what a sink's services quarantined, and sending it
back once its cause is fixed.

A dead letter (`mvsink.io.kafka.dead_letter`) is a record as it was read, with its headers,
plus why (`mvsink-error`) and where it was read (`mvsink-topic`, `mvsink-partition`,
`mvsink-offset`; letters written before those headers existed name the place in the reason
only). `list` prints one line per letter: its offset, when it was quarantined, where from, its
size and why.

`replay` sends each chosen letter back through the producer contract, after the checks a
record read anywhere gets (`plan_replay`): it must decode, and its kind decides its topic —
a `DesiredRecord` goes to the sink's desired topic at the partition it was read from, a
`StagedBatch` to `batches`, a `BatchDescription` to `descs` (a letter from before the place
headers: its key's partition, except for desired records, which need the place); a letter
whose headers name another topic than its kind's, or a partition the topic does not have, is
refused. What passes is produced in one transaction (read_committed readers see all of it or
none), with its original headers, its original's place and `mvsink-replayed-from` = the
letter's offset, so the service that reads it checks it again and quarantines it again, with
its reason, if it is still bad (a desired update whose time the partition's progress has
passed, say). A write task folds a desired replay only in place of a record its state
quarantined, and once (`services.write.fold`): a replay never adds to a record that a later
read folded after all (a rebuild under a raised limit), nor to an earlier replay. What does not pass goes back to the dead-letter topic
at once, with the new reason and `mvsink-replayed-from`. Nothing is removed from the
dead-letter topic: the log of what happened stays.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from mvsink.core.codec import SCHEMA_HEADER, SchemaLookup, decode, registered_id
from mvsink.core.errors import DecodeError, MvsinkError
from mvsink.core.messages import BatchDescription, Progress, StagedBatch, Updates, UpdatesArrow
from mvsink.io.config import Topics
from mvsink.io.kafka import (
    READ_TO_END,
    REPLAYED_FROM,
    client_config,
    consumer_config,
    init_transactions,
    message_headers,
    poll_message,
)

Headers = list[tuple[str, bytes]]
#: Headers as a producer takes them.
Sent = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True)
class DeadLetter:
    """One record of a dead-letter topic."""

    offset: int
    #: When it was quarantined (unix seconds, the broker's timestamp).
    timestamp: float
    key: bytes | None
    value: bytes | None
    headers: Headers

    def header(self, name: str) -> str | None:
        """The last value of header `name`, as text."""
        found = [v for n, v in self.headers if n == name]
        return found[-1].decode(errors="replace") if found else None

    @property
    def reason(self) -> str:
        return self.header("mvsink-error") or "(no reason recorded)"

    @property
    def source(self) -> tuple[str, int | None, int | None] | None:
        """Where it was read (topic, partition, offset), if the letter records it."""
        topic = self.header("mvsink-topic")
        if topic is None:
            return None
        return topic, _int(self.header("mvsink-partition")), _int(self.header("mvsink-offset"))

    def line(self) -> str:
        """`offset  time  source  bytes  reason` for `list`."""
        when = datetime.fromtimestamp(self.timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        source = self.source
        where = "?" if source is None else f"{source[0]}[{source[1]}]@{source[2]}"
        replayed = self.header(REPLAYED_FROM)
        again = f" (replay of {replayed})" if replayed is not None else ""
        size = len(self.value or b"")
        return f"{self.offset}\t{when}\t{where}\t{size}B\t{self.reason}{again}"


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Send:
    """Replay the letter to `topic[partition]`."""

    letter: DeadLetter
    topic: str
    partition: int


@dataclass(frozen=True)
class StillBad:
    """The letter fails its checks again: back to the dead-letter topic with `reason`."""

    letter: DeadLetter
    reason: str


Replay = Send | StillBad


def plan_replay(
    letter: DeadLetter,
    topics: Topics,
    partitions: Mapping[str, int],
    lookup: SchemaLookup | None = None,
) -> Replay:
    """Where `letter` goes back to, or why it cannot (module docs); `partitions` is each of
    the sink's topics' partition count. Pure."""
    value = letter.value
    if value is None:
        return StillBad(letter, "replay: a null value is no record")
    header = letter.header(SCHEMA_HEADER) if registered_id(value) is not None else None
    try:
        record = decode(value, None, lookup, header)
    except DecodeError as error:
        return StillBad(letter, f"replay: still undecodable: {error.reason}")
    if isinstance(record, Updates | UpdatesArrow | Progress):
        topic = topics.desired
    elif isinstance(record, StagedBatch):
        topic = topics.batches
    elif isinstance(record, BatchDescription):
        topic = topics.descs
    else:
        return StillBad(letter, f"replay: a {type(record).__name__} is not replayed")
    source = letter.source
    if source is None and topic == topics.desired:
        return StillBad(
            letter, "replay: no original place recorded (quarantined before replays existed)"
        )
    if source is not None and source[0] != topic:
        return StillBad(
            letter, f"replay: a {type(record).__name__} read from {source[0]}, not {topic}"
        )
    partition = source[1] if source is not None else None
    if partition is None:  # `batches` is keyed by its partition (the append worker)
        key = _int((letter.key or b"").decode(errors="replace"))
        partition = 0 if topic == topics.descs else key
    if partition is None or not 0 <= partition < partitions.get(topic, 0):
        return StillBad(letter, f"replay: {topic} has no partition {partition}")
    return Send(letter, topic, partition)


def read_letters(bootstrap: str, topic: str, timeout: float = 30.0) -> list[DeadLetter]:
    """Every committed record of dead-letter topic `topic` (its one partition), to its end now.

    Raises:
        MvsinkError: the end was not reached within `timeout`.
    """
    consumer = Consumer(consumer_config(bootstrap, extra=READ_TO_END))
    deadline = time.monotonic() + timeout
    letters: list[DeadLetter] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        done: list[int] = []
        while not done:
            if time.monotonic() > deadline:
                raise MvsinkError(
                    f"{topic}: {len(letters)} records read, the end not in {timeout}s"
                )
            message = poll_message(consumer, 0.5, on_eof=done.append)
            if message is not None:
                letters.append(
                    DeadLetter(
                        int(message.offset() or 0),
                        (message.timestamp()[1] or 0) / 1000.0,
                        message.key(),
                        message.value(),
                        message_headers(message),
                    )
                )
    finally:
        consumer.close()
    return letters


def replay(
    bootstrap: str,
    sink_id: str,
    topics: Topics,
    plans: Iterable[Replay],
    timeout: float = 30.0,
) -> None:
    """Produce every `Send` to its topic and every `StillBad` back to the dead-letter topic, in
    one transaction of the sink's replay producer (`<sink>.replay`)."""
    producer = Producer(
        client_config(bootstrap, **{"transactional.id": f"{sink_id}.replay", "acks": "all"})
    )
    init_transactions(producer, timeout)
    producer.begin_transaction()
    for plan in plans:
        letter = plan.letter
        # The original's place stays (a fold matches a replay to the record it quarantined
        # by it); the reason and an earlier replay's mark do not.
        kept: Sent = [(n, v) for n, v in letter.headers if n not in ("mvsink-error", REPLAYED_FROM)]
        replayed: Sent = [(REPLAYED_FROM, str(letter.offset).encode())]
        if isinstance(plan, Send):
            producer.produce(
                plan.topic,
                key=letter.key,
                value=letter.value,
                partition=plan.partition,
                headers=kept + replayed,
            )
        else:
            why: Sent = [("mvsink-error", plan.reason.encode())]
            producer.produce(
                topics.dead_letter,
                key=letter.key,
                value=letter.value,
                headers=kept + why + replayed,
            )
    producer.commit_transaction(timeout)


def partition_counts(
    bootstrap: str, topics: Iterable[str], timeout: float = 30.0
) -> dict[str, int]:
    """Each of `topics`' partition count (0 for a topic that does not exist)."""
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient(client_config(bootstrap)).list_topics(timeout=timeout)
    return {
        name: len(metadata.topics[name].partitions) if name in metadata.topics else 0
        for name in topics
    }


__all__ = ["DeadLetter", "Send", "StillBad", "plan_replay", "read_letters", "replay"]

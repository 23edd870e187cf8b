"""Kafka helpers shared by the services and tools: client configs, topic provisioning,
producing framed records, and reading a compacted topic to its end.

Transactionally produced topics (`descs`, `desired`, and `frontiers`, which carries desired
progress written in the producer's transactions) are read with `isolation.level=read_committed`,
so a fenced or aborted producer's records are never acted on.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from mvsink.core import codec
from mvsink.core.errors import DecodeError, MvsinkError
from mvsink.core.messages import Record
from mvsink.io.config import GROUP_SESSION, Config, Topics, spelled
from mvsink.io.registry import Framing

COMPACTED = {"cleanup.policy": "compact"}
#: `<sink>.desired` is deleted from, never compacted: every desired record's key is its
#: partition, so the log cleaner would keep about one record a partition, and a fold across
#: what it removed would retract rows whose insertions it no longer sees (`desired_refusal`).
DELETED = {"cleanup.policy": "delete"}
#: The shared `frontiers`: compacted within about the hour. Its followers read it from the start,
#: and Kafka never compacts a log's active segment, which with the broker's default
#: `segment.ms` (7 days) holds a week of every sink's progress for each start to read. The log
#: cleaner only drops a key's older values, never its latest, so how late it runs changes what
#: a follower reads, not what it learns.
FRONTIERS = {**COMPACTED, "segment.ms": "3600000", "max.compaction.lag.ms": "3600000"}
#: For a consumer that owns the partitions of a group (write's desired, append's batches):
#: librdkafka's heartbeat thread keeps the membership: a replica that dies or pauses longer
#: than the session (`GROUP_SESSION`, 10 s) loses its partitions to the others, which its
#: conditional writes fence (write's checkpoint chain, append's compare-and-append).
OWNERSHIP = {"session.timeout.ms": round(GROUP_SESSION * 1000), "heartbeat.interval.ms": 2000}

#: For a consumer that reads to the end *now*: report the end, and don't let a fetch there wait
#: `fetch.wait.max.ms` (500 ms by default) for data that is not coming: a write task's staging
#: job reads desired to its end, so that wait would add to every job.
READ_TO_END = {"enable.partition.eof": True, "fetch.wait.max.ms": 10}
#: For a producer whose few records others wait for (append's `ShardUpper`): sent at once, not
#: after librdkafka's `linger.ms` (5 ms by default) spent waiting for more to batch with.
#: Producers that `flush` or commit a transaction after producing send at once anyway.
SEND_AT_ONCE = {"linger.ms": 0}
#: For a reader of desired that must not miss a record: an offset out of range (records deleted
#: below it) is an error, never a reset to whatever is left.
NO_RESET = {"auto.offset.reset": "error"}
log = logging.getLogger("mvsink.io.kafka")


class ProvisionError(MvsinkError):
    """A topic exists with a shape that breaks the contract (e.g. `descs` with 2 partitions)."""


class TopicMismatch(MvsinkError):
    """A sink's topic has another partition count than the replica serving it is configured
    with (`check_sink_topics`)."""


#: librdkafka's own log lines go through Python logging under this name (not straight to
#: stderr), so services filter them: `mvsink.io.service.configure_logging` drops the connection
#: failures librdkafka logs at every reconnect attempt (the health probes log an outage once).
LIBRDKAFKA = logging.getLogger("mvsink.librdkafka")


#: How often every client refreshes the metadata of the topics it uses (librdkafka: 5 min).
#: After a broker restart, a client holding a partition's old leader epoch has its requests
#: refused (`FENCED_LEADER_EPOCH`) until it refreshes: an assigned consumer delivers nothing and
#: admin calls such as `list_offsets` fail. Refreshing every few seconds bounds that stall to
#: seconds instead of minutes.
METADATA_REFRESH_MS = 5000


def ownership(max_poll_interval: float) -> dict[str, int]:
    """`OWNERSHIP` with the poll bound `[kafka] max_poll_interval` (seconds). The replicas poll
    between steps, and a step (a hydration, a repair) can outlast librdkafka's 300 s default,
    which would move the partitions off a replica working on them and make its work stale,
    again and again; the setting's default is librdkafka's most (24 h). A step longer than the
    bound loses the partitions (the next poll joins the group again, and the work of the step
    is fenced as any lost owner's is); `/healthz` reports a loop stopped long before 24 h."""
    return {**OWNERSHIP, "max.poll.interval.ms": round(max_poll_interval * 1000)}


def client_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    """Base librdkafka config for any client."""
    return {
        "bootstrap.servers": bootstrap,
        "logger": LIBRDKAFKA,
        "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
        **extra,
    }


def consumer_config(
    bootstrap: str, group_id: str | None = None, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A read_committed consumer that commits only when told to (a private group if none)."""
    return client_config(
        bootstrap,
        **{
            "group.id": group_id or f"mvsink-reader-{uuid.uuid4().hex[:12]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **(extra or {}),
        },
    )


@dataclass(frozen=True)
class TopicSpec:
    """A topic the contracts require: its name, partition count, and topic configs."""

    name: str
    partitions: int
    config: Mapping[str, str] = field(default_factory=dict)
    #: Whether an existing topic must have exactly `partitions` (else: at least).
    exact: bool = True
    #: Whether an existing topic is made to have `config` too (else only a new one gets it).
    enforced: bool = False


def sink_topics(
    config: Config, frontiers_config: Mapping[str, str] | None = None
) -> list[TopicSpec]:
    """The topics of docs/design.md §3.1 for one sink replica (the deployment's sinks topic,
    `sinks_topic`, is written where a definition is: `mvsink.io.sinks`)."""
    topics = config.topics
    return [
        # mvsink decides what of desired to delete (the write service, below its checkpoints),
        # not a broker default: a record deleted before every checkpoint is past it is lost.
        TopicSpec(
            topics.desired,
            config.partitions,
            {
                **DELETED,
                "retention.ms": str(config.desired_retention_ms),
                "retention.bytes": "-1",
                "segment.ms": str(config.desired_segment_ms),
            },
            enforced=True,
        ),
        TopicSpec(topics.descs, 1),
        TopicSpec(topics.batches, config.append_workers),
        TopicSpec(topics.control, 1, COMPACTED),
        TopicSpec(
            topics.frontiers,
            1,
            {**FRONTIERS, **(frontiers_config or {})},
            exact=False,
            enforced=True,
        ),
        TopicSpec(topics.dead_letter, 1),
    ]


def sinks_topic(topics: Topics) -> TopicSpec:
    """The topic of every sink's definition (`mvsink.io.sinks`): one partition, compacted."""
    return TopicSpec(topics.sinks, 1, COMPACTED, enforced=True)


def ensure_topics(bootstrap: str, specs: Iterable[TopicSpec], timeout: float = 30.0) -> list[str]:
    """Create the missing topics and check the existing ones; the names created. Idempotent.

    Raises:
        ProvisionError: an existing topic has a partition count the contract forbids.
    """
    admin = AdminClient(client_config(bootstrap))
    wanted = list(specs)
    existing = admin.list_topics(timeout=timeout).topics
    _check_existing(wanted, existing)
    _enforce_configs(admin, [s for s in wanted if s.name in existing], timeout)
    missing = [s for s in wanted if s.name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [
            NewTopic(
                s.name, num_partitions=s.partitions, replication_factor=-1, config=dict(s.config)
            )
            for s in missing
        ],
        operation_timeout=timeout,
    )
    created = _done(futures, timeout, KafkaError.TOPIC_ALREADY_EXISTS)
    _wait_visible(admin, [s.name for s in missing], timeout)
    return created


def delete_topics(bootstrap: str, names: Iterable[str], timeout: float = 30.0) -> list[str]:
    """Delete those of `names` that exist; the names deleted.

    Raises:
        KafkaException: the broker refused or did not answer.
    """
    admin = AdminClient(client_config(bootstrap))
    existing = admin.list_topics(timeout=timeout).topics
    doomed = [name for name in names if name in existing]
    if not doomed:
        return []
    futures = admin.delete_topics(doomed, operation_timeout=timeout, request_timeout=timeout)
    return _done(futures, timeout, KafkaError.UNKNOWN_TOPIC_OR_PART)


def _done(futures: Mapping[str, Any], timeout: float, already: int) -> list[str]:
    """The topics whose admin operation succeeded; one that failed with `already` (someone
    else did it first) is left out, any other failure raised."""
    done = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
            done.append(name)
        except KafkaException as error:
            if error.args[0].code() != already:
                raise
    return done


def delete_below(
    bootstrap: str, topic: str, offsets: Mapping[int, int], timeout: float = 30.0
) -> dict[int, int]:
    """Delete the records of `topic` below `offsets` per partition (Kafka's `DeleteRecords`,
    as Kafka Streams does behind its committed offsets); each partition's new log start.

    Raises:
        KafkaException: the broker refused or did not answer.
    """
    if not offsets:
        return {}
    admin = AdminClient(client_config(bootstrap))
    futures = admin.delete_records(
        [TopicPartition(topic, p, o) for p, o in sorted(offsets.items())],
        request_timeout=timeout,
        operation_timeout=timeout,
    )
    return {tp.partition: int(f.result(timeout).low_watermark) for tp, f in futures.items()}


def watermarks(
    bootstrap: str, topic: str, partitions: Iterable[int], timeout: float = 10.0
) -> dict[int, tuple[int, int]]:
    """Each partition's log start and end offsets, asked of the broker now."""
    consumer = Consumer(consumer_config(bootstrap))
    try:
        found: dict[int, tuple[int, int]] = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=timeout, cached=False
            )
            found[p] = (int(low), int(high))
        return found
    finally:
        consumer.close()


def topic_configs(client: str | AdminClient, topic: str, timeout: float = 30.0) -> dict[str, str]:
    """The configuration `topic` has now, as the broker describes it (its defaults included),
    asked through `client`: a bootstrap address, or an admin client of the caller's (a service
    that checks every interval keeps one, rather than a client's threads and connections a
    check).

    Raises:
        KafkaException: the broker refused or did not answer.
    """
    admin = AdminClient(client_config(client)) if isinstance(client, str) else client
    return _described(admin, topic, timeout)


def _described(admin: AdminClient, topic: str, timeout: float) -> dict[str, str]:
    """`topic`'s configuration, each setting's value by name, as `admin` is told it."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    described = admin.describe_configs([resource])[resource].result(timeout)
    return {name: entry.value for name, entry in described.items()}


def desired_refusal(topic: str, configs: Mapping[str, str]) -> str | None:
    """Why a write service refuses to fold desired topic `topic` configured with `configs`, or
    None: a `cleanup.policy` with `compact` (`DELETED`)."""
    policy = configs.get("cleanup.policy", "delete")
    if "compact" not in policy.split(","):
        return None
    return (
        f"topic {topic} has cleanup.policy={policy}: the log cleaner keeps one desired record "
        "per partition, and a fold across what it removed would retract rows; nothing is "
        "folded or staged until it is cleanup.policy=delete (`mvsink provision` sets it); if "
        "the cleaner ran meanwhile, publish what it removed again"
    )


def _enforce_configs(admin: AdminClient, specs: list[TopicSpec], timeout: float) -> None:
    """Set the configs an existing topic must have (`TopicSpec.enforced`) where they differ."""
    for spec in specs:
        if not spec.enforced or not spec.config:
            continue
        current = _described(admin, spec.name, timeout)
        differ = {k: v for k, v in spec.config.items() if current.get(k) != v}
        if not differ:
            continue
        resource = ConfigResource(ConfigResource.Type.TOPIC, spec.name)
        for key, value in differ.items():
            resource.add_incremental_config(
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
            )
        admin.incremental_alter_configs([resource])[resource].result(timeout)
        log.info(
            "topic %s: set %s (was %s)",
            spec.name,
            differ,
            {k: current.get(k) for k in differ},
        )


def partition_refusal(config: Config, topic: str, count: int) -> str | None:
    """Why a replica configured with `config` refuses to serve its sink when its topic `topic`
    has `count` partitions, or None. A replica's `partitions` (P) and `append_workers` (A)
    must be its desired and batches topics' counts: with another P, append counts a batch
    complete before every partition reported (and drops the rest as late) and mint waits for
    progress of partitions that do not exist; with another A, batches go to workers nobody
    serves. The topic decides: the replica is the one to change."""
    counts = {
        config.topics.desired: ("partitions", config.partitions),
        config.topics.batches: ("append_workers", config.append_workers),
    }
    if topic not in counts or counts[topic][1] == count:
        return None
    name, mine = counts[topic]
    return (
        f"topic {topic} has {count} partitions but this replica's {spelled(name)} is {mine}: "
        f"set it to {count} (every replica of sink {config.sink_id} must agree with its topics)"
    )


def check_sink_topics(config: Config, timeout: float = 30.0) -> None:
    """Refuse to serve a sink whose desired or batches topic disagrees with this replica's
    P or A (`partition_refusal`). Topics not created yet are not checked: provisioning makes
    them with the replica's counts.

    Raises:
        TopicMismatch: a topic's partition count is not the replica's (exit 2).
    """
    existing = AdminClient(client_config(config.kafka_bootstrap)).list_topics(timeout=timeout)
    for topic in (config.topics.desired, config.topics.batches):
        if topic in existing.topics:
            refused = partition_refusal(config, topic, len(existing.topics[topic].partitions))
            if refused is not None:
                raise TopicMismatch(refused)


def _check_existing(wanted: list[TopicSpec], existing: Mapping[str, Any]) -> None:
    for spec in wanted:
        if spec.name not in existing:
            continue
        count = len(existing[spec.name].partitions)
        if count != spec.partitions and (spec.exact or count < spec.partitions):
            raise ProvisionError(
                f"topic {spec.name} has {count} partitions; the contract needs "
                f"{'exactly' if spec.exact else 'at least'} {spec.partitions}"
            )


def _wait_visible(admin: AdminClient, names: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topics = admin.list_topics(timeout=timeout).topics
        if all(n in topics and _has_leaders(topics[n]) for n in names):
            return
        time.sleep(0.1)
    raise ProvisionError(f"topics {names} have no leaders after {timeout}s")


def _has_leaders(topic: Any) -> bool:
    """Whether a topic's metadata shows no error and a leader for every partition."""
    return topic.error is None and all(
        p.error is None and p.leader >= 0 for p in topic.partitions.values()
    )


#: The errors a transactional producer gets once a newer one with its `transactional.id` has
#: taken over (librdkafka's own, and the broker's two).
FENCINGS = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)


def is_fencing(error: KafkaError) -> bool:
    """Whether `error` says a newer producer with this one's `transactional.id` took over (not
    any fatal error: a producer's fatal state has other causes, which a new producer clears)."""
    return error.code() in FENCINGS


def producer_error(producer: Producer, error: KafkaError) -> KafkaError:
    """The error behind a transactional `producer`'s failure `error`: itself, except librdkafka's
    plain `_FATAL` (what a `produce` raises once the producer is in its fatal state), for which
    the transaction API names the cause (`is_fencing` tells a fencing from other causes)."""
    if error.code() != KafkaError._FATAL:
        return error
    try:
        producer.abort_transaction(10)
    except KafkaException as cause:
        return cause.args[0]  # type: ignore[no-any-return]
    return error


def init_transactions(producer: Producer, timeout: float) -> None:
    """`producer.init_transactions` after one metadata round trip, both within `timeout`.
    librdkafka asks for the producer id at once, and when its first broker connection is not up
    yet it asks again only 500 ms later. A metadata request for all topics first brings the
    connections up (one for the producer's topic alone does not reliably). The request lists
    every topic: a few KB here, more on a broker with thousands."""
    deadline = time.monotonic() + timeout
    producer.list_topics(timeout=timeout)
    producer.init_transactions(max(1.0, deadline - time.monotonic()))


def produce(
    producer: Producer,
    topic: str,
    key: str,
    record: Record,
    partition: int | None = None,
    on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
    *,
    framing: Framing,
) -> None:
    """Produce `record` framed by `framing` (the Schema Registry's wire format where one is
    configured, mvsink's own otherwise), with the schema header for generic tools."""
    kwargs: dict[str, Any] = {}
    if partition is not None:
        kwargs["partition"] = partition
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    producer.produce(
        topic,
        key=key.encode(),
        value=framing.encode(topic, record),
        headers=[(codec.SCHEMA_HEADER, codec.schema_header(record).encode())],
        **kwargs,
    )


#: The headers a dead letter gets (docs/design.md §3.1): why, and where it was read.
DEAD_LETTER_HEADERS = ("mvsink-error", "mvsink-topic", "mvsink-partition", "mvsink-offset")
#: The header of a record `mvsink dead-letters replay` sent back: the letter's offset (its
#: original's place stays in the `DEAD_LETTER_HEADERS` it kept).
REPLAYED_FROM = "mvsink-replayed-from"


def dead_letter(producer: Producer, topic: str, message: Message, why: object) -> None:
    """Send `message` as it was read (key, value, headers) to dead-letter topic `topic`, with
    `why` and where it was read in the `DEAD_LETTER_HEADERS` (docs/design.md §3.1): nothing of
    it is lost, nothing waits on it, and `mvsink dead-letters replay` can send it back."""
    place = (message.topic(), message.partition(), message.offset())
    headers: list[tuple[str, str | bytes | None]] = [
        (n, v) for n, v in message_headers(message) if n not in DEAD_LETTER_HEADERS
    ]
    headers += [
        (n, str(v).encode()) for n, v in zip(DEAD_LETTER_HEADERS, (why, *place), strict=True)
    ]
    producer.produce(topic, key=message.key(), value=message.value(), headers=headers)


def replayed_from(message: Message) -> tuple[str, int, int] | None:
    """The place (topic, partition, offset) a replayed record was first read at; None for a
    record that is no replay.

    Raises:
        DecodeError: a replay whose headers do not name a place.
    """
    headers = dict(message_headers(message))
    if REPLAYED_FROM not in headers:
        return None
    try:
        topic = headers["mvsink-topic"].decode()
        return topic, int(headers["mvsink-partition"]), int(headers["mvsink-offset"])
    except (KeyError, ValueError, UnicodeDecodeError) as error:
        raise DecodeError(f"a replayed record without its original's place: {error!r}") from error


def message_headers(message: Message) -> list[tuple[str, bytes]]:
    """`message`'s headers in order, each value as bytes (a header without one as empty)."""
    found = cast(list[tuple[str, Any]], message.headers() or [])
    return [(n, v if isinstance(v, bytes) else str(v or "").encode()) for n, v in found]


def decode_message(
    message: codec.KafkaMessage,
    expect: type | tuple[type, ...] | None = None,
    *,
    framing: Framing,
) -> Record:
    """`codec.decode_message` with `framing`'s registry (if any) to look schema ids up in."""
    return codec.decode_message(message, expect, framing.lookup)


def poll_message(
    consumer: Consumer | Reader, timeout: float, on_eof: Callable[[int], None] | None = None
) -> Message | None:
    """The next data message, or None (nothing within `timeout`, or a partition EOF event,
    reported to `on_eof(partition)`). Any other consumer error raises `KafkaException`."""
    message = consumer.poll(timeout)
    if message is None:
        return None
    error = message.error()
    if error is None:
        return message
    if error.code() == KafkaError._PARTITION_EOF:
        if on_eof is not None:
            on_eof(int(message.partition() or 0))
        return None
    raise KafkaException(error)


def drain(
    consumer: Consumer | Reader,
    first_timeout: float = 0.0,
    limit: int | None = 500,
    keys: Collection[bytes] | None = None,
    *,
    framing: Framing,
) -> Iterator[tuple[Message, Record]]:
    """The records available now (waiting up to `first_timeout` for the first), at most `limit`
    messages (None: every one, a backlog included). Undecodable ones are logged with
    topic/partition/offset and skipped: how followers of `descs`, `frontiers` and `control`
    read, so bad input never stops them. With `keys`, a message with another key is skipped
    undecoded (`frontier_keys`: a shared `frontiers` read from its start is mostly other
    sinks' records, and decoding is most of a read's CPU)."""
    timeout = first_timeout
    for _ in itertools.count() if limit is None else range(limit):
        message = poll_message(consumer, timeout)
        if message is None:
            return
        timeout = 0.0
        if keys is not None and message.key() not in keys:
            continue
        try:
            yield message, decode_message(message, framing=framing)
        except DecodeError as error:
            log.error("skipping bad record: %s", error)


def last_record(
    bootstrap: str, topic: str, partition: int = 0, timeout: float = 30.0, *, framing: Framing
) -> Record | None:
    """The last committed record of `topic[partition]`, or None if it has none.

    Raises:
        DecodeError: the last record is not an mvsink record.
        MvsinkError: the end was not read within `timeout`.
    """
    message = last_message(bootstrap, topic, partition, timeout)
    return None if message is None else decode_message(message, framing=framing)


def last_message(
    bootstrap: str,
    topic: str,
    partition: int = 0,
    timeout: float = 30.0,
    accept: Callable[[Message], bool] | None = None,
    skipped: list[Message] | None = None,
) -> Message | None:
    """The last committed message of `topic[partition]` (its offset with it) that `accept`
    takes (every one by default), or None; `skipped` gets those after it that `accept` refused.

    A committed transaction ends `[..., last record, commit marker]` (markers take offsets
    too), so the read starts 2 offsets before the end and widens 4x at a time until it finds a
    record: a wider read only after aborted transactions, whose records read_committed skips,
    or after records `accept` refuses.

    Raises:
        MvsinkError: the end was not read within `timeout`.
    """
    consumer = Consumer(consumer_config(bootstrap, extra=READ_TO_END))
    deadline = time.monotonic() + timeout
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout
        )
        window = 2
        while True:
            start = max(low, high - window)
            consumer.assign([TopicPartition(topic, partition, start)])
            read: list[Message] = []
            done: list[int] = []
            while not done and high > start:
                if time.monotonic() > deadline:
                    raise MvsinkError(
                        f"reading the end of {topic}[{partition}] took over {timeout}s"
                    )
                message = poll_message(consumer, 0.5, on_eof=done.append)
                if message is not None:
                    read.append(message)
            taken = [i for i, m in enumerate(read) if accept is None or accept(m)]
            if taken or start == low:
                after = taken[-1] + 1 if taken else 0
                if skipped is not None:
                    skipped.extend(read[after:])
                return read[taken[-1]] if taken else None
            window *= 4
    finally:
        consumer.close()


def tail_consumer(bootstrap: str, topic: str, partitions: Iterable[int] | None = None) -> Reader:
    """A read_committed reader of `topic` from the beginning (no group offsets): how every
    reader of `descs`, `frontiers` and `control` follows them."""
    if partitions is None:
        probe = Consumer(consumer_config(bootstrap))
        try:
            partitions = list(probe.list_topics(topic, timeout=30).topics[topic].partitions)
        finally:
            probe.close()
    return Reader(bootstrap, topic, dict.fromkeys(partitions, OFFSET_BEGINNING))


#: How long committed records may wait past an assigned consumer's position, unread, before it
#: counts as stalled (`Stall`); and how often a reader asks the broker (when it is idle).
STUCK_AFTER = 20.0
STUCK_CHECK = 5.0


class Stall:
    """The stall librdkafka can leave an assigned consumer in after a broker restart: its
    partition stays assigned but delivers nothing, while new records are committed
    (confluentinc/librdkafka#5153: e.g. a write driver's `descs` reader never delivering the
    next description). The frequent metadata refresh of `client_config` (`METADATA_REFRESH_MS`)
    cures one cause, an old leader epoch; this is the second line, for whatever else leaves a
    consumer so: a new consumer reads on.

    A partition is stalled when records committed past the consumer's position have waited
    `STUCK_AFTER` with the position unmoved. "Committed" is the last stable offset, which a
    read_committed consumer's fresh watermark query returns, so a transaction still open never
    counts, and neither does a reader that is simply caught up. The decision (`observe`) is
    pure; `stuck` asks the consumer its position and, at most every `STUCK_CHECK`, the broker
    through an unassigned consumer of its own (`probe`, made at the first check, which a reader
    done within `STUCK_CHECK` never makes): a stalled consumer's own queries may fail too.
    """

    def __init__(self, bootstrap: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.bootstrap = bootstrap
        self.probe: Consumer | None = None
        self.clock = clock
        self.next_check = clock() + STUCK_CHECK
        #: Per partition: the position last seen, and since when records wait past it.
        self.last: dict[int, int] = {}
        self.waiting: dict[int, float] = {}

    def observe(self, partition: int, position: int, start: int, stable: int, now: float) -> bool:
        """Whether `partition` is stalled, seen at `position` (negative: nothing read yet since
        it was assigned at `start`) with committed records up to `stable`, at `now`."""
        start = position if position >= 0 else start
        if stable <= start:  # caught up
            self.last[partition] = position
            self.waiting.pop(partition, None)
            return False
        if self.last.get(partition) != position:  # moved: records are being read
            self.last[partition] = position
            self.waiting[partition] = now
            return False
        since = self.waiting.setdefault(partition, now)
        return now - since >= STUCK_AFTER

    def stuck(
        self, consumer: Consumer, topic: str, assigned: Mapping[int, int]
    ) -> list[TopicPartition] | None:
        """The consumer's positions if a partition of it, assigned at the `assigned` offsets
        (a logical one such as `OFFSET_BEGINNING`: from the low watermark), is stalled (then it
        is judged anew), else None. Kafka away is no stall: its outage is reported elsewhere."""
        now = self.clock()
        if now < self.next_check:
            return None
        self.next_check = now + STUCK_CHECK
        try:
            positions = consumer.position([TopicPartition(topic, p) for p in sorted(assigned)])
            if self.probe is None:
                self.probe = Consumer(consumer_config(self.bootstrap))
            probe = self.probe
            marks = [
                probe.get_watermark_offsets(
                    TopicPartition(topic, tp.partition), timeout=1.0, cached=False
                )
                for tp in positions
            ]
        except KafkaException:
            return None
        stalled = False
        for tp, mark in zip(positions, marks, strict=True):
            if mark is None:
                continue
            low, stable = mark
            start = assigned[tp.partition] if assigned[tp.partition] >= 0 else low
            if self.observe(tp.partition, tp.offset, start, stable, now):
                stalled = True
        if not stalled:
            return None
        self.last.clear()
        self.waiting.clear()
        return positions

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()


class Reader:
    """A read_committed consumer assigned to partitions of `topic` at `offsets` (no group),
    polled like a `Consumer`, that reads on with a new consumer from its position when the old
    one stalled (`Stall`; checked while a poll finds nothing)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        offsets: Mapping[int, int],
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap, self.topic, self.extra = bootstrap, topic, dict(extra or {})
        #: Where each partition was assigned last (a new consumer starts from its position).
        self.assigned = dict(offsets)
        self.stall = Stall(bootstrap)
        self.consumer = self._assigned(offsets)

    def _assigned(self, offsets: Mapping[int, int]) -> Consumer:
        consumer = Consumer(consumer_config(self.bootstrap, extra=self.extra))
        consumer.assign([TopicPartition(self.topic, p, o) for p, o in sorted(offsets.items())])
        return consumer

    def poll(self, timeout: float) -> Message | None:
        message = self.consumer.poll(timeout)
        if message is None:
            positions = self.stall.stuck(self.consumer, self.topic, self.assigned)
            if positions is not None:
                self._read_on(positions)
        return message

    def _read_on(self, positions: list[TopicPartition]) -> None:
        offsets = {
            tp.partition: tp.offset if tp.offset >= 0 else self.assigned[tp.partition]
            for tp in positions
        }
        log.warning(
            "reading %s: committed records waited %.0fs past positions %s unread (a "
            "consumer stalled after a broker restart, confluentinc/librdkafka#5153): "
            "reading on with a new consumer",
            self.topic,
            STUCK_AFTER,
            offsets,
        )
        old, self.consumer, self.assigned = self.consumer, self._assigned(offsets), offsets
        # Closed aside: a stalled consumer's close must not hold up the reader.
        threading.Thread(target=old.close, name="close-stalled-consumer", daemon=True).start()

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return list(self.consumer.position(partitions))

    def close(self) -> None:
        close_within(self.consumer, f"a reader of {self.topic}")
        self.stall.close()


#: The longest a consumer's close is waited for (`close_within`).
CLOSE_WITHIN = 30.0


def close_within(consumer: Consumer, what: str, timeout: float = CLOSE_WITHIN) -> bool:
    """Close `consumer`, waiting at most `timeout` seconds; False when it has not closed by
    then. librdkafka's destroy can deadlock when it races an offset reset, as after an
    `OFFSET_OUT_OF_RANGE` reply (confluentinc/librdkafka#4514: `rd_kafka_destroy_app` joins a
    thread waiting on a lock the other holds): such a close never returns, so it is left to a
    daemon thread of its own, logged, and the caller goes on. A close merely slower than
    `timeout` (the process paused past it) finishes in that thread later, harmlessly: nobody
    else holds the consumer. A close that raises raises here."""
    failed: list[BaseException] = []

    def close() -> None:
        try:
            consumer.close()
        except BaseException as error:  # handed to the caller's thread
            failed.append(error)

    closing = threading.Thread(target=close, name="close-consumer", daemon=True)
    closing.start()
    closing.join(timeout)
    if failed:
        raise failed[0]
    if closing.is_alive():
        log.warning(
            "closing %s: librdkafka did not close it in %.0fs (a deadlock in its destroy, "
            "confluentinc/librdkafka#4514); left to a thread of its own, going on",
            what,
            timeout,
        )
        return False
    return True


def read_compacted(
    bootstrap: str, topic: str, timeout: float = 30.0, *, framing: Framing
) -> dict[str, Record]:
    """The latest record per key of `topic`, reading every partition up to its end now.

    Undecodable values (a tombstone included) raise `DecodeError` naming topic, partition and
    offset.
    """
    latest = read_latest(bootstrap, topic, timeout, framing=framing, tombstones=False)
    return {key: record for key, record in latest.items() if record is not None}


def read_latest(
    bootstrap: str,
    topic: str,
    timeout: float = 30.0,
    *,
    framing: Framing,
    tombstones: bool,
    on_bad: Callable[[str, DecodeError], None] | None = None,
) -> dict[str, Record | None]:
    """`read_compacted`, where a key's latest value may be a tombstone (None) if `tombstones`,
    and, with `on_bad`, an undecodable value is reported to it with its key and leaves the key
    out (its earlier values are no longer its latest).

    Raises:
        DecodeError: an undecodable value without `on_bad`, or a tombstone unless `tombstones`.
        MvsinkError: the end was not reached within `timeout`.
    """
    consumer = Consumer(consumer_config(bootstrap, extra=READ_TO_END))
    try:
        metadata = consumer.list_topics(topic, timeout=timeout).topics[topic]
        partitions = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions]
        consumer.assign(partitions)
        pending = {p.partition for p in partitions}
        latest: dict[str, Record | None] = {}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise MvsinkError(f"reading {topic} to its end took over {timeout}s")
            message = poll_message(consumer, 0.5, on_eof=pending.discard)
            if message is None:
                continue
            key = (message.key() or b"").decode()
            if tombstones and message.value() is None:
                latest[key] = None
                continue
            try:
                latest[key] = decode_message(message, framing=framing)
            except DecodeError as error:
                if on_bad is None:
                    raise
                latest.pop(key, None)
                on_bad(key, error)
        return latest
    finally:
        consumer.close()


def sink_config(config: Config, sink: str, shard: str = "") -> Config:
    """`config` for sink `sink` (its topics, its desired partition count as the topic has it)
    and shard `shard` (the configured one if empty), for tools acting on a sink by its id.

    Raises:
        MvsinkError: the sink's desired topic does not exist.
    """
    topics = Topics.for_sink(sink, config.topics.frontiers)
    metadata = AdminClient(client_config(config.kafka_bootstrap)).list_topics(timeout=30)
    if topics.desired not in metadata.topics:
        raise MvsinkError(f"sink {sink}: its desired topic {topics.desired} does not exist")
    partitions = len(metadata.topics[topics.desired].partitions)
    return replace(
        config,
        sink_id=sink,
        topics=topics,
        partitions=partitions,
        shard_id=shard or config.shard_id,
    )

"""Folding a write task's inputs into its partition's correction state (steps 2 and 3 of
`services.write.task`): the desired records as positive updates, the shard's changes as negative
ones, with the read-back of the parts this state staged itself done without reading them.

A resident task (`services.write.resident`) keeps each partition's desired reader from one step
to the next (its worker's `Readers`, with `keep` on): a fold until a batch's upper stops right
after the `Progress` that reaches it, and meanwhile librdkafka goes on fetching, so the next
step finds its records already fetched. A kept reader is used only from where the state folded
to (any other offset, after a failed step or a reload, gets a new one); a read to the end
(read-only) uses a new one; the resident closes them when it leaves, and a round closes those
of the partitions it no longer holds. Each prefetches at most `KEPT_QUEUE_KBYTES`, and, at the
end of its partition between steps, waits at the broker for records instead of asking again
(`KEPT`).

A fold never reads with a hole. Records below a partition's log start are gone (deleted by
the write service once every checkpoint is past them, by retention, or by hand), and a fold
from an offset below it would see retractions without their insertions. So a new reader first
asks the broker for the log start and refuses with `DesiredGone` (naming the offsets) when its
offset is below it; and its consumer's `auto.offset.reset` is `error`, so records deleted
while it reads (its fetch offset out of range) refuse the same way instead of being skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from mvsink.core.errors import DecodeError, DesiredGone, MvsinkError
from mvsink.core.frontier import Frontier, advance
from mvsink.core.messages import Progress
from mvsink.core.rows import updates_decoder
from mvsink.core.updates import MAX_RECORD_BYTES, TIME
from mvsink.io.kafka import (
    NO_RESET,
    READ_TO_END,
    Reader,
    client_config,
    dead_letter,
    poll_message,
    replayed_from,
)
from mvsink.io.registry import OWN, Framing
from mvsink.shard import SelectedPart, Shard, ShardState
from mvsink.upstream.desired import decode_desired
from services.write.checkpoint import PartitionState
from services.write.state import since_passed

log = logging.getLogger("mvsink.write.task")


#: How long a fold until a batch's upper waits for the partition's progress to reach it.
PROGRESS_WAIT = 60.0
#: The most quarantined offsets a partition's state keeps for replays (`_replay_of`): the
#: newest. A replay of an older one is refused as folded already, so it is never folded twice;
#: the bound keeps a checkpoint's metadata small under an upstream that sends only bad records.
QUARANTINE_KEPT = 100_000
#: The most a kept reader prefetches (librdkafka's default is 64 MiB a partition).
KEPT_QUEUE_KBYTES = 16384
#: A kept reader's consumer settings. It only ever reads until a batch's upper (a `Progress`
#: stops it), never to the end, so it needs no quick empty answer there (`READ_TO_END`): once
#: it has fetched all there is, its next fetch waits at the broker until records come, at most
#: `fetch.wait.max.ms` (librdkafka's default), and a commit's markers answer it at once.
#: `READ_TO_END`'s 10 ms would have each kept reader ask about 100 times a second between
#: steps, an idle sink's partitions too: broker and worker CPU taken from the steps. No safety
#: rests on the wait: a worker paused longer than it finds its fetches answered and the records
#: queued, and a fold's own deadline is `PROGRESS_WAIT`.
KEPT = {"queued.max.messages.kbytes": KEPT_QUEUE_KBYTES, "fetch.wait.max.ms": 500}
#: How long asking the broker for a partition's log start may take.
WATERMARK_TIMEOUT = 10.0


#: A desired partition a reader reads: (bootstrap, topic, partition).
ReaderKey = tuple[str, str, int]


@dataclass
class Readers:
    """A Python worker's desired readers kept from one step to the next (module docs). Steps of
    different partitions may use them from several threads at once; a partition's reader is
    used by one step at a time."""

    #: Whether folds until a batch's upper keep their readers (a resident's worker).
    keep: bool = False
    #: The kept readers, by key: the reader and the offset it reads next.
    kept: dict[ReaderKey, tuple[Reader, int]] = field(default_factory=dict)

    def close(self, keep: Iterable[ReaderKey] = ()) -> None:
        """Close the kept readers but those of `keep`."""
        for key in set(self.kept) - set(keep):
            kept = self.kept.pop(key, None)
            if kept is not None:
                kept[0].close()


class SincePassed(MvsinkError):
    """The shard's `since` passed what a correction state folded of it (in the state version
    a fold was about to read): merges may have collapsed changes it still needs, so a fold from
    there would subtract them wrongly. The step starts over, and rebuilds."""


def fold_desired(
    bootstrap: str,
    topic: str,
    dead_letter_topic: str,
    partition: int,
    row_schema: pa.Schema,
    partitioning: int,
    state: PartitionState,
    until: Frontier | None = None,
    wait: float = PROGRESS_WAIT,
    *,
    sink_id: str = "",
    why: str = "where its corrections folded to",
    readers: Readers | None = None,
    framing: Framing = OWN,
    max_bytes: int = MAX_RECORD_BYTES,
) -> int:
    """Read the partition from `folded_offset` to its end, or until its progress reaches
    `until`; the number of records quarantined (undecodable, below the partition's progress,
    or hashed by another function than `partitioning`). The reader comes from `readers` if it
    kept one that reads on from there, and is kept there after a read until `until` if
    `readers.keep` (None: a new reader, closed after the read). A registry-framed record's
    schema id is looked up through `framing` (the sink's Schema Registry, if it has one). A
    record that decodes to more than `max_bytes` is quarantined too, before it is decoded.

    Raises `DesiredGone` (module docs; `sink_id` and `why` the offset is needed name it) and
    folds nothing when records from `folded_offset` on are gone.

    With `until` (a batch's upper) the read stops after the `Progress` that reaches it: every
    update before `until` has been read (the in-band contract), and what follows is the next
    batch's, read by the next fold. The end of the partition does not stop it: the driver
    asks only once the partition's `DesiredProgress` reached `until`, committed in the same
    transaction as that `Progress`, but a transaction's markers reach its partitions one by
    one, so the `Progress` may become readable a moment later (on another broker, later
    still). A batch staged from a read that stopped at the end would miss those updates.
    Raises `MvsinkError` (the step fails and is run again) if the progress has not come
    within `wait` seconds. A partition whose progress already reached `until` is not read."""
    if until is not None and until.less_equal(state.desired_frontier):
        return 0
    readers = Readers() if readers is None else readers
    key, keep = (bootstrap, topic, partition), until is not None and readers.keep
    consumer = _reader(readers, key, state.folded_offset, keep, sink_id, why)
    decode_rows = updates_decoder(row_schema)
    dead, tables, kept = 0, [], False
    quarantined = set(state.quarantined)  # the state's only once the read is done
    dead_producer: Producer | None = None
    deadline = time.monotonic() + wait
    try:
        done: list[int] = []  # the end, which stops only a read without `until`
        while not done:
            try:
                message = poll_message(consumer, 1.0, on_eof=done.append if until is None else None)
            except KafkaException as error:
                if error.args[0].code() != KafkaError._AUTO_OFFSET_RESET:
                    raise
                needed = consumer.position([TopicPartition(topic, partition)])[0].offset
                low = _log_start(consumer, topic, partition)
                raise DesiredGone(
                    sink_id,
                    topic,
                    partition,
                    max(needed, state.folded_offset),
                    low,
                    f"{why}; deleted while it was read",
                ) from error
            if message is None:
                if until is not None and time.monotonic() > deadline:
                    raise MvsinkError(
                        f"{topic}[{partition}]: its progress did not reach {until} "
                        f"within {wait:.0f}s (read to offset "
                        f"{consumer.position([TopicPartition(topic, partition)])[0].offset}"
                        f", progress {state.desired_frontier})"
                    )
                continue
            offset = int(message.offset() or 0)
            try:
                original = _replay_of(message, topic, partition, quarantined)
                table = decode_desired(
                    message, row_schema, decode_rows, partitioning, framing, max_bytes
                )
                quarantined.discard(original)  # folded, or quarantined again as itself below
                if isinstance(table, Progress):
                    state.desired_frontier = advance(
                        state.desired_frontier, table.frontier
                    ).frontier
                    if until is not None and until.less_equal(state.desired_frontier):
                        break
                    continue
                if table.num_rows:
                    low = pc.min(table.column(TIME)).as_py()
                    if not state.desired_frontier.less_equal_time(low):
                        raise DecodeError(
                            f"update at time {low} is below the partition's "
                            f"progress {state.desired_frontier}"
                        )
            except DecodeError as error:
                located = error.located(topic, partition, offset)
                log.error("quarantining desired record: %s", located)
                dead_producer = dead_producer or Producer(client_config(bootstrap))
                dead_letter(dead_producer, dead_letter_topic, message, located)
                quarantined.add(offset)
                dead += 1
                continue
            tables.append(table)
        position = consumer.position([TopicPartition(topic, partition)])[0].offset
        state.quarantined = newest(quarantined, QUARANTINE_KEPT)
        if position >= 0:
            state.folded_offset = position
        if keep and position >= 0:
            readers.kept[key], kept = (consumer, position), True
    finally:
        if not kept:
            consumer.close()
        if dead_producer is not None:
            dead_producer.flush(30)
    if tables:
        state.correction.insert(pa.concat_tables(tables))
    return dead


def newest(offsets: set[int], kept: int) -> set[int]:
    """The `kept` largest of `offsets` (all of them if there are no more)."""
    return offsets if len(offsets) <= kept else set(sorted(offsets)[-kept:])


def _replay_of(message: Message, topic: str, partition: int, quarantined: set[int]) -> int:
    """For a record `mvsink dead-letters replay` sent back, its original's offset, which this
    state's folds quarantined (-1 for any other record): a replay is folded only in place of a
    record this state never folded, and once.

    Raises:
        DecodeError: a replay of a record of another partition, or of one this state folded
            (read again under settings that took it, as by a rebuild) or whose replay it
            folded already.
    """
    place = replayed_from(message)
    if place is None:
        return -1
    if place[:2] != (topic, partition):
        raise DecodeError(f"a replay of a record of {place[0]}[{place[1]}], not of this partition")
    if place[2] not in quarantined:
        raise DecodeError(
            f"a replay of offset {place[2]}, which this partition folded or replayed already"
        )
    return place[2]


def _log_start(consumer: Reader, topic: str, partition: int) -> int:
    """The partition's log start offset (its low watermark), asked of the broker now."""
    low, _ = consumer.consumer.get_watermark_offsets(
        TopicPartition(topic, partition), timeout=WATERMARK_TIMEOUT, cached=False
    )
    return int(low)


def _reader(
    readers: Readers, key: ReaderKey, offset: int, keep: bool, sink_id: str, why: str
) -> Reader:
    """The reader of `key` `readers` kept if it reads on from `offset` and may be kept, else a
    new one
    (a read_committed `Reader`: a consumer librdkafka stalled after a broker restart would
    never reach the progress, and hold the batch, and a resident's round, forever).

    A new reader is first checked against the partition's log start: `DesiredGone` (naming
    `sink_id` and `why` the offset is needed) if records from `offset` on were deleted. A kept
    one reads on from where it was checked; a deletion meanwhile is its `NO_RESET` error."""
    kept = readers.kept.pop(key, None)
    if kept is not None:
        if keep and kept[1] == offset:
            return kept[0]
        kept[0].close()
    reader = Reader(
        key[0], key[1], {key[2]: offset}, {**(KEPT if keep else READ_TO_END), **NO_RESET}
    )
    low = _log_start(reader, key[1], key[2])
    if offset < low:
        reader.close()
        raise DesiredGone(sink_id, key[1], key[2], offset, low, why)
    return reader


def fold_persist(
    partition: int,
    partitions: int,
    partitioning: int,
    state: PartitionState,
    shard: Shard,
    shard_state: ShardState,
) -> int:
    """Fold the shard's changes in `[persist_folded, upper)` (step 3); bytes read. Parts of
    another P or function `partitioning` are read and filtered by row hash.

    Raises:
        PartGone: a part was replaced by a merge meanwhile (nothing was folded).
        SincePassed: `shard_state.since` is past `persist_folded` (nothing was folded): checked
            against every state a fold reads, the first and each one read again after a
            `PartGone`, not once a step.
    """
    folded = state.persist_folded
    if since_passed(folded, shard_state.since):
        raise SincePassed(
            f"partition {partition}: the shard's since {shard_state.since} (version "
            f"{shard_state.seqno}) passed the folded {folded}"
        )
    if not folded.less_than(shard_state.upper):
        return 0
    selected = shard.parts_for(
        partition, folded, shard_state.upper, partitions, shard_state, partitioning
    )
    own = [c for c in selected if c.part.key in state.staged]
    retract_before = None
    if is_next_batch(own, selected, folded):
        # Our part of the first new batch holds exactly our corrections before its upper
        # (nothing before it can change after staging): drop them, read the rest.
        retract_before = own[0].part.upper
        own, selected = [], selected[1:]
    kept = [state.staged[c.part.key][1] for c in own]
    to_read = [c for c in selected if c.part.key not in state.staged]
    read = shard.read_parts(to_read, [partition], partitions, partitioning)
    if folded.time and any(c.part.lower.less_than(folded) for c in to_read):
        read = read.filter(pc.greater_equal(read.column(TIME), folded.time))  # merged batches
    if retract_before is not None:
        state.correction.retract_before(retract_before)
    state.correction.insert_negated(pa.concat_tables([read, *kept]))
    state.persist_folded = shard_state.upper
    # A kept part the shard's upper has passed was either read back just now or lost its
    # batch to another writer: it will never be appended.
    state.staged = {
        key: kept for key, kept in state.staged.items() if state.persist_folded.less_than(kept[0])
    }
    return sum(c.part.bytes for c in to_read)


def is_next_batch(own: list[SelectedPart], selected: list[SelectedPart], folded: Frontier) -> bool:
    """Whether the first selected part is ours, alone in the first batch after `folded`."""
    if not own or selected[0] is not own[0] or own[0].part.lower != folded:
        return False
    return all(not c.part.lower.less_than(own[0].part.upper) for c in selected[1:])

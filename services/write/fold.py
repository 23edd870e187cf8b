"""Folding a write task's inputs into its partition's correction state (steps 2 and 3 of
`services.write.task`): the desired records as positive updates, the shard's changes as negative
ones, with the read-back of the parts this state staged itself done without reading them.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Producer, TopicPartition

from mvsink.desired import decode_desired
from mvsink.errors import DecodeError
from mvsink.frontier import Frontier, advance
from mvsink.kafka import READ_TO_END, Reader, client_config, poll_message
from mvsink.messages import Progress
from mvsink.rows import updates_decoder
from mvsink.shard import SelectedPart, Shard, ShardState
from mvsink.updates import TIME
from services.write.checkpoint import PartitionState

log = logging.getLogger("mvsink.write.task")


def fold_desired(bootstrap: str, topic: str, dead_letter_topic: str, partition: int,
                 row_schema: pa.Schema, partitioning: int, state: PartitionState,
                 until: Frontier | None = None) -> int:  # fmt: skip
    """Read the partition from `folded_offset` to its end, or only until its progress reaches
    `until`; the number of records quarantined (undecodable, below the partition's progress,
    or hashed by another function than `partitioning`).

    With `until` (a batch's upper) the read stops after the `Progress` that reaches it: every
    update before `until` has been read (the in-band contract), and what follows is the next
    batch's, read by the next fold. Learning that the end was reached takes librdkafka
    another fetch or two, ~30 ms of a ~35 ms read of one tick here. A partition whose progress
    already reached `until` is not read at all; the end still stops the read if the progress
    never comes."""
    if until is not None and until.less_equal(state.desired_frontier):
        return 0
    # A `Reader`: a consumer librdkafka stalled after a broker restart would never reach the
    # end, and hold the batch (and a resident's round) forever.
    consumer = Reader(bootstrap, topic, {partition: state.folded_offset}, READ_TO_END)
    decode_rows = updates_decoder(row_schema)
    dead, tables = 0, []
    dead_producer: Producer | None = None
    try:
        done: list[int] = []
        while not done:
            message = poll_message(consumer, 1.0, on_eof=done.append)
            if message is None:
                continue
            try:
                table = decode_desired(message, row_schema, decode_rows, partitioning)
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
                        raise DecodeError(f"update at time {low} is below the partition's "
                                          f"progress {state.desired_frontier}")  # fmt: skip
            except DecodeError as error:
                located = error.located(topic, partition, int(message.offset() or 0))
                log.error("quarantining desired record: %s", located)
                dead_producer = dead_producer or Producer(client_config(bootstrap))
                dead_producer.produce(dead_letter_topic, key=message.key(), value=message.value(),
                                      headers=[("mvsink-error", str(located).encode())])  # fmt: skip
                dead += 1
                continue
            tables.append(table)
        position = consumer.position([TopicPartition(topic, partition)])[0].offset
        if position >= 0:
            state.folded_offset = position
    finally:
        consumer.close()
        if dead_producer is not None:
            dead_producer.flush(30)
    if tables:
        state.correction.insert(pa.concat_tables(tables))
    return dead


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
    """
    folded = state.persist_folded
    if not folded.less_than(shard_state.upper):
        return 0
    selected = shard.parts_for(partition, folded, shard_state.upper, partitions,
                               shard_state, partitioning)  # fmt: skip
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
    state.staged = {key: kept for key, kept in state.staged.items()
                    if state.persist_folded.less_than(kept[0])}  # fmt: skip
    return sum(c.part.bytes for c in to_read)


def is_next_batch(own: list[SelectedPart], selected: list[SelectedPart], folded: Frontier) -> bool:
    """Whether the first selected part is ours, alone in the first batch after `folded`."""
    if not own or selected[0] is not own[0] or own[0].part.lower != folded:
        return False
    return all(not c.part.lower.less_than(own[0].part.upper) for c in selected[1:])

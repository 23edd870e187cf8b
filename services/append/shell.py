"""The append process: every description from `descs` (all of them, no group), the
`StagedBatch`es of the `batches` partitions this replica owns (consumer group
`<sink>.append`), one `AppendState` per owned partition (= append worker id). All decisions
are the states'; this shell executes their commands:

* `Append`: compare-and-append through the shard library with the seed's retry (a shard
  behind `lower` is first advanced to `lower` by an empty append; any other mismatch is an
  expected outcome), then publish `ShardUpper` to `frontiers`;
* `DeleteStaged`: `Shard.delete_staged`, which refuses referenced or still-appendable parts,
  and parts whose own footers say other bounds than claimed.

A `StagedBatch` is a claim, checked against the shard before the state takes it
(`AppendState.takes`): one whose `lower` is ahead of any upper the shard had, or naming a part
that is not there, not of a staged part's form, or staged for other bounds
(`Shard.claim_refusal`), is dead-lettered with why, never appended.

Offsets of `batches` are committed only up to the first batch still needed (stashed for the
current lower), so a restart redelivers what was not yet settled; redelivery is harmless
(the invariants of `services.append`, and the shard rejects an append from a passed upper).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from prometheus_client import Counter, Gauge, Histogram

from mvsink.core.errors import DecodeError
from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, ShardUpper, StagedBatch
from mvsink.io.config import Config
from mvsink.io.host import serve_sinks
from mvsink.io.kafka import (
    SEND_AT_ONCE,
    Reader,
    client_config,
    consumer_config,
    dead_letter,
    decode_message,
    ownership,
    poll_message,
    produce,
    tail_consumer,
)
from mvsink.io.service import Stopping, probe_store
from mvsink.shard import Appended, IndefiniteAppend, PartTooOld, Shard, UpperMismatch, open_shard
from mvsink.shard.state import PartRef
from mvsink.tools.provision import ensure_retention
from services.append.state import Append, AppendOutcome, AppendState, Command, DeleteStaged, TooOld

log = logging.getLogger("mvsink.append")

APPENDS = Counter("mvsink_append_appends", "Compare-and-appends by outcome", ["sink", "outcome"])
RETRIES = Counter("mvsink_append_retries", "Appends retried after advancing the upper", ["sink"])
LATENCY = Histogram("mvsink_append_seconds", "Compare-and-append latency", ["sink"])
LOWER = Gauge("mvsink_append_lower", "Current lower per append worker", ["sink", "worker"])
DELETED = Counter("mvsink_append_parts_deleted", "Staged parts deleted", ["sink"])
REFUSED = Counter(
    "mvsink_append_batches_refused",
    "StagedBatches dead-lettered: a lower the shard never had, or a part not there or staged "
    "for other bounds",
    ["sink"],
)


class AppendShell:
    """Kafka and S3 around the `AppendState`s of the owned append workers."""

    def __init__(self, config: Config, stopping: Stopping) -> None:
        self.config = config
        self.stopping = stopping
        self.framing = config.framing()
        self.shard: Shard = open_shard(config.shard_id, None, config.s3, config.shard_timing())
        ensure_retention(self.shard, config.retain_history)
        # `ShardUpper` is on the sink's critical path: mint mints the next description on it.
        self.producer = Producer(client_config(config.kafka_bootstrap, **SEND_AT_ONCE))
        self.states: dict[int, AppendState] = {}
        #: Per owned partition: the offset of the first batch stashed for the current lower.
        self.first_needed: dict[int, tuple[Frontier, int]] = {}
        #: Per owned partition: the offset after the last batch consumed.
        self.consumed: dict[int, int] = {}
        #: The latest description read (what a newly owned worker starts from).
        self.latest_desc: BatchDescription | None = None

    # -- group membership -------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.states[tp.partition] = AppendState(
                self.config.sink_id, tp.partition, self.config.partitions
            )
            self._replay_descs(tp.partition)
        log.info("append workers assigned: %s", sorted(self.states))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._commit(consumer)
        for tp in partitions:
            self.states.pop(tp.partition, None)
            self.first_needed.pop(tp.partition, None)
            self.consumed.pop(tp.partition, None)
        log.info("append workers revoked: %s", sorted(tp.partition for tp in partitions))

    def _replay_descs(self, worker: int) -> None:
        """A newly owned worker learns the descriptions seen so far (the latest suffices:
        lowers strictly increase)."""
        if self.latest_desc is not None:
            self._execute(worker, self.states[worker].absorb_batch_description(self.latest_desc))

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        topics = self.config.topics
        descs = tail_consumer(self.config.kafka_bootstrap, topics.descs, [0])
        # A short session: after a crash, the partitions of a dead replica move within ~10 s.
        batches = Consumer(
            consumer_config(
                self.config.kafka_bootstrap,
                group_id=f"{self.config.sink_id}.append",
                extra=ownership(self.config.max_poll_interval),
            )
        )
        batches.subscribe([topics.batches], on_assign=self._on_assign, on_revoke=self._on_revoke)
        next_commit = 0.0
        try:
            while not self.stopping.stopped:
                self._poll_descs(descs)
                self._poll_batches(batches)
                self._report()
                if time.monotonic() >= next_commit:
                    self._commit(batches)
                    next_commit = time.monotonic() + 1.0
        finally:
            self._commit(batches)
            batches.close()
            descs.close()
            self.producer.flush(10)
        return 0

    def _report(self) -> None:
        """Health: work is a description an owned worker appends and has not appended yet; it
        is behind from that description's lower to its upper until the append is issued."""
        waiting = [
            state.batch_description
            for state in self.states.values()
            if state.batch_description is not None and not state.sealed
        ]
        if not waiting:
            self.stopping.report(None, None)
            return
        self.stopping.report(
            min(d.lower.time or 0 for d in waiting),
            max(-1 if d.upper.time is None else d.upper.time for d in waiting),
        )

    def _poll_descs(self, consumer: Reader) -> None:
        for _ in range(100):
            message = poll_message(consumer, 0.0)
            if message is None:
                return
            record = self._decode(message, BatchDescription)
            if not isinstance(record, BatchDescription) or record.sink_id != self.config.sink_id:
                continue
            self.latest_desc = record
            for worker, state in list(self.states.items()):
                self._execute(worker, state.absorb_batch_description(record))

    def _poll_batches(self, consumer: Consumer) -> None:
        message = poll_message(consumer, 0.05)
        while message is not None:
            worker, offset = int(message.partition() or 0), int(message.offset() or 0)
            self.consumed[worker] = offset + 1
            record = self._decode(message, StagedBatch)
            state = self.states.get(worker)
            if isinstance(record, StagedBatch) and state is not None:
                refused = self._claim_refusal(state, record)
                if refused is not None:
                    log.error("quarantining the batch of %s: %s", record.writer_id, refused)
                    REFUSED.labels(self.config.sink_id).inc()
                    dead_letter(self.producer, self.config.topics.dead_letter, message, refused)
                    message = poll_message(consumer, 0.0)
                    continue
                self._execute(worker, state.absorb_batch(record))
                first = self.first_needed.get(worker)
                if state.stash and (first is None or first[0] != state.lower):
                    self.first_needed[worker] = (state.lower, offset)
            message = poll_message(consumer, 0.0)

    def _claim_refusal(self, state: AppendState, batch: StagedBatch) -> str | None:
        """Why a batch the state would take is a claim the shard refutes, or None; batches it
        would only delete are left to `delete_staged`, which checks the same footers.

        A batch ahead of the worker's `lower` moves it there (a catch-up): its `lower` must be
        one the shard had, as every description's is (mint mints from the shard's upper, or
        the sink's `as_of`), else the worker would skip every real description below it. Its
        parts must be there with the claimed bounds (`Shard.claim_refusal`)."""
        if not state.takes(batch):
            return None
        if state.lower.less_than(batch.lower):
            known = self.shard.upper().join(Frontier.at(self.config.as_of))
            if known.less_than(batch.lower):
                return f"its lower {batch.lower} is ahead of the shard's upper {known}"
        return self.shard.claim_refusal(PartRef.from_transmittable(p, batch) for p in batch.parts)

    def _decode(self, message: Message, expect: type) -> Any:
        try:
            return decode_message(message, expect, framing=self.framing)
        except DecodeError as error:
            log.error("quarantining bad record: %s", error)
            dead_letter(self.producer, self.config.topics.dead_letter, message, error)
            return None

    def _commit(self, consumer: Consumer) -> None:
        offsets = []
        for worker, consumed in self.consumed.items():
            state = self.states.get(worker)
            needed = self.first_needed.get(worker)
            offset = consumed
            if (
                state is not None
                and needed is not None
                and needed[0] == state.lower
                and state.stash
            ):
                offset = needed[1]
            offsets.append(TopicPartition(self.config.topics.batches, worker, offset))
        if offsets:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
            except Exception as error:
                log.warning("offset commit failed (batches will be redelivered): %s", error)

    # -- commands ---------------------------------------------------------------------------

    def _execute(self, worker: int, commands: list[Command]) -> None:
        for command in commands:
            match command:
                case Append():
                    outcome = self._append(command)
                    self._execute(worker, self.states[worker].absorb_append_outcome(outcome))
                case DeleteStaged():
                    result = self.shard.delete_staged(command.parts)
                    DELETED.labels(self.config.sink_id).inc(len(result.deleted))
                    log.info(
                        "%s: deleted %d staged parts (referenced %d, still appendable %d)",
                        command.reason,
                        len(result.deleted),
                        len(result.referenced),
                        len(result.pending),
                    )
                    if result.mismatched:
                        log.warning(
                            "%s: kept parts whose footers say other bounds than their "
                            "batch claimed: %s",
                            command.reason,
                            list(result.mismatched),
                        )
        if worker in self.states:
            LOWER.labels(self.config.sink_id, str(worker)).set(
                float("inf")
                if self.states[worker].lower.time is None
                else float(self.states[worker].lower.time or 0)
            )

    def _append(self, append: Append) -> AppendOutcome:
        """Compare-and-append with the seed's retry; publishes the resulting upper."""
        desc, sink = append.desc, self.config.sink_id
        started = time.monotonic()
        while True:
            try:
                result = self.shard.compare_and_append(append.parts, desc.lower, desc.upper)
            except PartTooOld as error:
                APPENDS.labels(sink, "too_old").inc()
                log.warning("%s: %s; waiting for the write drivers to stage it again", desc, error)
                return TooOld()
            except IndefiniteAppend as error:
                log.warning("%s: %s; settling by reading the state", desc, error)
                state = self.shard.state()
                if append.parts and {p.key for p in append.parts} <= state.part_keys:
                    result = Appended(desc.upper, state.seqno)
                elif not append.parts and state.upper != desc.lower:
                    # no key to look for: whoever moved the upper, it is past our lower
                    result = UpperMismatch(state.upper, state.seqno)
                else:
                    continue
            if isinstance(result, UpperMismatch) and result.current.less_than(desc.lower):
                RETRIES.labels(sink).inc()
                self.shard.advance_upper(desc.lower)  # bring the shard up to `lower`, retry
                continue
            break
        elapsed = time.monotonic() - started
        LATENCY.labels(sink).observe(elapsed)
        if isinstance(result, Appended):
            APPENDS.labels(sink, "ok").inc()
            log.info(
                "appended %d parts for %s (seqno %d) in %.1f ms",
                len(append.parts),
                desc,
                result.seqno,
                elapsed * 1000,
            )
            self._publish(result.new_upper, result.seqno)
            return result
        APPENDS.labels(sink, "mismatch").inc()
        log.info("append of %s lost: shard upper is %s", desc, result.current)
        self._publish(result.current, result.seqno)
        return result

    def _publish(self, upper: Frontier, seqno: int) -> None:
        record = ShardUpper(self.config.shard_id, upper, seqno)
        produce(
            self.producer, self.config.topics.frontiers, record.key, record, framing=self.framing
        )
        self.producer.poll(0)


def serve(config: Config, stopping: Stopping) -> int:
    """Append for `config`'s sink until stopped."""
    probe_store(config, "append")
    return AppendShell(config, stopping).run()


def run(config: Config, stopping: Stopping) -> int:
    """Entry point body for `python -m services.append`: one sink, or every defined sink
    (`mvsink.io.host`: every replica serves every sink, whose group spreads its workers)."""
    return serve_sinks(config, stopping, "append", serve, exclusive=False)

"""The mint process: follows frontiers and control, watches the shard, mints descriptions into
`<sink>.descs` with a transactional producer. All decisions are `MintState`'s.

Steps of `run`:
1. `init_transactions` with `transactional.id = mint.<sink>`: fences any previous mint;
2. restore `last_lower`, `next_append_worker` and a new epoch from the last committed record
   of `descs` (after fencing, so no record of the previous mint can still commit) that is a
   description of this sink whose lower the shard's upper (or `as_of`) reached; any after it
   are dead-lettered, never a reason not to start;
3. loop: absorb `frontiers` (desired progress, shard upper notifications) and `control`
   (promotion); re-read the shard's upper itself every `SHARD_POLL` seconds while desired is
   ahead of it, every `IDLE_SHARD_POLL` otherwise (`mvsink.core.settings.shard_poll_due`; the
   topic is a notification, the shard is the truth: a notification ahead of the shard's upper is
   ignored); mint and produce in a transaction.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from prometheus_client import Counter, Gauge

from mvsink.core.errors import DecodeError
from mvsink.core.frontier import Frontier
from mvsink.core.messages import (
    BatchDescription,
    DesiredProgress,
    ShardUpper,
    SinkControl,
    frontier_keys,
)
from mvsink.core.settings import shard_poll_due
from mvsink.io.config import Config
from mvsink.io.health import StartAgain
from mvsink.io.host import serve_sinks
from mvsink.io.kafka import (
    Reader,
    client_config,
    dead_letter,
    decode_message,
    drain,
    init_transactions,
    is_fencing,
    last_message,
    produce,
    producer_error,
    tail_consumer,
)
from mvsink.io.service import Stopping
from mvsink.shard import Shard, open_shard
from services.mint.state import MintState

log = logging.getLogger("mvsink.mint")

DESIRED = Gauge(
    "mvsink_mint_desired_frontier", "Desired frontier (meet of all partitions)", ["sink"]
)
PERSIST = Gauge("mvsink_mint_persist_frontier", "Shard upper as seen by mint", ["sink"])
MINTED = Counter("mvsink_mint_descs_minted", "Batch descriptions minted", ["sink"])
READ_ONLY = Gauge("mvsink_mint_read_only", "1 while minting is disabled", ["sink"])
IGNORED = Counter(
    "mvsink_mint_uppers_ignored",
    "ShardUpper notifications ignored: ahead of the shard's own upper",
    ["sink"],
)


class Fenced(Exception):
    """A newer mint with the same transactional id took over."""


def _time(frontier: Frontier) -> float:
    return float("inf") if frontier.time is None else float(frontier.time)


class MintShell:
    """Kafka and S3 around a `MintState`."""

    def __init__(self, config: Config, stopping: Stopping) -> None:
        self.config = config
        self.stopping = stopping
        self.framing = config.framing()
        self.shard: Shard = open_shard(config.shard_id, None, config.s3, config.shard_timing())
        self.producer = Producer(
            client_config(
                config.kafka_bootstrap,
                **{"transactional.id": f"mint.{config.sink_id}", "enable.idempotence": True},
            )
        )
        #: The shard's upper (joined with `as_of`) when this mint started.
        self.known_upper = Frontier.at(config.as_of)
        self.state = MintState(
            config.sink_id,
            config.partitions,
            config.append_workers,
            Frontier.at(config.as_of),
            config.read_only,
        )

    def start(self) -> None:
        """Fence the previous mint, then restore from `descs`."""
        init_transactions(self.producer, 60)
        config = self.config
        skipped: list[Message] = []
        # A description's lower is an upper the shard had (or the sink's `as_of`).
        self.known_upper = self.shard.upper().join(Frontier.at(config.as_of))
        found = last_message(
            config.kafka_bootstrap,
            config.topics.descs,
            accept=lambda message: self._unrestorable(message) is None,
            skipped=skipped,
        )
        if skipped:  # never restored from, and never a reason not to start
            dead = Producer(client_config(config.kafka_bootstrap))
            for message in skipped:
                why = self._unrestorable(message)
                log.error(
                    "quarantining %s[0] offset %s, not restored from: %s",
                    config.topics.descs,
                    message.offset(),
                    why,
                )
                dead_letter(dead, config.topics.dead_letter, message, why)
            dead.flush(30)
        last = None if found is None else decode_message(found, framing=self.framing)
        self.state.restore(last if isinstance(last, BatchDescription) else None)
        log.info(
            "mint %s started: epoch %d, last lower %s, read_only=%s",
            self.config.sink_id,
            self.state.epoch,
            self.state.last_lower,
            self.state.read_only,
        )

    def _unrestorable(self, message: Message) -> str | None:
        """Why a record of `descs` is no description of this sink's to restore from, or None."""
        try:
            record = decode_message(message, framing=self.framing)
        except DecodeError as error:
            return str(error.located(self.config.topics.descs, 0, int(message.offset() or 0)))
        if not isinstance(record, BatchDescription):
            return f"a {type(record).__name__}, not a BatchDescription"
        if record.sink_id != self.config.sink_id:
            return f"a description of sink {record.sink_id!r}, not {self.config.sink_id!r}"
        if self.known_upper.less_than(record.lower):
            # no mint minted it: restored, its lower would stop minting for good
            return f"its lower {record.lower} is ahead of the shard's upper {self.known_upper}"
        return None

    def run(self) -> int:
        """Mint until stopped (0) or fenced (0: the newer mint carries on)."""
        self.start()
        config = self.config
        topics = config.topics
        follow = tail_consumer(config.kafka_bootstrap, topics.frontiers)
        control = tail_consumer(config.kafka_bootstrap, topics.control)
        own_keys = frontier_keys(config.sink_id, config.partitions, config.shard_id)
        polled: float | None = None
        try:
            while not self.stopping.stopped:
                self._absorb(follow, 0.05, own_keys)
                self._absorb(control, 0.0)
                state, now = self.state, time.monotonic()
                working = not state.read_only and state.persist_frontier.less_than(
                    state.desired_frontier
                )
                if shard_poll_due(polled, now, working):
                    self.state.advance_persist_frontier(self.shard.upper())
                    polled = now
                self._maybe_mint()
                self._export()
        except Fenced:
            log.warning("mint %s fenced by a newer mint: exiting", self.config.sink_id)
        finally:
            follow.close()
            control.close()
        return 0

    def _absorb(
        self, consumer: Reader, timeout: float, keys: frozenset[bytes] | None = None
    ) -> None:
        """Absorb what `consumer` has (of `keys`, when given: `frontiers` is every sink's)."""
        for message, record in drain(consumer, timeout, keys=keys, framing=self.framing):
            self._on_record(message.key(), record)

    def _on_record(self, key: bytes | None, record: object) -> None:
        state, config = self.state, self.config
        match record:
            case DesiredProgress(sink_id=sink_id) if sink_id == config.sink_id:
                state.advance_desired_frontier(record.partition, record.frontier)
            case ShardUpper(shard_id=shard_id) if shard_id == config.shard_id:
                self._absorb_upper(record)
            case SinkControl(read_only=False) if key == config.sink_id.encode():
                if state.allow_writes():
                    log.info("mint %s promoted: writes allowed", config.sink_id)
            case SinkControl(read_only=True) if not state.read_only:
                log.warning("ignoring read_only=true: a writing sink is not demoted (seed)")

    def _absorb_upper(self, record: ShardUpper) -> None:
        """A `ShardUpper` notification is a hint: one that would move `persist` is checked
        against the shard, whose upper it can never be ahead of (append publishes it after its
        append). One ahead (wrong or forged: forward-only, it would stop minting for good, and
        the compacted topic replays it at every start) is ignored and counted; the shard's own
        upper is taken instead."""
        if not self.state.persist_frontier.less_than(record.upper):
            return
        real = self.shard.upper()
        if real.less_than(record.upper):
            IGNORED.labels(self.config.sink_id).inc()
            log.warning(
                "ignoring a ShardUpper %s ahead of shard %s's upper %s",
                record.upper,
                self.config.shard_id,
                real,
            )
            self.state.advance_persist_frontier(real)
            return
        self.state.advance_persist_frontier(record.upper)

    def _maybe_mint(self) -> None:
        desc = self.state.maybe_mint_batch_description()
        if desc is None:
            return
        try:
            self.producer.begin_transaction()
            topic = self.config.topics.descs
            produce(self.producer, topic, self.config.sink_id, desc, framing=self.framing)
            self.producer.commit_transaction(60)
        except KafkaException as error:
            cause = producer_error(self.producer, error.args[0])
            if is_fencing(cause):
                raise Fenced() from error
            if cause.fatal() or cause.code() == KafkaError._FATAL:
                # The producer is unusable for good, but no newer mint took over: start again
                # with a new one (which fences nothing but this one).
                raise StartAgain(f"mint's producer failed for good: {cause}") from error
            raise
        MINTED.labels(self.config.sink_id).inc()
        log.info("minted %s", desc)

    def _export(self) -> None:
        sink = self.config.sink_id
        DESIRED.labels(sink).set(_time(self.state.desired_frontier))
        PERSIST.labels(sink).set(_time(self.state.persist_frontier))
        READ_ONLY.labels(sink).set(1 if self.state.read_only else 0)
        # Work is there while desired is ahead of the shard (a read-only mint has none).
        self.stopping.report(
            self.state.persist_frontier.time,
            None if self.state.read_only else self.state.desired_frontier.time,
        )


def serve(config: Config, stopping: Stopping) -> int:
    """Mint for `config`'s sink until stopped."""
    return MintShell(config, stopping).run()


def run(config: Config, stopping: Stopping) -> int:
    """Entry point body for `python -m services.mint`: one sink, or every defined sink with
    one replica minting for all of them (`mvsink.io.host`, exclusive: the others stand by)."""
    return serve_sinks(config, stopping, "mint", serve, exclusive=True)

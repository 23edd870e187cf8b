"""The write driver: follows descriptions, frontiers and control, owns a share of the P desired
partitions through consumer group `<sink>.write`, and runs each batch's steps for its owned
partitions (`services.write.task`) in its resident Spark tasks (`services.write.resident`), or
as a Spark job where they cannot. All decisions are `WriteState`'s (when to stage) and
`Chains`' (each owned partition's checkpoint chain, `services.write.chain`): the shell holds
handles and runs the loop, and does what their commands say. Its time is its `Clock`'s.

The ownership consumer never fetches data (its partitions are paused): the tasks read the
desired records themselves, by offset, from where their checkpoint says they stopped.

The desired topic's life cycle is the driver's too:
* a partition it gains is first folded without staging (`_fold`), which finds out whether the
  desired records its checkpoint needs are still there, and writes no checkpoint, nor does its
  first staging step (`services.write.chain.Deferred`): the step after that batch's append
  checkpoints what the read-back left, not the whole load the part held (read-only drivers
  checkpoint the first fold; they stage nothing); a partition whose records are gone
  (`services.write.state.Gone`) stops the sink's staging, logs what to do, shows on `/readyz`
  and `mvsink_write_desired_gone`, until its checkpoint version changes (`mvsink repair`);
* its lease version (renewed on a thread of its own, so a long step cannot let it lapse) moves
  each owned partition's critical hold (`checkpoint.holder_id`) to its
  latest durable checkpoint's `persist_folded`, so `since` never passes a checkpoint the sink
  may continue from, however long the sink is down;
* every `desired_trim_interval` it deletes each owned partition's desired records below the
  older of its two kept checkpoints (`mvsink.io.kafka.delete_below`): nothing a driver may still
  load needs them, and the topic stays bounded. The partition's last record (its latest
  `Progress`, which a new publishing producer reads to skip a publish already committed) is
  always kept;
* every `topic_check_interval` it checks the topic's configuration: a compacted desired topic
  (`mvsink.io.kafka.desired_refusal`) is refused, nothing folded or staged and `/readyz` and
  `mvsink_write_desired_refused` saying why, until it is `cleanup.policy=delete` again; a
  partition count other than its `partitions` (partitions added while it runs) stops it
  (`TopicMismatch`, exit 2), as it does at start (`mvsink.io.kafka.check_sink_topics`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import Counter, Gauge

from mvsink.core.frontier import Frontier
from mvsink.core.messages import (
    BatchDescription,
    DesiredProgress,
    ShardUpper,
    SinkControl,
    StagedBatch,
    frontier_keys,
)
from mvsink.core.rows import parse_row_schema
from mvsink.core.settings import FOLD_INTERVAL, shard_poll_due
from mvsink.io.config import Config
from mvsink.io.host import serve_sinks
from mvsink.io.kafka import (
    Reader,
    TopicMismatch,
    client_config,
    consumer_config,
    delete_below,
    desired_refusal,
    drain,
    last_message,
    ownership,
    partition_refusal,
    produce,
    tail_consumer,
    topic_configs,
)
from mvsink.io.service import Stopping, probe_store, writer_identity
from mvsink.io.sinks import DROPPED
from mvsink.io.spark import driver_host, live_executors, run_pinned, task_slots
from mvsink.shard import AsOfBeforeSince, Shard, open_shard
from mvsink.shard.blob import SYSTEM, Clock
from services.write import checkpoint
from services.write.affinity import groups, place
from services.write.chain import (
    AdvanceDesired,
    Chains,
    Cleared,
    Command,
    Continued,
    LogRebuilt,
    ReadLatest,
    Refold,
    ReportGone,
)
from services.write.compactor import Compactor
from services.write.resident import Crew, SharedCrew
from services.write.state import (
    Gone,
    HoldTarget,
    Keep,
    Outdated,
    Ran,
    StageJob,
    WriteState,
    is_stale,
    lease_due,
)
from services.write.task import SinkSpec, StepResult, StepSpec, one_shot, warm_up

log = logging.getLogger("mvsink.write")
#: A staged batch still unappended after this share of `max_part_age` is staged again: the
#: shard refuses parts older than that bound (append then waits for fresh ones), so the sink
#: does not stall after an append or S3 outage longer than the bound.
RESTAGE_AFTER = 0.5
#: How often the driver moves its reader lease up to what its partitions have folded (each move
#: is one small state version; since trails the folds by about this much).
HOLD_INTERVAL = 1.0

BATCHES = Counter("mvsink_write_batches", "StagedBatches sent", ["sink"])
PARTS = Counter("mvsink_write_parts", "Parts staged", ["sink"])
CORRECTIONS = Gauge(
    "mvsink_write_corrections", "Correction rows per partition", ["sink", "partition"]
)
DEAD = Counter("mvsink_write_dead_letters", "Desired records quarantined", ["sink"])
READ_BACK = Counter(
    "mvsink_write_read_back_bytes", "Bytes of shard parts read back from object storage", ["sink"]
)
GONE = Gauge(
    "mvsink_write_desired_gone",
    "1 while a desired partition's records its checkpoint needs are deleted (nothing staged)",
    ["sink", "partition"],
)
REFUSED = Gauge(
    "mvsink_write_desired_refused",
    "1 while the desired topic's configuration is refused (compacted: nothing folded or staged)",
    ["sink"],
)
TRIMMED = Gauge(
    "mvsink_write_desired_log_start",
    "Log start offset of a desired partition after the write service's last trim",
    ["sink", "partition"],
)
WRITTEN = Counter(
    "mvsink_write_written_bytes", "Bytes written to object storage (parts, checkpoints)", ["sink"]
)


class WriteShell:
    """Kafka, S3 and Spark around a `WriteState`."""

    def __init__(
        self,
        config: Config,
        stopping: Stopping,
        clock: Clock = SYSTEM,
        spark: Any = None,
        crew: SharedCrew | None = None,
    ) -> None:
        self.config = config
        #: A host's Spark session, shared with its other sinks (None: this driver's own).
        self.shared_spark = spark
        self.stopping = stopping
        self.clock = clock
        self.writer_id = writer_identity(config, "write")
        self.shard: Shard = open_shard(config.shard_id, None, config.s3, config.shard_timing())
        self.row_schema = (
            parse_row_schema(config.row_schema) if config.row_schema else self.shard.schema
        )
        self.framing = config.framing()
        self.producer = Producer(client_config(config.kafka_bootstrap))
        #: The sink's checkpoints in object storage (`services.write.checkpoint`).
        self.checkpoints = checkpoint.Checkpoints.of(config.s3)
        # The persist frontier starts at the sink's `as_of` (the seed's
        # `advance_persist_frontiers_at_startup`): the first description's lower is `as_of`, and
        # on a shard whose upper is still before it, append moves the upper there first.
        self.state = WriteState(
            config.sink_id,
            config.partitions,
            config.read_only,
            persist_frontier=Frontier.at(config.as_of),
            staged_at=clock.monotonic(),
        )
        #: Each owned partition's checkpoint chain (`services.write.chain`).
        self.chains = Chains.starting(config.desired_trim_interval, clock.monotonic())
        #: What every step of the sink shares (`services.write.task`).
        self.sink = SinkSpec(
            sink_id=config.sink_id,
            shard_id=config.shard_id,
            partitions=config.partitions,
            partitioning=config.partitioning,
            bootstrap=config.kafka_bootstrap,
            desired_topic=config.topics.desired,
            dead_letter_topic=config.topics.dead_letter,
            s3=config.s3,
            row_schema=self.row_schema,
            as_of=config.as_of,
            writer_id=self.writer_id,
            schema_registry_url=config.schema_registry_url,
            max_record_bytes=config.max_record_bytes,
        )
        #: The lease keeper's own handle, and what it holds (`_hold_target`, set by the loop).
        self.lease_shard = open_shard(config.shard_id, None, config.s3, config.shard_timing())
        self.target: HoldTarget = (None, {})
        self.lease_stop = threading.Event()
        self.spark: Any = None
        self.compactor: Compactor | None = None
        #: The resident tasks the steps run in (`services.write.resident`), if enabled.
        self.crew: Crew | SharedCrew | None = None
        #: A host's crew, shared with its other sinks' drivers (None: this driver's own).
        self.shared_crew = crew
        #: Why the desired topic's configuration is refused (`desired_refusal`), if it is, and
        #: when it is next checked (`_maybe_check_topic`).
        self.refused: str | None = None
        self.next_topic_check = 0.0
        #: The admin client the topic checks ask through (made at the first).
        self.admin: AdminClient | None = None

    # -- ownership --------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.pause(partitions)
        for tp in partitions:
            latest = self.checkpoints.collect_superseded(self.config.sink_id, tp.partition)
            self.chains.gain(tp.partition, latest, self._hold_at_gain(tp.partition, latest))
        self.state.set_owned(self.chains.owned)
        self._lead_compaction()
        log.info(
            "desired partitions assigned: %s (checkpoints %s)",
            sorted(self.chains.owned),
            {p: c.expected for p, c in sorted(self.chains.chains.items())},
        )

    def _hold_at_gain(self, partition: int, latest: int) -> Frontier | None:
        """`hold_at_gain` for a partition just assigned; None if it failed (S3 unavailable: the
        lease keeper holds the partition once a version this driver creates is durable)."""
        try:
            return hold_at_gain(
                self.checkpoints, self.shard, self.config.sink_id, self.writer_id, partition, latest
            )
        except Exception as error:
            log.warning("partition %d: taking its critical hold failed: %r", partition, error)
            return None

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._dispatch(self.chains.lose(tp.partition))
            self._show_gone(tp.partition)
        self.state.set_owned(self.chains.owned)
        self._lead_compaction()
        log.info("desired partitions revoked: %s", sorted(tp.partition for tp in partitions))

    def _lead_compaction(self) -> None:
        """The driver owning desired partition 0 collects the shard's garbage (one per sink
        replica, read-only or not), and merges its batches unless read-only (merges write
        data) or `[shard] compaction` is off."""
        if self.compactor is None:
            return
        for event, on in (
            (self.compactor.enabled, 0 in self.chains.owned),
            (self.compactor.merging, self.config.compaction and not self.state.read_only),
        ):
            if on:
                event.set()
            else:
                event.clear()

    # -- the reader lease ---------------------------------------------------------------------

    def _hold_target(self) -> HoldTarget:
        """Where this driver's lease holds `since`: the least upper its partitions' durable
        checkpoints have folded (the tasks read the shard's changes from there, or from a fold
        in memory past it, which merges keep distinct only at or after `since`), None (where it
        is) until every owned partition has one; and each owned partition's critical hold: its
        latest durable checkpoint's `persist_folded` (`Chains.hold_target`; the lease lapses
        when this driver is gone for longer than `reader_lease`; the holds stay, so the
        checkpoints stay valid)."""
        hold, holds = self.chains.hold_target()
        return hold, {checkpoint.holder_id(self.config.sink_id, p): f for p, f in holds.items()}

    def _hold(self, target: HoldTarget | None = None) -> bool:
        """Renew the lease and move the holds to `target` (default `self.target`; one version);
        whether it worked. Runs on the lease keeper's thread with its own shard handle, never
        waiting for a step: a step that runs longer than the lease must not let it lapse."""
        hold, holds = self.target if target is None else target
        try:
            try:
                self.lease_shard.lease(self.writer_id, hold, holds=holds)
            except AsOfBeforeSince:  # the lease expired and since moved on
                log.warning(
                    "reader lease of %s lapsed; holding the shard's since again", self.writer_id
                )
                self.lease_shard.lease(self.writer_id, holds=holds)
        except Exception as error:  # S3 unavailable: the lease outlives many retries
            log.warning("renewing the reader lease failed (retrying): %r", error)
            return False
        return True

    def _keep_lease(self) -> None:
        """The lease keeper: every `HOLD_INTERVAL` (at most a third of the lease) it `_hold`s
        when `lease_due` (the target moved, or a third of the lease passed since the last
        version it wrote), every second after a failure, until the driver stops. An idle
        driver writes a version a third of a lease, not a second."""
        lease = self.config.shard_reader_lease
        interval = min(HOLD_INTERVAL, lease / 3)
        delay, last = interval, None
        while not self.lease_stop.wait(delay):
            target, now = self.target, self.clock.monotonic()
            if not lease_due(last, target, now, lease):
                delay = interval
            elif self._hold(target):
                delay, last = interval, (target, now)
            else:
                delay = 1.0

    def _latest_checkpoint(self, partition: int) -> int:
        return self.checkpoints.latest(self.config.sink_id, partition)

    # -- the chains' commands -------------------------------------------------------------------

    def _dispatch(self, commands: list[Command]) -> None:
        """Do what the chains say (`services.write.chain.Command`): read, log, show."""
        for command in commands:
            match command:
                case AdvanceDesired(partition=partition, frontier=frontier):
                    self.state.advance_desired_frontier(partition, frontier)
                case ReadLatest(partition=partition):
                    latest = self._latest_checkpoint(partition)
                    self._dispatch(self.chains.absorb_latest(partition, latest))
                case Continued(partition=partition, version=version):
                    # Another owner (a replica before a rebalance revokes it here), or a lost
                    # attempt of this driver's own task (its executor died after
                    # checkpointing, Spark ran the task again): continue from the newest.
                    log.warning(
                        "partition %d was checkpointed by another owner or a lost task "
                        "attempt: continuing from version %d",
                        partition,
                        version,
                    )
                case Refold(partition=partition, was=was, version=version):
                    log.warning(
                        "partition %d: checkpoint version %s -> %d (repaired?): folding it again",
                        partition,
                        was,
                        version,
                    )
                case ReportGone(partition=partition, gone=gone):
                    log.error("%s", gone.message)
                    self._show_gone(partition)
                case Cleared(partition=partition):
                    log.info(
                        "partition %d: its checkpoint no longer needs deleted desired records",
                        partition,
                    )
                    self._show_gone(partition)
                case LogRebuilt(partition=partition):
                    log.warning(
                        "partition %d rebuilt its corrections from all of desired: the shard's "
                        "since had passed its checkpoint",
                        partition,
                    )

    # -- the desired topic's life cycle ---------------------------------------------------------

    def _show_gone(self, partition: int) -> None:
        """Show whether `partition`'s needed desired records are gone; readiness says why."""
        gone: dict[int, Gone] = self.chains.gone()
        GONE.labels(self.config.sink_id, str(partition)).set(1 if partition in gone else 0)
        self._show_blocked()

    def _show_blocked(self) -> None:
        """Readiness: why nothing is staged (a refused topic, partitions whose records are
        gone), or ready."""
        reasons = [] if self.refused is None else [self.refused]
        reasons += [
            f"desired partition {p}: records from offset {g.needed} are needed but "
            f"deleted below {g.log_start} (run `mvsink repair {self.config.sink_id}`)"
            for p, g in sorted(self.chains.gone().items())
        ]
        self.stopping.blocked("; ".join(reasons) or None)

    def _maybe_check_topic(self) -> None:
        """Every `topic_check_interval`, check the desired topic's configuration
        (`desired_refusal`): while it is refused the loop folds and stages nothing. A partition
        count other than `partitions` raises `TopicMismatch`: P is a start setting.

        The check is due by this driver's clock, so a driver paused longer than the interval
        checks before its next step. What it cannot see: the log cleaner removing records between
        a change of the policy and the next check, read by a step already under way (a kept
        reader reads the partition's newest records, which stay in the active segment the
        cleaner never touches). A check that fails (Kafka unavailable) leaves the verdict as
        it was and is tried again next loop."""
        now = self.clock.monotonic()
        if now < self.next_topic_check:
            return
        topic = self.config.topics.desired
        try:
            if self.admin is None:
                self.admin = AdminClient(client_config(self.config.kafka_bootstrap))
            refused = desired_refusal(topic, topic_configs(self.admin, topic, 10))
            count = len(self.admin.list_topics(topic, timeout=10).topics[topic].partitions)
        except Exception as error:
            log.warning("checking the configuration of %s failed (retrying): %r", topic, error)
            return
        if (mismatch := partition_refusal(self.config, topic, count)) is not None:
            raise TopicMismatch(mismatch)  # partitions added while it runs: P is a start setting
        self.next_topic_check = now + self.config.topic_check_interval
        if refused != self.refused:
            if refused is not None:
                log.error("%s", refused)
            else:
                log.warning(
                    "topic %s is cleanup.policy=delete again: folding and staging resume", topic
                )
            self.refused = refused
            REFUSED.labels(self.config.sink_id).set(0 if refused is None else 1)
            self._show_blocked()

    def _recheck_gone(self) -> None:
        """A gone partition whose checkpoint version changed (repaired, or restored) is folded
        again before any staging (`Chains.absorb_latest`)."""
        for partition in self.chains.gone():
            self._dispatch(self.chains.absorb_latest(partition, self._latest_checkpoint(partition)))

    def _maybe_trim(self) -> None:
        """Delete each owned partition's desired records below the older of its two newest
        durable checkpoints (module docs, `Chains.trim_below`), every `desired_trim_interval`;
        failures are logged and retried next time."""
        below = self.chains.trim_below(self.clock.monotonic())
        if below is None:
            return
        interval = self.config.desired_trim_interval
        bootstrap, topic = self.config.kafka_bootstrap, self.config.topics.desired
        try:
            for partition in below:
                # Never the partition's last record, its latest Progress: a new publishing
                # producer reads it to tell whether its publish was already committed.
                last = last_message(bootstrap, topic, partition)
                if last is not None:
                    below[partition] = min(below[partition], int(last.offset() or 0))
            starts = delete_below(bootstrap, topic, below)
        except Exception as error:
            log.warning(
                "deleting desired records below the checkpoints failed (retrying in %.0fs): %r",
                interval,
                error,
            )
            return
        for partition, start in starts.items():
            TRIMMED.labels(self.config.sink_id, str(partition)).set(start)
        if starts:
            log.debug("desired records deleted below %s", starts)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        from mvsink.io.spark import spark_session

        if self.shared_spark is None:
            self.spark = spark_session(f"mvsink-write-{self.config.sink_id}", config=self.config)
        else:  # this thread's jobs run in the sink's own fair-scheduler pool
            self.spark = self.shared_spark
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", self.config.sink_id)
        self.target = self._hold_target()
        self._hold()  # before any task reads the shard
        keeper = threading.Thread(target=self._keep_lease, name="write-lease", daemon=True)
        keeper.start()
        owner: Consumer | None = None
        follow: list[Reader] = []
        try:  # everything from here is released on the way out, however it fails
            self.compactor = Compactor(self.config, self.writer_id, self.spark)
            self.compactor.start()
            self._warm_up()
            if self.config.spark_residents:
                if self.shared_crew is not None:
                    self.shared_crew.join()  # left in `dismiss` on the way out
                self.crew = self.shared_crew or Crew(
                    self.spark, driver_host(self.config.spark_driver_host)
                )
                executors = live_executors(self.spark)
                if executors:  # before the first step, which then finds them connected
                    self.crew.launch(sorted(executors), self._slots(executors))
            topics = self.config.topics
            owner = Consumer(
                consumer_config(
                    self.config.kafka_bootstrap,
                    group_id=f"{self.config.sink_id}.write",
                    extra=ownership(self.config.max_poll_interval),
                )
            )
            owner.subscribe([topics.desired], on_assign=self._on_assign, on_revoke=self._on_revoke)
            follow = [
                tail_consumer(self.config.kafka_bootstrap, t)
                for t in (topics.descs, topics.frontiers, topics.control)
            ]
            own_keys = frontier_keys(
                self.config.sink_id, self.config.partitions, self.config.shard_id
            )
            polled: float | None = None
            last_fold, folded = self.clock.monotonic(), None
            log.info(
                "write %s started as %s, read_only=%s",
                self.config.sink_id,
                self.writer_id,
                self.state.read_only,
            )
            while not self.stopping.stopped:
                owner.poll(0)  # group membership and (re)assignment only
                # Wait on `descs`, where the next job comes from, not on the ownership consumer:
                # a description is acted on as it arrives instead of up to 50 ms later.
                for consumer, wait, keys in zip(
                    follow, (0.05, 0.0, 0.0), (None, own_keys, None), strict=True
                ):
                    self._absorb(consumer, wait, keys)
                desc, state = self.state.batch_description, self.state
                working = desc is not None and bool(state.owned) and not state.read_only
                if shard_poll_due(polled, self.clock.monotonic(), working):
                    self.state.advance_persist_frontier(self.shard.upper())
                    polled = self.clock.monotonic()
                self.target = self._hold_target()
                if self.crew is not None:
                    self.crew.maybe_step_aside()  # an idle crew must not starve a merge
                self.stopping.report(
                    state.persist_frontier.time, desc.upper.time if desc and working else None
                )
                self._maybe_restage()
                self._maybe_trim()
                self._maybe_check_topic()
                if self.refused is not None:  # nothing is folded until the topic is fixed
                    continue
                gained = self.chains.unchecked()
                if gained:
                    # A gained partition's first fold: checkpointed after the first append
                    # (`Deferred`; read-only mode stages none, so it checkpoints its folds).
                    self._fold(gained)
                    last_fold = self.clock.monotonic()
                    continue
                if self.chains.gone():  # nothing is staged until they are repaired
                    if self.clock.monotonic() - last_fold > FOLD_INTERVAL:
                        self._recheck_gone()
                        last_fold = self.clock.monotonic()
                    continue
                job = None if self.state.read_only else self.state.maybe_start_batch()
                if job is not None:
                    self._stage(job)
                    last_fold, folded = self.clock.monotonic(), None
                elif (
                    self.state.owned
                    and self.clock.monotonic() - last_fold > FOLD_INTERVAL
                    and self.state.fold_view() != folded
                ):
                    folded = self.state.fold_view()
                    self._fold()
                    last_fold = self.clock.monotonic()
        finally:
            if self.crew is not None:
                self.crew.dismiss()
            self._confirm_pending()
            if self.compactor is not None:
                self.compactor.stop()
            self.lease_stop.set()
            keeper.join(timeout=30)
            # The keeper moves the critical holds up to a second after a checkpoint: move them
            # to the last checkpoints now, so a stop right after the first ones leaves them held.
            # (A driver paused past its lease loses only the lease: critical holds never expire,
            # so the checkpoints they hold stay valid; test_desired_lifecycle pauses one.)
            self.target = self._hold_target()
            self._hold()
            try:
                self.shard.release(self.writer_id)
            except Exception as error:
                log.warning("releasing the reader lease failed (it expires): %r", error)
            if owner is not None:
                owner.close()
            for consumer in follow:
                consumer.close()
            self.producer.flush(10)
            if self.shared_spark is None:
                self.spark.stop()
            if self.stopping.why == DROPPED:  # last: closing the group may assign, which holds
                self._release_holds()
        return 0

    def _release_holds(self) -> None:
        """A dropped sink's checkpoints are needed no more: release every critical hold of the
        sink, those this driver (or its keeper) set again after `mvsink sink drop` released
        them included. A driver killed before it gets here leaves them: `mvsink sink release`."""
        prefix = checkpoint.holder_id(self.config.sink_id, 0).removesuffix("p0")
        try:
            held = [h.holder_id for h in self.shard.state().holds if h.holder_id.startswith(prefix)]
            if held:
                self.shard.release_holds(held)
                log.info("sink dropped: released its holds %s", held)
        except Exception as error:
            log.warning("releasing the dropped sink's holds failed: %r", error)

    def _absorb(
        self, consumer: Reader, wait: float = 0.0, keys: frozenset[bytes] | None = None
    ) -> None:
        """Absorb all that `consumer` has (only `keys`, when given), a backlog included: a
        driver that has just started reads a shared `frontiers` from its start, which read 500
        records a loop (each loop waiting on `descs`) would hold its first descriptions back for
        seconds, and which decoded whole (every sink's records) would hold them back again."""
        for message, record in drain(consumer, wait, None, keys, framing=self.framing):
            match record:
                case BatchDescription(sink_id=sink) if sink == self.config.sink_id:
                    self.state.absorb_batch_description(record)
                case DesiredProgress(sink_id=sink) if sink == self.config.sink_id:
                    self.state.advance_desired_frontier(record.partition, record.frontier)
                case ShardUpper(shard_id=shard) if shard == self.config.shard_id:
                    self.state.advance_persist_frontier(record.upper)
                case SinkControl(read_only=False) if message.key() == self.config.sink_id.encode():
                    if self.state.allow_writes():
                        log.info("write %s promoted: staging allowed", self.config.sink_id)
                        self._lead_compaction()

    # -- jobs -------------------------------------------------------------------------------

    def _specs(self, partitions: tuple[int, ...], job: StageJob | None) -> list[StepSpec]:
        """A step of each of `partitions`, staging `job`'s description or only folding, from
        and checkpointing as its chain says (`Chains.spec`)."""
        desc = None if job is None else job.desc
        specs = []
        for p in partitions:
            plan = self.chains.spec(p, desc is not None, self.state.read_only)
            specs.append(StepSpec(self.sink, p, plan.version, desc, plan.mode, plan.durable))
        return specs

    def _warm_up(self) -> None:
        """Import the task code in every executor slot; log where the executors got it."""
        slots = self.spark.sparkContext.defaultParallelism
        started = self.clock.monotonic()
        found = set(self.spark.sparkContext.parallelize(range(slots), slots).map(warm_up).collect())
        log.info(
            "Spark %s: executors %s warmed up in %.2fs, code from %s, %d task slots",
            self.spark.sparkContext.master,
            sorted({e for e, _ in found}),
            self.clock.monotonic() - started,
            sorted({c for _, c in found}),
            task_slots(self.spark),
        )

    def _run(self, specs: list[StepSpec]) -> list[StepResult]:
        """Run `specs` on their partitions' home executors (`services.write.affinity`): in the
        resident tasks while they serve, else (and whatever they hand back) as a Spark job."""
        executors = live_executors(self.spark)
        home = self.chains.home
        placement = place((s.partition for s in specs), home, executors)
        by_partition = {s.partition: s for s in specs}
        slots = self._slots(executors)
        work = [
            ([by_partition[p] for p in group], executor)
            for group, executor in groups(placement, slots)
        ]
        results: list[StepResult] = []
        if self.crew is not None:
            results, work = self.crew.run(work, sorted(executors), slots)
        if work:
            results += run_pinned(self.spark, work, one_shot)
        moved = {
            r.partition: f"{home[r.partition]} -> {r.executor}"
            for r in results
            if home.get(r.partition, r.executor) != r.executor
        }
        if moved:
            log.info("partitions moved between executors: %s (alive: %s)", moved, sorted(executors))
        for result in results:
            self._absorb_result(result, by_partition[result.partition].desc is not None)
        return results

    def _slots(self, executors: dict[str, str]) -> int:
        """Task slots per executor: one wave of tasks a job (`defaultParallelism`, twice the
        cores, would make two)."""
        return max(1, task_slots(self.spark) // len(executors))

    def _absorb_result(self, result: StepResult, staging: bool = False) -> None:
        """What a step (a `staging` one, or a fold) tells the driver: its chain's
        (`Chains.absorb_result`: home, version, what is durable, desired frontier), and the
        metrics."""
        owned = result.partition in self.chains.owned
        self._dispatch(self.chains.absorb_result(result, staging))
        if owned:
            self._show_gone(result.partition)
        CORRECTIONS.labels(self.config.sink_id, str(result.partition)).set(result.corrections)
        DEAD.labels(self.config.sink_id).inc(result.dead_letters)
        READ_BACK.labels(self.config.sink_id).inc(result.bytes_read_back)
        WRITTEN.labels(self.config.sink_id).inc(result.bytes_written)

    def _confirm_pending(self) -> None:
        """On the way out, after the residents waited for their creates under way: a pending
        version (`Pending`) that now exists is durable, so the final holds follow it
        (`_hold`)."""
        for partition, version in self.chains.unconfirmed():
            try:
                meta = self.checkpoints.read_meta(self.config.sink_id, partition, version)
            except Exception as error:  # the holds stay at the older checkpoint: still valid
                log.warning(
                    "partition %d: reading checkpoint %d failed: %r", partition, version, error
                )
                continue
            if meta is not None:
                folded = Frontier.from_elements(meta["persist_folded"])
                self.chains.absorb_created(partition, version, folded)

    def _maybe_restage(self) -> None:
        """Stage the current description again when its batch stayed unappended for
        `RESTAGE_AFTER` of `max_part_age` (module docs of `services.append.state.TooOld`)."""
        now, staged_at = self.clock.monotonic(), self.state.staged_at
        if self.state.maybe_restage(now, RESTAGE_AFTER * self.config.shard_max_part_age):
            log.warning(
                "%s staged %.0fs ago and still not appended: staging it again",
                self.state.batch_description,
                now - staged_at,
            )

    def _stage(self, job: StageJob) -> None:
        started = self.clock.monotonic()
        results = self._run(self._specs(job.partitions, job))
        ran = self.clock.monotonic() - started
        if any(
            isinstance(r.outcome, Ran) and isinstance(r.outcome.batch, Outdated) for r in results
        ):
            log.info("%s is outdated (the shard moved on): nothing reported", job.desc)
            return
        gone = sorted(r.partition for r in results if isinstance(r.outcome, Gone))
        if gone:
            log.error(
                "%s: desired records of partitions %s are gone: nothing reported", job.desc, gone
            )
            return
        kept = [r for r in results if not is_stale(r.outcome)]
        covered = tuple(r.partition for r in kept)
        parts = tuple(r.part for r in kept if r.part is not None)
        if not covered:
            return
        desc = job.desc
        batch = StagedBatch(
            desc.id,
            desc.lower,
            desc.upper,
            covered,
            tuple(p.to_message() for p in parts),
            self.writer_id,
        )
        produce(
            self.producer,
            self.config.topics.batches,
            str(desc.append_worker),
            batch,
            desc.append_worker,
            framing=self.framing,
        )
        self.producer.flush(30)
        self.state.batch_staged(job, covered, self.clock.monotonic())
        if self.compactor is not None:
            self.compactor.poke()
        BATCHES.labels(self.config.sink_id).inc()
        PARTS.labels(self.config.sink_id).inc(len(parts))
        log.info(
            "staged %s: partitions %s, %d parts, %d updates in %.3fs (Spark job %.3fs, "
            "slowest task's steps: %s)",
            desc,
            list(covered),
            len(parts),
            sum(p.updates for p in parts),
            self.clock.monotonic() - started,
            ran,
            slowest_steps(results),
        )

    def _fold(self, partitions: tuple[int, ...] | None = None) -> None:
        """Fold `partitions` (every owned one by default) without staging (a gained partition's
        first fold without checkpointing, `Chains.spec`)."""
        partitions = tuple(sorted(self.state.owned)) if partitions is None else partitions
        started = self.clock.monotonic()
        specs = self._specs(partitions, None)
        first = bool(specs) and all(isinstance(s.mode, Keep) for s in specs)
        results = self._run(specs)
        log.info(
            "folded partitions %s%s: corrections %s in %.2fs (slowest task's steps: %s)",
            [r.partition for r in results],
            " (first fold: checkpointed after the first append)" if first else "",
            {r.partition: r.corrections for r in results},
            self.clock.monotonic() - started,
            slowest_steps(results),
        )


def hold_at_gain(
    checkpoints: checkpoint.Checkpoints,
    shard: Shard,
    sink_id: str,
    writer_id: str,
    partition: int,
    latest: int,
) -> Frontier:
    """Take `partition`'s critical hold before any of its steps runs, at what its newest
    checkpoint `latest` folded of the shard (at `since` for none, or for one `since` passed),
    in one lease version of `writer_id`; where it is held, the chain's `persist_folded` at gain.
    Without it the first checkpoints a driver creates would be unheld until its lease keeper's
    next round after them, and a keeper paused past the lease, or a driver killed in between,
    would leave them to `since` (invariant 0; `tests/sim` seed `unheld-first-checkpoints`)."""
    meta = checkpoints.read_meta(sink_id, partition, latest)
    folded = Frontier.from_elements(meta["persist_folded"]) if meta else Frontier.minimum()
    at = folded.join(shard.state().since)
    shard.lease(writer_id, holds={checkpoint.holder_id(sink_id, partition): at})
    return at


def slowest_steps(results: list[StepResult]) -> dict[str, float]:
    """Each step's seconds in the slowest task (`StepResult.seconds`): a job's profile."""
    return {
        step: max(r.seconds.get(step, 0.0) for r in results) for r in results for step in r.seconds
    }


def serve(
    config: Config, stopping: Stopping, spark: Any = None, crew: SharedCrew | None = None
) -> int:
    """Write for `config`'s sink until stopped, in its own Spark application or in `spark`
    with `crew` (a host's, shared with its other sinks)."""
    probe_store(config, "write")
    return WriteShell(config, stopping, spark=spark, crew=crew).run()


def run(config: Config, stopping: Stopping) -> int:
    """Entry point body for `python -m services.write`: one sink in its own Spark application,
    or every defined sink in one (`host`)."""
    if config.serve_sinks == "all":
        return host(config, stopping)
    return serve_sinks(config, stopping, "write", serve, exclusive=False)


def host(config: Config, stopping: Stopping) -> int:
    """Every defined sink's write driver in this process (`mvsink.io.host`; every replica
    serves every sink, whose `<sink>.write` group spreads its partitions), all steps in one
    Spark application under the fair scheduler, a pool per sink (`WriteShell.run`): one sink's
    long step (a hydration) shares the executors with the others' instead of queueing them.
    With `[spark] residents` the drivers share one crew of resident tasks, their rounds taking
    turns (`SharedCrew`), else each runs its steps as Spark jobs. Each driver writes as
    `<writer id>-<sink>` (its reader lease and part keys its own)."""
    from mvsink.io.spark import spark_session

    spark = spark_session("mvsink-write", config=config, conf={"spark.scheduler.mode": "FAIR"})
    jvm: Any = spark.sparkContext._jvm  # a pool per sink, made at its first job: no warning
    jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
        "org.apache.spark.scheduler.FairSchedulableBuilder",
        jvm.org.apache.logging.log4j.Level.ERROR,
    )
    base = writer_identity(config, "write")
    crew = None
    if config.spark_residents:
        crew = SharedCrew(Crew(spark, driver_host(config.spark_driver_host)))

    def unit(sink: Config, stopping: Stopping) -> int:
        return serve(replace(sink, writer_id=f"{base}-{sink.sink_id}"), stopping, spark, crew)

    try:
        return serve_sinks(config, stopping, "write", unit, exclusive=False)
    finally:
        if crew is not None:
            crew.close()
        spark.stop()

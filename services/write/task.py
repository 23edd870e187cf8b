"""The write task: what one Spark task does for one desired partition (runs on an executor).

Steps of `run_task`:
1. load the partition's correction state at the version the driver expects: this executor's
   (in memory, or its warm copy), else that version's checkpoint in object storage, else empty
   (`services.write.checkpoint`). If the shard's
   `since` has passed the upper the state folded (the driver's reader lease lapsed), merges may
   have collapsed the changes it still needs: start from empty instead (all of desired, the
   whole shard), keeping the version chain;
2. (`services.write.fold`) fold in new desired records (Kafka offsets from `folded_offset`,
   read_committed) as positive updates, until the partition's `Progress` reaches the batch's
   upper, waiting for it past the end (to the end in read-only mode); quarantine invalid ones
   to the dead-letter topic. A resident keeps the partition's reader for its next step;
3. fold in the shard's changes since the last fold (`persist_folded`) as negative updates:
   the batches overlapping `[persist_folded, upper)`, rows before `persist_folded` filtered out
   (a merged batch may start earlier; the driver's lease keeps the shard's `since` at or
   before `persist_folded`, so those rows are exact); a part a merge replaced meanwhile makes
   the fold start over from the latest state. Then advance times to the shard's upper and
   consolidate. A part this executor staged itself is
   not read back: the task kept what it wrote (`PartitionState.staged`) and negates that, so in
   steady state the read-back costs no object reads. Every other part (a racing replica's, a
   foreign writer's, ours after a restart or a move to another executor) is read;
4. for a batch description whose lower is the shard's upper: stage the corrections with
   time `< upper` as one part (none if there are none); written updates stay in the
   corrections until the read-back cancels them;
5. checkpoint the state as the next version (conditional create: a second owner loses;
   `services.write.checkpoint`).

A step that would have to read desired records the broker has deleted (a cold start or a
rebuild on a topic that no longer starts at offset 0, a checkpoint older than what is left)
stages nothing and checkpoints nothing: it reports the hole (`TaskResult.gone`) and the driver
holds the sink there until the checkpoints are repaired (`mvsink repair`). A step whose
expected version is no longer the newest checkpoint is stale before it starts such a read.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import pyarrow as pa

from mvsink.core.errors import DesiredGone, MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.settings import S3Settings
from mvsink.io.service import quiet_retries
from mvsink.io.spark import each_on_a_thread, executor_id, trim_worker_path
from mvsink.shard import PartGone, PartRef, Shard, ShardState, open_shard
from services.write import checkpoint
from services.write.fold import SincePassed, close_readers, fold_desired, fold_persist

log = logging.getLogger("mvsink.write.task")

# Executors import this module to run the tasks: keep per-task overhead down (see the docs).
trim_worker_path()


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs (pickled to the executor)."""

    sink_id: str
    shard_id: str
    partition: int
    partitions: int
    #: The desired partitioning function (`mvsink.core.partitioning`).
    partitioning: int
    bootstrap: str
    desired_topic: str
    dead_letter_topic: str
    s3: S3Settings
    row_schema: pa.Schema
    as_of: int
    writer_id: str
    #: The checkpoint version the driver expects to continue from (-1: none yet).
    version: int
    #: The batch to stage, or None to only fold and consolidate (read-only mode).
    lower: Frontier | None = None
    upper: Frontier | None = None


@dataclass(frozen=True)
class Gone:
    """Desired records a step needed were deleted (`mvsink.core.errors.DesiredGone`, as data: it
    travels back to the driver pickled)."""

    needed: int
    log_start: int
    message: str


@dataclass(frozen=True)
class TaskResult:
    """What a task reports back to the driver."""

    partition: int
    version: int
    part: PartRef | None
    folded_offset: int
    desired_frontier: Frontier
    persist_folded: Frontier
    corrections: int
    dead_letters: int
    #: Bytes read back from object storage: the checkpoint (unless this executor held the
    #: state) and the shard's parts (except the parts this executor staged and kept).
    bytes_read_back: int
    #: Bytes written to object storage: the staged part and the checkpoint.
    bytes_written: int
    #: The shard moved past the description's lower: nothing was staged.
    outdated: bool
    #: Another owner checkpointed this partition first: this task's work is void.
    stale: bool
    #: Seconds per step (load, desired, persist, consolidate, stage, checkpoint): the profile.
    seconds: dict[str, float] = field(default_factory=dict)
    #: The checkpoint was older than the shard's since: rebuilt from all of desired.
    rebuilt: bool = False
    #: The executor the task ran in (`mvsink.io.spark.executor_id`): the partition's new home.
    executor: str = "driver"
    #: Desired records it needed were gone: nothing was staged or checkpointed.
    gone: Gone | None = None


#: How often a fold starts over when merges replace the parts it is reading.
_READ_ATTEMPTS = 5
_SHARDS: dict[str, Shard] = {}


def run_task(spec: TaskSpec, shard_state: ShardState | None = None) -> TaskResult:
    """One desired partition's step (see the module docs), from `shard_state` (the shard's
    state read for the whole round) or the latest. A step that fails drops the state
    this Python worker holds in memory: the steps change it in place, so it may be half a step
    past its version, and the next attempt (a Spark retry, or the next step, in this reused
    worker) must load that version again (the executor's warm copy or the checkpoint).
    A step that finds the shard's `since` past its fold in a state it reads later than the
    round's (`SincePassed`, after a merge replaced a part it was reading) starts over from
    that version and the latest state, which rebuilds it."""
    try:
        for _ in range(_READ_ATTEMPTS):
            try:
                return _step(spec, shard_state)
            except SincePassed as error:
                checkpoint.CACHE.pop((spec.sink_id, spec.partition), None)
                log.warning("%s: starting the step over", error)
                shard_state = None
        raise MvsinkError(f"partition {spec.partition}: the shard's since kept passing its fold")
    except BaseException:
        checkpoint.CACHE.pop((spec.sink_id, spec.partition), None)
        raise


def _step(spec: TaskSpec, shard_state: ShardState | None) -> TaskResult:
    lap = _Laps()
    state, bytes_read = checkpoint.load(
        spec.sink_id, spec.partition, spec.version, spec.s3, spec.row_schema, spec.as_of
    )
    shard = _shard(spec)
    shard_state = shard_state or shard.state()
    rebuilt = checkpoint.since_passed(state.persist_folded, shard_state.since)
    if rebuilt and checkpoint.exists(spec.sink_id, spec.partition, spec.version + 1, spec.s3):
        # A driver that has not seen the newest checkpoint (which the critical hold protects):
        # its result would be stale anyway, and a rebuild would read all of desired.
        return _void(spec, state, lap, bytes_read)
    if rebuilt:
        log.warning("partition %d: shard since %s passed checkpoint %d (folded %s): rebuilding",
                    spec.partition, shard_state.since, state.version, state.persist_folded)  # fmt: skip
        why = (f"the shard's since {shard_state.since} passed checkpoint {state.version}'s "
               f"persist_folded {state.persist_folded}: a rebuild from all of desired")  # fmt: skip
        state = checkpoint.empty(spec.row_schema, spec.as_of, state.version)
    elif state.version < 0:
        why = "the partition has no checkpoint: a cold start reads all of desired"
    else:
        why = f"checkpoint {state.version} folded it up to there"
    lap("load")
    try:
        dead = fold_desired(spec.bootstrap, spec.desired_topic, spec.dead_letter_topic,
                            spec.partition, spec.row_schema, spec.partitioning, state,
                            spec.upper, sink_id=spec.sink_id, why=why)  # fmt: skip
    except DesiredGone as error:
        checkpoint.CACHE.pop((spec.sink_id, spec.partition), None)  # folded nothing, but unsure
        if checkpoint.exists(spec.sink_id, spec.partition, spec.version + 1, spec.s3):
            return _void(spec, state, lap, bytes_read)
        gone = Gone(error.needed, error.log_start, str(error))
        return _void(spec, state, lap, bytes_read, gone)
    lap("desired")
    for _ in range(_READ_ATTEMPTS):
        try:
            bytes_read += fold_persist(spec.partition, spec.partitions, spec.partitioning, state,
                                       shard, shard_state)  # fmt: skip
            break
        except PartGone:  # a merge replaced what we were reading: same contents, newer parts
            shard_state = shard.state()
    else:
        raise PartGone(f"partition {spec.partition}: shard parts kept vanishing")
    lap("persist")
    state.correction.advance_since(shard_state.upper)
    state.correction.consolidate()
    lap("consolidate")
    part, outdated = None, False
    if spec.lower is not None and spec.upper is not None:
        if shard_state.upper != spec.lower:
            outdated = True
        else:
            updates = state.correction.updates_before(spec.upper)
            if updates.num_rows:
                part = shard.stage(updates, spec.lower, spec.upper, spec.writer_id,
                                   spec.partition, spec.partitions, spec.partitioning)  # fmt: skip
                state.staged[part.key] = (spec.upper, updates)
    lap("stage")
    checkpointed = checkpoint.save(spec.sink_id, spec.partition, spec.s3, spec.writer_id, state)
    lap("checkpoint")
    return TaskResult(spec.partition, state.version, part, state.folded_offset,
                      state.desired_frontier, state.persist_folded, len(state.correction),
                      dead, bytes_read, (part.bytes if part else 0) + (checkpointed or 0),
                      outdated, checkpointed is None, lap.seconds, rebuilt,
                      executor_id())  # fmt: skip


def _void(spec: TaskSpec, state: checkpoint.PartitionState, lap: _Laps, bytes_read: int,
          gone: Gone | None = None) -> TaskResult:  # fmt: skip
    """A step that staged and checkpointed nothing: stale (a newer checkpoint exists), or
    `gone` (the desired records it needed were deleted)."""
    lap("desired")
    return TaskResult(spec.partition, spec.version, None, state.folded_offset,
                      state.desired_frontier, state.persist_folded, len(state.correction), 0,
                      bytes_read, 0, False, gone is None, lap.seconds, False, executor_id(),
                      gone)  # fmt: skip


def warm_up(_: object) -> tuple[str, str]:
    """A no-op task: unpickling it imports this module (Arrow, Kafka, S3 clients) into the
    executor's Python worker, so the first real job after a start does not pay for that. Its
    executor, and where it imported the code from (the shipped zip on a cluster)."""
    import mvsink

    return executor_id(), os.path.dirname(os.path.dirname(mvsink.__file__ or ""))


def run_tasks(specs: list[TaskSpec]) -> list[TaskResult]:
    """`run_task` for each of `specs` (one Spark task or resident round covering several
    partitions) from one read of the shard's state, each on its own thread, each result's
    `seconds["task"]` the whole task's.
    The steps wait on Kafka and S3 for much of their time, and Arrow releases the GIL: with
    resident tasks a thread per partition was measured at 933k against 834k updates/s
    (medians of 5 bench runs each; with a Spark job per batch it had been no faster). The
    partitions share nothing but this worker's caches (keyed by partition) and clients; a
    failed step drops only its own partition's state (`run_task`), and its error is raised
    once the other steps have ended."""
    quiet_retries()  # one line per outage, not librdkafka's per reconnect (this worker too)
    started = time.monotonic()
    close_readers(keep={(s.bootstrap, s.desired_topic, s.partition) for s in specs})
    # The shard's state once for the round, not once a partition (each read probes the state
    # log for versions newer than the last seen: a few GETs, ~10 ms, on every step's path).
    shards = {spec.shard_id: spec for spec in specs}
    shard_states = {shard_id: _shard(spec).state() for shard_id, spec in shards.items()}
    results = each_on_a_thread(lambda spec: run_task(spec, shard_states[spec.shard_id]), specs,
                               "write-step")  # fmt: skip
    took = round(time.monotonic() - started, 4)
    for result in results:  # the whole Spark task's wall clock, beside its steps
        result.seconds["task"] = took
    return results


class _Laps:
    """Wall-clock seconds per named step, for the driver's log."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.last = time.monotonic()

    def __call__(self, step: str) -> None:
        now = time.monotonic()
        self.seconds[step] = round(now - self.last, 4)
        self.last = now


def _shard(spec: TaskSpec) -> Shard:
    shard = _SHARDS.get(spec.shard_id)
    if shard is None:
        shard = _SHARDS[spec.shard_id] = open_shard(spec.shard_id, None, spec.s3)
    return shard

"""The write task: what one Spark task does for one desired partition (runs on an executor).

A step is one `StepSpec` (a partition, the checkpoint version to continue from, the batch
description or none) of one `SinkSpec` (what every step of the sink shares), run in a
`WriteWorker`: what the Python worker keeps from step to step (states, desired readers, shard
handles). Its decisions are `services.write.state`'s (`plan_start`, `plan_batch`); the steps
of `run_task` apply them:
0. wait for the partition's pipelined create under way in this Python worker, if any: lost to
   another owner, the step is stale;
1. load the partition's correction state at the version the driver expects: this executor's
   (in memory, or its warm copy), else that version's checkpoint in object storage, else empty
   (`services.write.checkpoint`). If the shard's `since` has passed the upper the state folded
   (`Rebuild`: the driver's reader lease lapsed), merges may have collapsed the changes it
   still needs: start from empty instead (all of desired, the whole shard), keeping the
   version chain;
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
4. for a batch description whose lower is the shard's upper, or the sink's `as_of` while the
   upper is before it (`Stage`; else `Outdated`, or
   `FoldOnly` without one): stage the corrections with time `< upper` as one part (none if
   there are none); written updates stay in the corrections until the read-back cancels them;
5. checkpoint the state as `StepSpec.mode` says (`services.write.state.CheckpointMode`):
   `Inline`, the next version (conditional create: a second owner loses, `Lost`;
   `services.write.checkpoint`); `Keep`, none, for a gained partition's first fold and first
   staging step: that state stays in the executor, and the step after the first batch's append
   writes what the read-back left of the corrections, not the whole load the first part held;
   `Pipelined`, a resident's staging step starts the create and reports (`Pending`); the
   partition's next step here waits for it first (step 0).

A step that would have to read desired records the broker has deleted (a cold start or a
rebuild on a topic that no longer starts at offset 0, a checkpoint older than what is left)
stages nothing and checkpoints nothing: it reports the hole (`Gone`) and the driver holds the
sink there until the checkpoints are repaired (`mvsink repair`). A step whose expected version
is no longer the newest checkpoint is `Stale` before it starts such a read. What became of a
step is its `StepResult.outcome` (`services.write.state.StepOutcome`).

Python workers are reused: a one-shot task's steps (`one_shot`) run in the Python worker's
`PROCESS.worker()`, a resident's in `WriteWorker.resident()` of it (the same states in memory,
warm copies deferred until it leaves, desired readers kept), passed to `run_tasks` explicitly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from mvsink.core.errors import DesiredGone, MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription
from mvsink.core.settings import S3Settings
from mvsink.core.updates import MAX_RECORD_BYTES
from mvsink.io.registry import Framings
from mvsink.io.service import quiet_retries
from mvsink.io.spark import each_on_a_thread, executor_id, trim_worker_path
from mvsink.shard import PartGone, PartRef, Shard, ShardState, open_shard
from services.write import checkpoint
from services.write.checkpoint import Checkpoints, PartitionState, StateCache
from services.write.fold import Readers, SincePassed, fold_desired, fold_persist
from services.write.state import (
    CheckpointMode,
    CheckpointOutcome,
    Created,
    FoldOnly,
    Gone,
    Inline,
    Keep,
    Kept,
    Lost,
    Outdated,
    Pending,
    Pipelined,
    Ran,
    Rebuild,
    Stage,
    Stale,
    StepBatch,
    StepOutcome,
    plan_batch,
    plan_start,
)

log = logging.getLogger("mvsink.write.task")


@dataclass(frozen=True)
class SinkSpec:
    """What every step of one sink shares (pickled to the executor with its steps)."""

    sink_id: str
    shard_id: str
    #: P, the number of desired partitions.
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
    #: The Schema Registry the driver's configuration names ("" for none): the executor looks
    #: registry-framed desired records' schema ids up in it (`mvsink.io.registry`).
    schema_registry_url: str = ""
    #: The most bytes one desired record may decode to (`[sink] max_record_bytes`).
    max_record_bytes: int = MAX_RECORD_BYTES


@dataclass(frozen=True)
class StepSpec:
    """One step of one desired partition (pickled to the executor)."""

    sink: SinkSpec
    partition: int
    #: The checkpoint version the driver expects to continue from (-1: none yet).
    version: int
    #: The batch to stage, or None to only fold and consolidate (read-only mode, a gained
    #: partition's first fold).
    desc: BatchDescription | None = None
    #: How the step checkpoints its state, as the driver's chain says
    #: (`services.write.chain.Chains.spec`): `Inline`; `Keep` for a gained partition's first
    #: fold and first staging step (its state stays in the executor at `version`,
    #: `checkpoint.keep`, and the driver moves neither the partition's critical hold nor its
    #: kept desired offsets for it); `Pipelined` for staging steps of a chain the driver has
    #: itself continued (invariant 4 of `services.write`: the create runs while the batch is
    #: appended, and the partition's next step in this Python worker waits for it before
    #: anything else), which a one-shot task runs inline.
    mode: CheckpointMode = field(default_factory=Inline)
    #: The newest version the driver knows was created (None: `version`). Below `version`
    #: when the step before reported while its create was under way (`Pending`): a step that
    #: finds `version` never created continues from this one (`Checkpoints.load`).
    durable: int | None = None


@dataclass(frozen=True)
class StepResult:
    """What a step reports back to the driver."""

    partition: int
    #: The partition's checkpoint version after the step (the expected one if it wrote none).
    version: int
    folded_offset: int
    desired_frontier: Frontier
    persist_folded: Frontier
    corrections: int
    dead_letters: int
    #: Bytes read back from object storage: the checkpoint (unless this executor held the
    #: state) and the shard's parts (except the parts this executor staged and kept).
    bytes_read_back: int
    #: Bytes written to object storage: the staged part, an inline checkpoint, and a pipelined
    #: create confirmed since the partition's last result (`confirmed`): each once.
    bytes_written: int
    #: What became of the step: it `Ran` (where it started, what it did with its description,
    #: its part and its checkpoint's outcome: `Created` is durable, so the driver may move the
    #: partition's critical hold to `persist_folded` and keep desired from `folded_offset`), or
    #: it was `Stale`, or the desired records it needed were `Gone`.
    outcome: StepOutcome
    #: A pipelined create this Python worker found done since the partition's last result:
    #: that version is durable, with what its state had folded (what `Created` says of this
    #: step's own).
    confirmed: checkpoint.Confirmed | None = None
    #: The executor the step ran in (`mvsink.io.spark.executor_id`): the partition's new home.
    executor: str = "driver"
    #: Seconds per step (load, desired, persist, consolidate, stage, checkpoint, and the whole
    #: task's): the profile.
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def part(self) -> PartRef | None:
        """The part the step staged, if any."""
        return self.outcome.part if isinstance(self.outcome, Ran) else None


@dataclass
class WriteWorker:
    """What one Python worker keeps from step to step: its partitions' correction states and
    when their warm copies are written, its kept desired readers, and its shard handles. One
    instance serves the steps of a round on several threads (each partition on one)."""

    states: StateCache = field(default_factory=StateCache)
    readers: Readers = field(default_factory=Readers)
    #: Open shards, by shard id.
    shards: dict[str, Shard] = field(default_factory=dict)
    #: Checkpoint handles (`services.write.checkpoint.Checkpoints`), by object store.
    stores: dict[S3Settings, Checkpoints] = field(default_factory=dict)
    #: Where pipelined steps' checkpoints are created (`Pipelined`): a resident's only; None
    #: runs every checkpoint inline.
    creates: ThreadPoolExecutor | None = None
    #: Record framings (a registry's ids cached), by its url.
    framings: Framings = field(default_factory=Framings)

    def shard(self, sink: SinkSpec) -> Shard:
        """The sink's shard, opened once per worker."""
        shard = self.shards.get(sink.shard_id)
        if shard is None:
            shard = self.shards[sink.shard_id] = open_shard(sink.shard_id, None, sink.s3)
        return shard

    def checkpoints(self, sink: SinkSpec) -> Checkpoints:
        """The sink's checkpoints, one handle per object store and worker."""
        store = self.stores.get(sink.s3)
        if store is None:
            store = self.stores[sink.s3] = Checkpoints.of(sink.s3)
        return store

    def resident(self) -> WriteWorker:
        """The worker of a resident task in this Python worker (`services.write.resident`, rule
        1): the same states in memory and shards, but the warm copies written only when it
        leaves (`leave`), and the desired readers kept from step to step."""
        shared = self.states
        return WriteWorker(
            StateCache(
                shared.states,
                warm_copies=False,
                pending=shared.pending,
                confirmed=shared.confirmed,
                warm_dir=shared.warm_dir,
            ),
            Readers(keep=True),
            self.shards,
            self.stores,
            ThreadPoolExecutor(_CREATES, thread_name_prefix="checkpoint-create"),
            self.framings,
        )

    def leave(self) -> None:
        """A resident leaving: wait for its checkpoints under way (a lost or failed one drops
        its state), close its readers and write the warm copies of the states it saved, for
        the one-shot tasks this Python worker may run next."""
        for sink_id, partition in list(self.states.pending):
            try:
                checkpoint.resolve(sink_id, partition, self.states)
            except Exception as error:
                log.warning("partition %d: its checkpoint failed: %r", partition, error)
        if self.creates is not None:
            self.creates.shutdown()
        self.readers.close()
        self.states.save_warm_copies()


#: Creates a resident runs at once (one per partition at most).
_CREATES = 4


class ProcessWorker:
    """The `WriteWorker` of this Python worker process, created on first use: Spark reuses a
    Python worker for many tasks, and its one-shot tasks (`one_shot`) and residents
    (`WriteWorker.resident` of it) share its states."""

    def __init__(self) -> None:
        self._worker: WriteWorker | None = None
        self._lock = threading.Lock()

    def worker(self) -> WriteWorker:
        with self._lock:
            if self._worker is None:
                # The worker's first task has imported what the tasks need: drop PySpark's zips
                # from the path, which every later task would otherwise pay for.
                trim_worker_path()
                self._worker = WriteWorker()
            return self._worker


#: This Python worker process's write worker (`ProcessWorker`).
PROCESS = ProcessWorker()


#: How often a fold starts over when merges replace the parts it is reading.
_READ_ATTEMPTS = 5


def run_task(
    spec: StepSpec, worker: WriteWorker, shard_state: ShardState | None = None
) -> StepResult:
    """One desired partition's step (see the module docs) in `worker`, from `shard_state`
    (the shard's state read for the whole round) or the latest. A step that fails drops the
    state `worker` holds in memory: the steps change it in place, so it may be half a step
    past its version, and the next attempt (a Spark retry, or the next step, in this reused
    worker) must load that version again (the executor's warm copy or the checkpoint).
    A step that finds the shard's `since` past its fold in a state it reads later than the
    round's (`SincePassed`, after a merge replaced a part it was reading) starts over from
    that version and the latest state, which rebuilds it."""
    try:
        for _ in range(_READ_ATTEMPTS):
            try:
                result = _step(spec, worker, shard_state)
                worker.states.confirmed.pop((spec.sink.sink_id, spec.partition), None)
                return result
            except SincePassed as error:
                worker.states.drop(spec.sink.sink_id, spec.partition)
                log.warning("%s: starting the step over", error)
                shard_state = None
        raise MvsinkError(f"partition {spec.partition}: the shard's since kept passing its fold")
    except BaseException:
        with contextlib.suppress(Exception):  # the next attempt loads what is durable
            checkpoint.resolve(spec.sink.sink_id, spec.partition, worker.states)
        worker.states.drop(spec.sink.sink_id, spec.partition)
        raise


def _step(spec: StepSpec, worker: WriteWorker, shard_state: ShardState | None) -> StepResult:
    sink, lap = spec.sink, _Laps()
    # The partition's create under way here (pipelined) must have succeeded before anything
    # continues from its state (invariant 4 of `services.write`).
    lost = checkpoint.resolve(sink.sink_id, spec.partition, worker.states)
    confirmed = worker.states.confirmed.get((sink.sink_id, spec.partition))  # `run_task` pops it
    lap("resolve")
    try:
        if lost is not None and lost >= spec.version:  # (an older loss: load what is asked)
            raise checkpoint.Superseded(f"partition {spec.partition}: version {lost} was lost")
        state, bytes_read = worker.checkpoints(sink).load(
            sink.sink_id,
            spec.partition,
            spec.version,
            sink.row_schema,
            sink.as_of,
            worker.states,
            spec.durable,
        )
    except checkpoint.Superseded as error:
        log.warning("%s: the step is stale", error)
        empty = checkpoint.empty(sink.row_schema, sink.as_of, spec.version)
        return _void(spec, empty, lap, 0, confirmed=confirmed)
    shard = worker.shard(sink)
    shard_state = shard_state or shard.state()
    start = plan_start(state.version, state.persist_folded, shard_state.since)
    if isinstance(start, Rebuild):
        if _newer_checkpoint(spec, worker, state.version):
            # A driver that has not seen the newest checkpoint (which the critical hold
            # protects): its result would be stale anyway, and a rebuild reads all of desired.
            return _void(spec, state, lap, bytes_read, confirmed=confirmed)
        log.warning(
            "partition %d: shard since %s passed checkpoint %d (folded %s): rebuilding",
            spec.partition,
            start.since,
            start.version,
            start.persist_folded,
        )
        state = checkpoint.empty(sink.row_schema, sink.as_of, state.version)
    lap("load")
    try:
        dead = fold_desired(
            sink.bootstrap,
            sink.desired_topic,
            sink.dead_letter_topic,
            spec.partition,
            sink.row_schema,
            sink.partitioning,
            state,
            None if spec.desc is None else spec.desc.upper,
            sink_id=sink.sink_id,
            why=start.why,
            readers=worker.readers,
            framing=worker.framings.of(sink.schema_registry_url),
            max_bytes=sink.max_record_bytes,
        )
    except DesiredGone as error:
        worker.states.drop(sink.sink_id, spec.partition)  # folded nothing, but unsure
        if _newer_checkpoint(spec, worker, state.version):
            return _void(spec, state, lap, bytes_read, confirmed=confirmed)
        gone = Gone(error.needed, error.log_start, str(error))
        return _void(spec, state, lap, bytes_read, gone, confirmed)
    lap("desired")
    shard_state, read_back = _fold_persist(spec, state, shard, shard_state)
    bytes_read += read_back
    lap("persist")
    # The seed's `advance_persist_frontiers_at_startup`: a shard whose upper is still before
    # the sink's `as_of` counts as at `as_of` (append brings it there before the first batch,
    # `Shard.advance_upper`), and the corrections are advanced to it, so the first batch's
    # lower is `as_of` and everything desired before it is advanced into that batch.
    persist = shard_state.upper.join(Frontier.at(sink.as_of))
    state.correction.advance_since(persist)
    state.correction.consolidate()
    lap("consolidate")
    batch = plan_batch(spec.desc, persist)
    part = _stage(spec, state, shard, batch)
    lap("stage")
    made = _checkpoint(spec, state, worker)
    lap("checkpoint")
    outcome = Ran(start, batch, part, made)
    written = (part.bytes if part else 0) + (made.size if isinstance(made, Created) else 0)
    return _report(spec, state, lap, bytes_read, state.version, outcome, dead, written, confirmed)


def _checkpoint(spec: StepSpec, state: PartitionState, worker: WriteWorker) -> CheckpointOutcome:
    """Step 5, as `spec.mode` says (a one-shot task, without `worker.creates`, runs a
    `Pipelined` step's create inline)."""
    sink = spec.sink
    match spec.mode:
        case Pipelined() if worker.creates is not None:
            worker.checkpoints(sink).save_later(
                sink.sink_id, spec.partition, sink.writer_id, state, worker.states, worker.creates
            )
            return Pending()
        case Inline() | Pipelined():
            size = worker.checkpoints(sink).save(
                sink.sink_id, spec.partition, sink.writer_id, state, worker.states
            )
            return Lost() if size is None else Created(size)
        case Keep():
            checkpoint.keep(sink.sink_id, spec.partition, state, worker.states)
            return Kept()


def _newer_checkpoint(spec: StepSpec, worker: WriteWorker, loaded: int) -> bool:
    """Whether a checkpoint newer than the one the step loaded exists (its step is stale): the
    version the driver expects, or the one before it if that was never created
    (`StepSpec.durable`) and a straggler's create has landed since."""
    return worker.checkpoints(spec.sink).exists(spec.sink.sink_id, spec.partition, loaded + 1)


def _fold_persist(
    spec: StepSpec, state: PartitionState, shard: Shard, shard_state: ShardState
) -> tuple[ShardState, int]:
    """Step 3's fold of the shard, from the latest state again when a merge replaced a part it
    was reading (same contents, newer parts); the state it folded to, and the bytes read."""
    sink = spec.sink
    for _ in range(_READ_ATTEMPTS):
        try:
            read = fold_persist(
                spec.partition, sink.partitions, sink.partitioning, state, shard, shard_state
            )
            return shard_state, read
        except PartGone:
            shard_state = shard.state()
    raise PartGone(f"partition {spec.partition}: shard parts kept vanishing")


def _stage(spec: StepSpec, state: PartitionState, shard: Shard, batch: StepBatch) -> PartRef | None:
    """Step 4, as `batch` says: the part staged, if any (kept in `state.staged`)."""
    match batch:
        case Stage(desc=desc):
            updates = state.correction.updates_before(desc.upper)
            if not updates.num_rows:
                return None
            sink = spec.sink
            part = shard.stage(
                updates,
                desc.lower,
                desc.upper,
                sink.writer_id,
                spec.partition,
                sink.partitions,
                sink.partitioning,
            )
            state.staged[part.key] = (desc.upper, updates)
            return part
        case Outdated() | FoldOnly():
            return None


def _void(
    spec: StepSpec,
    state: PartitionState,
    lap: _Laps,
    bytes_read: int,
    gone: Gone | None = None,
    confirmed: checkpoint.Confirmed | None = None,
) -> StepResult:
    """A step that staged and checkpointed nothing: stale (a newer checkpoint exists), or
    `gone` (the desired records it needed were deleted)."""
    lap("desired")
    outcome: StepOutcome = Stale() if gone is None else gone
    return _report(spec, state, lap, bytes_read, spec.version, outcome, confirmed=confirmed)


def _report(
    spec: StepSpec,
    state: PartitionState,
    lap: _Laps,
    bytes_read: int,
    version: int,
    outcome: StepOutcome,
    dead_letters: int = 0,
    bytes_written: int = 0,
    confirmed: checkpoint.Confirmed | None = None,
) -> StepResult:
    """A step's result: what `state` holds now, with the step's `outcome`."""
    return StepResult(
        partition=spec.partition,
        version=version,
        folded_offset=state.folded_offset,
        desired_frontier=state.desired_frontier,
        persist_folded=state.persist_folded,
        corrections=len(state.correction),
        dead_letters=dead_letters,
        bytes_read_back=bytes_read,
        bytes_written=bytes_written + (0 if confirmed is None else confirmed.size),
        outcome=outcome,
        confirmed=confirmed,
        executor=executor_id(),
        seconds=lap.seconds,
    )


def warm_up(_: object) -> tuple[str, str]:
    """A no-op task: unpickling it imports this module (Arrow, Kafka, S3 clients) into the
    executor's Python worker, and `preload` what Arrow imports late, so the first real job
    after a start does not pay for that. Its executor, and where it imported the code from
    (the shipped zip on a cluster)."""
    import mvsink

    preload()
    return executor_id(), os.path.dirname(os.path.dirname(mvsink.__file__ or ""))


def preload() -> None:
    """Import what Arrow imports only when first used: `pyarrow.compute`'s first call in a
    process imports pandas (when installed) to tell pandas arguments apart, about half a
    second that would otherwise fall on the first step's desired read."""
    with contextlib.suppress(ImportError):
        import pandas  # type: ignore[import-untyped]  # noqa: F401


def one_shot(specs: list[StepSpec]) -> list[StepResult]:
    """A one-shot Spark task's steps (`mvsink.io.spark.run_pinned`): `run_tasks` in this Python
    worker's `PROCESS.worker()`."""
    return run_tasks(specs, PROCESS.worker())


def run_tasks(specs: list[StepSpec], worker: WriteWorker) -> list[StepResult]:
    """`run_task` for each of `specs` (one Spark task or resident round covering several
    partitions) in `worker` from one read of the shard's state, each on its own thread, each
    result's `seconds["task"]` the whole task's.
    The steps wait on Kafka and S3 for much of their time, and Arrow releases the GIL, so a
    thread per partition overlaps those waits. The partitions share nothing but the worker's
    states and readers (keyed by partition) and clients; a failed step drops only its own
    partition's state (`run_task`), and its error is raised once the other steps have ended."""
    quiet_retries()  # one line per outage, not librdkafka's per reconnect (this worker too)
    started = time.monotonic()
    worker.readers.close(
        keep={(s.sink.bootstrap, s.sink.desired_topic, s.partition) for s in specs}
    )
    # The shard's state once for the round, not once a partition (each read probes the state
    # log for versions newer than the last seen: a few GETs on every step's path).
    sinks = {spec.sink.shard_id: spec.sink for spec in specs}
    shard_states = {shard_id: worker.shard(sink).state() for shard_id, sink in sinks.items()}
    results = each_on_a_thread(
        lambda spec: run_task(spec, worker, shard_states[spec.sink.shard_id]), specs, "write-step"
    )
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

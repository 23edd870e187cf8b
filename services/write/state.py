"""The pure decisions of the write service (port of the seed's `write::State`, minus the data,
which lives in the tasks' correction buffers).

The driver's `WriteState` decides *when* to stage a batch: for the latest valid description,
once the shard's upper has reached its `lower` (the read-back is folded up to it) and the
desired progress of every owned partition is at or past its `upper`. It also tracks which owned
partitions were already staged for the current lower, so a partition gained in a rebalance is
staged too.

A task's step (`services.write.task`) makes two decisions, planned here and applied there:
* `plan_start`, once its partition's state is loaded: continue from it, or rebuild from all of
  desired because the shard's `since` passed what it folded of the shard (`StepStart`);
* `plan_batch`, once both inputs are folded (the shard's state read again if a merge replaced a
  part meanwhile, so not decidable at the start): stage the batch, skip an outdated one, or
  only fold (`StepBatch`).

How a step checkpoints (`CheckpointMode`: `Inline`, `Pipelined`, `Keep`, as the driver's
`services.write.chain` decides) and what became of it (`StepOutcome`: it `Ran`, with its
checkpoint's `CheckpointOutcome`, `Created`, `Pending`, `Kept` or `Lost`; or it was `Stale`;
or its records were `Gone`) are closed unions here, shared by the task and the driver.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mvsink.core.frontier import Frontier, advance, advance_persist
from mvsink.core.messages import BatchDescription
from mvsink.shard.state import PartRef

log = logging.getLogger("mvsink.write")


# -- a task's step ----------------------------------------------------------------------------


def since_passed(persist_folded: Frontier, since: Frontier) -> bool:
    """Whether the shard's `since` passed what a state folded of it: merges may have collapsed
    changes it still has to read, so it must be rebuilt from all of desired. (A state that
    folded nothing of the shard reads every update anyway, collapsed or not.)"""
    return Frontier.minimum().less_than(persist_folded) and persist_folded.less_than(since)


@dataclass(frozen=True)
class ColdStart:
    """The partition has no checkpoint: the step folds all of desired and the whole shard."""

    @property
    def why(self) -> str:
        """Why the desired fold starts where it does (named when those records are gone)."""
        return "the partition has no checkpoint: a cold start reads all of desired"


@dataclass(frozen=True)
class Resume:
    """The step continues from checkpoint `version`'s state."""

    version: int

    @property
    def why(self) -> str:
        """Why the desired fold starts where it does (named when those records are gone)."""
        return f"checkpoint {self.version} folded it up to there"


@dataclass(frozen=True)
class Rebuild:
    """The shard's `since` passed checkpoint `version`'s `persist_folded`: the step starts from
    an empty state (all of desired, the whole shard) that keeps the version chain, unless a
    newer checkpoint exists (then its result is stale before it starts such a read)."""

    version: int
    since: Frontier
    persist_folded: Frontier

    @property
    def why(self) -> str:
        """Why the desired fold starts where it does (named when those records are gone)."""
        return (
            f"the shard's since {self.since} passed checkpoint {self.version}'s "
            f"persist_folded {self.persist_folded}: a rebuild from all of desired"
        )


#: Where a step's folds start.
StepStart = ColdStart | Resume | Rebuild


def plan_start(version: int, persist_folded: Frontier, since: Frontier) -> StepStart:
    """Where a step continues from the state it loaded at `version` (-1: none), which folded
    the shard to `persist_folded`, when the shard's `since` is `since`."""
    if since_passed(persist_folded, since):
        return Rebuild(version, since, persist_folded)
    if version < 0:
        return ColdStart()
    return Resume(version)


@dataclass(frozen=True)
class Stage:
    """Stage the corrections with time before `desc.upper` as one part of `desc` (none when
    there are none): the shard's upper is the description's lower."""

    desc: BatchDescription


@dataclass(frozen=True)
class Outdated:
    """The shard's upper moved past the description's lower: nothing is staged."""

    desc: BatchDescription
    shard_upper: Frontier


@dataclass(frozen=True)
class FoldOnly:
    """No description (read-only mode, a gained partition's first fold): fold, stage nothing."""


#: What a step does with its batch description once its inputs are folded.
StepBatch = Stage | Outdated | FoldOnly


@dataclass(frozen=True)
class Inline:
    """The step creates the next checkpoint version before it reports (a conditional create: a
    second owner of the partition loses, invariant 4 of `services.write`)."""


@dataclass(frozen=True)
class Pipelined:
    """A resident's staging step reports while its checkpoint is being created (invariant 4 of
    `services.write`): the partition's next step in that Python worker waits for the create
    before anything else, and is stale if it was lost. A one-shot task creates it inline."""


@dataclass(frozen=True)
class Keep:
    """The step writes no checkpoint: its state stays in the executor at the version it loaded
    (a gained partition's first fold and first staging step, `services.write.chain.Deferred`),
    and nothing that lets go of history moves for it."""


#: How a step checkpoints the state it leaves (`StepSpec.mode`).
CheckpointMode = Inline | Pipelined | Keep


@dataclass(frozen=True)
class Created:
    """The step created its checkpoint version (`size` bytes): durable."""

    size: int


@dataclass(frozen=True)
class Pending:
    """The step's checkpoint version is being created (`Pipelined`): not durable yet."""


@dataclass(frozen=True)
class Kept:
    """The step wrote no checkpoint (`Keep`): its state stays in the executor."""


@dataclass(frozen=True)
class Lost:
    """Another owner created the step's checkpoint version first: the step is stale, whatever
    it staged is void."""


#: How a step's checkpoint ended.
CheckpointOutcome = Created | Pending | Kept | Lost


@dataclass(frozen=True)
class Ran:
    """The step ran to its checkpoint: it started as `start` says, did with its description what
    `batch` says (staging `part`, if any), and checkpointed as `checkpoint` says."""

    start: StepStart
    batch: StepBatch
    part: PartRef | None
    checkpoint: CheckpointOutcome


@dataclass(frozen=True)
class Stale:
    """A checkpoint newer than the step's version exists (another owner's, or a lost attempt's
    of this driver's own task): the step read, staged and checkpointed nothing."""


@dataclass(frozen=True)
class Gone:
    """Desired records the step needed were deleted (`mvsink.core.errors.DesiredGone`, as data:
    it travels back to the driver pickled): it staged and checkpointed nothing (invariant 5 of
    `services.write`)."""

    needed: int
    log_start: int
    message: str


#: What became of a step (`StepResult.outcome`).
StepOutcome = Ran | Stale | Gone


def is_stale(outcome: StepOutcome) -> bool:
    """Whether a step's work is void: a newer checkpoint existed, or its create was lost."""
    match outcome:
        case Stale() | Ran(checkpoint=Lost()):
            return True
        case _:
            return False


def plan_batch(desc: BatchDescription | None, shard_upper: Frontier) -> StepBatch:
    """What a step does with `desc` (None: only fold) once it folded the shard to
    `shard_upper` (invariant 1 of `services.write`: stage only at the description's lower)."""
    if desc is None:
        return FoldOnly()
    if shard_upper != desc.lower:
        return Outdated(desc, shard_upper)
    return Stage(desc)


# -- the driver -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageJob:
    """Stage `partitions` for `desc`."""

    desc: BatchDescription
    partitions: tuple[int, ...]


@dataclass
class WriteState:
    """What the write driver knows.

    It keeps invariants 1 and 2 of `services.write` (nothing is staged unless the shard's upper
    equals the description's lower and every owned partition's desired progress is at or past
    its upper; a partition is staged at most once per lower, a gained one too), with one
    exception to 2: `maybe_restage` stages the description again once its batch outlived the
    parts' age bound unappended. Its description is the latest valid one: a regressing lower
    is dropped (the package's Frontiers).
    """

    sink_id: str
    partitions: int
    read_only: bool
    persist_frontier: Frontier = field(default_factory=Frontier.minimum)
    owned: frozenset[int] = frozenset()
    desired_frontiers: dict[int, Frontier] = field(default_factory=dict)
    batch_description: BatchDescription | None = None
    staged: set[int] = field(default_factory=set)
    #: When a batch was last staged (or the driver started), on the driver's clock.
    staged_at: float = 0.0

    def trace(self, message: str) -> None:
        """Log `message` with every frontier (the seed's `trace`)."""
        log.debug(
            "%s | sink=%s desc=%s persist=%s desired=%s owned=%s staged=%s",
            message,
            self.sink_id,
            self.batch_description,
            self.persist_frontier,
            {p: str(f) for p, f in sorted(self.desired_frontiers.items())},
            sorted(self.owned),
            sorted(self.staged),
        )

    def set_owned(self, partitions: frozenset[int]) -> None:
        """The desired partitions this replica owns now (consumer group assignment)."""
        self.owned = partitions
        self.staged &= set(partitions)
        self.trace("ownership changed")

    def absorb_batch_description(self, desc: BatchDescription) -> None:
        """Keep the latest valid description; drop ones whose lower regresses."""
        current = self.batch_description
        if current is not None and not current.lower.less_than(desc.lower):
            self.trace(f"dropping regressing or repeated description {desc}")
            return
        self.batch_description, self.staged = desc, set()
        self.trace(f"absorbed description {desc}")

    def advance_persist_frontier(self, frontier: Frontier) -> bool:
        """The shard's upper; ignored when it regresses (`mvsink.core.frontier.advance_persist`)."""
        return advance_persist(self, frontier)

    def advance_desired_frontier(self, partition: int, frontier: Frontier) -> bool:
        """Desired progress of one partition."""
        result = advance(self.desired_frontiers.get(partition, Frontier.minimum()), frontier)
        self.desired_frontiers[partition] = result.frontier
        return result.moved

    def fold_view(self) -> tuple[object, ...]:
        """What a fold without staging reads that can differ from one fold to the next: the
        shard's upper, the owned partitions and their desired progress, read-only or not.
        Equal to the last fold's, a fold would fold nothing new (what desired holds past its
        progress is folded once the progress passes it), so the idle driver skips it."""
        desired = tuple(
            sorted((p, f) for p, f in self.desired_frontiers.items() if p in self.owned)
        )
        return (self.persist_frontier, self.owned, desired, self.read_only)

    def allow_writes(self) -> bool:
        """Leave read-only mode."""
        changed, self.read_only = self.read_only, False
        return changed

    def maybe_start_batch(self) -> StageJob | None:
        """The partitions to stage now, for the current description, if it is ready."""
        desc = self.batch_description
        if desc is None or not self.owned:
            return None
        if desc.lower != self.persist_frontier:
            return None  # read-back not folded up to lower yet, or the description is outdated
        pending = tuple(sorted(set(self.owned) - self.staged))
        ready = all(
            desc.upper.less_equal(self.desired_frontiers.get(p, Frontier.minimum()))
            for p in pending
        )
        if not pending or not ready:
            return None
        return StageJob(desc, pending)

    def restage(self) -> bool:
        """Stage the current description's partitions again (their batch stayed unappended so
        long that the shard would refuse its parts as too old); whether anything was staged."""
        if not self.staged:
            return False
        self.staged = set()
        self.trace(f"staging {self.batch_description} again")
        return True

    def maybe_restage(self, now: float, bound: float) -> bool:
        """At `now`, stage the current description again if nothing was staged for `bound`
        seconds and it is still not appended (its lower is the shard's upper); whether it does
        (then the time counts from `now`)."""
        desc = self.batch_description
        if desc is None or now - self.staged_at < bound:
            return False
        if desc.lower == self.persist_frontier and self.restage():
            self.staged_at = now
            return True
        return False

    def batch_staged(self, job: StageJob, partitions: tuple[int, ...], now: float = 0.0) -> None:
        """`partitions` of `job` were staged and reported at `now`."""
        self.staged_at = now
        if self.batch_description == job.desc:
            self.staged |= set(partitions)
            self.trace(f"staged partitions {list(partitions)} for {job.desc}")


#: Where a driver's reader lease holds `since` (None: where it is) and each owned partition's
#: critical hold, by holder id (`WriteShell._hold_target`).
HoldTarget = tuple[Frontier | None, dict[str, Frontier]]


def lease_due(
    last: tuple[HoldTarget, float] | None, target: HoldTarget, now: float, lease: float
) -> bool:
    """Whether the lease keeper writes a version now, given the `target` and time of the last
    one it wrote (`last`, None before the first): when the target moved, or when a third of
    the `lease` has passed since (renewed with two thirds to spare). A keeper paused for longer
    than those two thirds lets the lease lapse; the critical holds never lapse, and the next
    version takes the lease again (`WriteShell._hold`)."""
    return last is None or last[0] != target or now - last[1] >= lease / 3

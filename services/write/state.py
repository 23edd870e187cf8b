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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mvsink.core.frontier import Frontier, advance, advance_persist
from mvsink.core.messages import BatchDescription

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

    Invariants: 1. the description's lower never regresses (regressing ones are dropped);
    2. a partition is staged at most once per lower by this driver, unless `restage` asks
    again (the staged batch outlived the parts' age bound unappended); 3. nothing is staged
    unless the shard's upper equals the description's lower and every owned partition's
    desired progress is at or past its upper.
    """

    sink_id: str
    partitions: int
    read_only: bool
    persist_frontier: Frontier = field(default_factory=Frontier.minimum)
    owned: frozenset[int] = frozenset()
    desired_frontiers: dict[int, Frontier] = field(default_factory=dict)
    batch_description: BatchDescription | None = None
    staged: set[int] = field(default_factory=set)

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

    def batch_staged(self, job: StageJob, partitions: tuple[int, ...]) -> None:
        """`partitions` of `job` were staged and reported."""
        if self.batch_description == job.desc:
            self.staged |= set(partitions)
            self.trace(f"staged partitions {list(partitions)} for {job.desc}")

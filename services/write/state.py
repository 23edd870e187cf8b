"""The pure state of the write driver (port of the seed's `write::State`, minus the data,
which lives in the tasks' correction buffers).

It decides *when* to stage a batch: for the latest valid description, once the shard's upper
has reached its `lower` (the read-back is folded up to it) and the desired progress of every
owned partition is at or past its `upper`. It also tracks which owned partitions were already
staged for the current lower, so a partition gained in a rebalance is staged too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mvsink.core.frontier import Frontier, advance
from mvsink.core.messages import BatchDescription

log = logging.getLogger("mvsink.write")


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
        log.debug("%s | sink=%s desc=%s persist=%s desired=%s owned=%s staged=%s", message,
                  self.sink_id, self.batch_description, self.persist_frontier,
                  {p: str(f) for p, f in sorted(self.desired_frontiers.items())},
                  sorted(self.owned), sorted(self.staged))  # fmt: skip

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
        """The shard's upper."""
        result = advance(self.persist_frontier, frontier)
        self.persist_frontier = result.frontier
        if result.moved:
            self.trace("advanced `persist` frontier")
        return result.moved

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
        ready = all(desc.upper.less_equal(self.desired_frontiers.get(p, Frontier.minimum()))
                    for p in pending)  # fmt: skip
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

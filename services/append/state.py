"""The pure state of one append worker (port of the seed's `append::State`).

Timely's `batches` frontier becomes *coverage*: the description for `lower` is complete when
the `covers` of the `StagedBatch`es absorbed for it add up to all P desired partitions. A second
batch for an already covered partition is a duplicate (a write replica restarted or rebalanced):
the first one's parts are kept, the duplicate's parts for that partition are discarded.

The state takes events and returns commands (a closed union); the shell executes them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, Part, StagedBatch
from mvsink.shard.state import Appended, PartRef, UpperMismatch

log = logging.getLogger("mvsink.append")


@dataclass(frozen=True)
class Append:
    """Compare-and-append `parts` for `desc` (`[desc.lower, desc.upper)`)."""

    desc: BatchDescription
    parts: tuple[PartRef, ...]


@dataclass(frozen=True)
class DeleteStaged:
    """Delete staged parts that will not be appended (the shard refuses any it references)."""

    parts: tuple[PartRef, ...]
    reason: str


Command = Append | DeleteStaged


@dataclass(frozen=True)
class TooOld:
    """The shard refused the parts as staged longer ago than `max_part_age` (the bound that
    lets the sweeper delete never-appended parts): they are garbage, and the description needs
    fresh parts, which the write drivers stage again when their staged batch stays unappended
    (`services.write.shell.RESTAGE_AFTER`)."""


#: How an `Append` ended: the shard's `Appended` or `UpperMismatch` (another writer got there
#: first: expected under concurrent replicas, the feedback loop corrects it later), or `TooOld`.
AppendOutcome = Appended | UpperMismatch | TooOld


@dataclass
class AppendState:
    """One append worker: the greatest `lower` seen, its description (if this worker owns
    it), and the parts stashed for it, by desired partition.

    Contract with the shell: the outcome of an `Append` is fed back (`absorb_append_outcome`)
    before any other event.

    It keeps the invariants numbered in `services.append` (1-4): parts of an outdated lower,
    duplicates and parts of a failed append are only handed to `DeleteStaged`, and an `Append`
    is issued at most once per lower, only when the description is this worker's and every
    desired partition is covered.
    """

    sink_id: str
    worker_id: int
    #: P: the description is complete when all of `0..P-1` are covered.
    partitions: int
    #: The greatest `lower` observed in `descs` and `batches`.
    lower: Frontier = field(default_factory=Frontier.minimum)
    #: The description for `lower`, if this worker appends it.
    batch_description: BatchDescription | None = None
    #: Parts for `lower`, by desired partition (the first batch covering a partition wins).
    stash: dict[int, tuple[PartRef, ...]] = field(default_factory=dict)
    #: The `Append` issued for `lower` and not yet settled.
    in_flight: Append | None = None
    #: Whether the `Append` for `lower` was issued: later batches for it are duplicates.
    sealed: bool = False

    def trace(self, message: str) -> None:
        """Log `message` with every frontier (the seed's `trace`)."""
        log.debug(
            "%s | sink=%s worker=%d lower=%s desc=%s covered=%s/%d sealed=%s",
            message,
            self.sink_id,
            self.worker_id,
            self.lower,
            self.batch_description,
            sorted(self.stash),
            self.partitions,
            self.sealed,
        )

    def advance_lower(self, frontier: Frontier) -> list[Command]:
        """Move to a greater `lower`: everything stashed for the old one is outdated."""
        assert self.lower.less_than(frontier), f"lower {self.lower} -> {frontier}"
        assert self.in_flight is None, "an append outcome must be absorbed first"
        outdated = tuple(p for parts in self.stash.values() for p in parts)
        self.lower, self.batch_description, self.stash, self.sealed = frontier, None, {}, False
        self.trace("advanced `lower`")
        if outdated:
            return [DeleteStaged(outdated, f"outdated: lower advanced to {frontier}")]
        return []

    def absorb_batch_description(self, desc: BatchDescription) -> list[Command]:
        """Take a description if it is not outdated; keep it if this worker appends it."""
        commands: list[Command] = []
        if self.lower.less_than(desc.lower):
            commands += self.advance_lower(desc.lower)
        elif self.lower != desc.lower:
            self.trace(f"skipping outdated batch description: {desc}")
            return commands
        if desc.append_worker == self.worker_id and self.batch_description is None:
            self.batch_description = desc
            self.trace("set batch description")
        return commands + self.maybe_append_batches()

    def takes(self, batch: StagedBatch) -> bool:
        """Whether `absorb_batch` would keep `batch`'s parts for an append (or move `lower` to
        it) rather than delete them as outdated or late. Such a batch is a claim the shell
        checks against the shard first (`Shard.claim_refusal`): a batch naming parts nobody
        staged, or a `lower` far ahead, must not reach this state."""
        if self.lower.less_than(batch.lower):
            return True
        return self.lower == batch.lower and self._misfit(batch) is None

    def _misfit(self, batch: StagedBatch) -> str | None:
        """Why a batch for the current `lower` is late or misfit, or None."""
        desc = self.batch_description
        if self.sealed:
            return "the append was issued"
        if desc is not None and batch.upper != desc.upper:
            return f"upper {batch.upper} != {desc}"
        return None

    def absorb_batch(self, batch: StagedBatch) -> list[Command]:
        """Take a staged batch if it is not outdated: its parts for uncovered partitions."""
        parts = tuple(PartRef.from_transmittable(p, batch) for p in batch.parts)
        commands: list[Command] = []
        if self.lower.less_than(batch.lower):
            commands += self.advance_lower(batch.lower)
        elif self.lower != batch.lower:
            self.trace(f"skipping outdated batch {batch.desc_id} [{batch.lower}, {batch.upper})")
            return [DeleteStaged(parts, f"outdated batch for lower {batch.lower}")] if parts else []
        why = self._misfit(batch)
        if why is not None:
            self.trace(f"discarding batch {batch.desc_id}: {why}")
            return commands + (
                [DeleteStaged(parts, f"late or misfit batch: {why}")] if parts else []
            )
        duplicates: list[PartRef] = []
        for partition in batch.covers:
            mine = tuple(p for p in parts if _belongs(p, partition, batch))
            if partition not in self.stash:
                self.stash[partition] = mine
            else:  # a redelivery of the kept batch carries the kept parts: never delete those
                kept = {p.key for p in self.stash[partition]}
                duplicates.extend(p for p in mine if p.key not in kept)
        self.trace(f"absorbed a batch from {batch.writer_id} covering {list(batch.covers)}")
        if duplicates:
            commands.append(DeleteStaged(tuple(duplicates), "duplicate batch for a partition"))
        return commands + self.maybe_append_batches()

    def maybe_append_batches(self) -> list[Command]:
        """`Append` once the description is ours and every partition is covered."""
        desc = self.batch_description
        complete = all(p in self.stash for p in range(self.partitions))
        if desc is None or not complete or self.sealed:
            return []
        parts = tuple(p for partition in sorted(self.stash) for p in self.stash[partition])
        self.in_flight, self.stash, self.sealed = Append(desc, parts), {}, True
        self.trace(f"appending {len(parts)} parts for {desc}")
        return [self.in_flight]

    def absorb_append_outcome(self, outcome: AppendOutcome) -> list[Command]:
        """Settle the `Append` in flight and move `lower` to the shard's upper. After a
        mismatch its parts are garbage (the shard refuses to delete any it references)."""
        append, self.in_flight = self.in_flight, None
        assert append is not None, "no append in flight"
        commands: list[Command] = []
        if isinstance(outcome, TooOld):  # same lower, same description: wait for fresh parts
            self.sealed = False
            self.trace(f"parts too old to append for {append.desc}: waiting for fresh ones")
            return [DeleteStaged(append.parts, "too old to append")] if append.parts else []
        if isinstance(outcome, Appended):
            self.trace(f"appended a batch: {append.desc}")
            new_lower = outcome.new_upper
        else:
            self.trace(f"append failed due to `lower` mismatch: {outcome.current}")
            new_lower = outcome.current
            if append.parts:
                commands.append(DeleteStaged(append.parts, f"append mismatch at {outcome.current}"))
        if self.lower.less_than(new_lower):
            commands += self.advance_lower(new_lower)
        return commands


def _belongs(part: Part, partition: int, batch: StagedBatch) -> bool:
    """Whether `part` holds updates of desired `partition` (a part without a recorded
    partition belongs to the batch's first covered partition, so it is kept exactly once)."""
    if part.partition is None:
        return bool(batch.covers) and partition == batch.covers[0]
    return part.partition == partition

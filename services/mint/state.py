"""The pure state of `mint` (port of the seed's `mint::State`): frontiers in, batch
descriptions out. No Kafka, S3 or Spark here; the shell (`services.mint.shell`) feeds events and
acts on what `maybe_mint_batch_description` returns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from mvsink.core.frontier import Frontier, advance, advance_persist, meet_all
from mvsink.core.messages import BatchDescription, BatchId

log = logging.getLogger("mvsink.mint")


@dataclass
class MintState:
    """What mint knows. Fields follow the seed.

    It keeps the invariants numbered in `services.mint` (1: `restore` keeps lowers increasing
    across restarts; 2: `last_upper`; 4: `advance_*`; 5: `allow_writes`).
    """

    sink_id: str
    #: P: the desired frontier is the meet over all P partitions' progress.
    partitions: int
    #: A: descriptions go round-robin to append workers `0..A-1`.
    append_workers: int
    #: The shard's upper as last observed; starts at the sink's `as_of`, so the first lower is
    #: at or beyond it and no snapshot of data already in the shard is rewritten.
    persist_frontier: Frontier
    #: Whether minting is disabled (read-only mode).
    read_only: bool
    #: Progress of each desired partition (`{0}` until heard of).
    desired_frontiers: dict[int, Frontier] = field(default_factory=dict)
    #: The append worker of the next description.
    next_append_worker: int = 0
    #: The last lower minted (by this mint or, after `restore`, its predecessors).
    last_lower: Frontier | None = None
    #: Epoch of this mint's life (one more than the last epoch seen in `descs`).
    epoch: int = 0
    #: Sequence number of the next description within the epoch.
    next_seq: int = 0
    #: The greatest upper minted so far (for invariant 2).
    last_upper: Frontier | None = None

    def __post_init__(self) -> None:
        for partition in range(self.partitions):
            self.desired_frontiers.setdefault(partition, Frontier.minimum())

    @property
    def desired_frontier(self) -> Frontier:
        """The meet of all desired partitions' progress."""
        return meet_all(list(self.desired_frontiers.values()))

    def trace(self, message: str) -> None:
        """Log `message` with every frontier (the seed's `trace`)."""
        log.debug(
            "%s | sink=%s desired=%s persist=%s last_lower=%s read_only=%s epoch=%d",
            message,
            self.sink_id,
            self.desired_frontier,
            self.persist_frontier,
            self.last_lower,
            self.read_only,
            self.epoch,
        )

    def restore(self, last: BatchDescription | None) -> None:
        """Continue after the last description in `descs` (a restart): keep lowers increasing,
        continue the round-robin, start a new epoch."""
        if last is not None:
            self.last_lower = last.lower
            self.last_upper = last.upper
            self.next_append_worker = (last.append_worker + 1) % self.append_workers
            self.epoch = last.id.epoch + 1
            self.next_seq = 0
        self.trace(f"restored from {last}")

    def advance_desired_frontier(self, partition: int, frontier: Frontier) -> bool:
        """Progress of one desired partition; ignored when it regresses or is unknown."""
        if partition not in self.desired_frontiers:
            self.trace(f"ignoring progress of unknown partition {partition}")
            return False
        result = advance(self.desired_frontiers[partition], frontier)
        self.desired_frontiers[partition] = result.frontier
        if result.moved:
            self.trace(f"advanced `desired` frontier of partition {partition}")
        return result.moved

    def advance_persist_frontier(self, frontier: Frontier) -> bool:
        """The shard's upper; ignored when it regresses (`mvsink.core.frontier.advance_persist`)."""
        return advance_persist(self, frontier)

    def allow_writes(self) -> bool:
        """Leave read-only mode (promotion); whether that changed anything."""
        if not self.read_only:
            return False
        self.read_only = False
        self.trace("switched to write mode")
        return True

    def maybe_mint_batch_description(self) -> BatchDescription | None:
        """A new description when (seed rules) 1. not read-only, 2. `desired` is ahead of
        `persist`, 3. `persist` advanced past the last minted lower; else None."""
        desired = self.desired_frontier
        persist = self.persist_frontier
        desired_ahead = persist.less_than(desired)
        persist_advanced = self.last_lower is None or self.last_lower.less_than(persist)
        if self.read_only or not desired_ahead or not persist_advanced:
            return None
        upper = desired
        if self.last_upper is not None:
            upper = upper.join(self.last_upper)  # invariant 2, even if desired was rewound
        desc = BatchDescription(
            sink_id=self.sink_id,
            id=BatchId(self.epoch, self.next_seq),
            lower=persist,
            upper=upper,
            append_worker=self.next_append_worker,
        )
        self.next_append_worker = (self.next_append_worker + 1) % self.append_workers
        self.next_seq += 1
        self.last_lower, self.last_upper = desc.lower, desc.upper
        self.trace(f"minted batch description: {desc}")
        return desc

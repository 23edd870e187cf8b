"""The write driver's record of each owned partition's checkpoint chain (pure: no I/O, no clock).

A partition's state moves forward by conditional checkpoints (invariant 4 of `services.write`):
each step continues from the version the driver expects and creates the next one. The driver
keeps, per owned partition, one `Chain`; `Chains` holds them all, and what the shell must do
with I/O comes back from its `absorb_*` methods as `Command`s, which the shell dispatches with
`match`.

```
            gain                      first fold kept            its staging step
  (not owned) ──> Unchecked ──────────────────────────> Deferred ──────────────────┐
                     │  first fold checkpointed                                    │
                     │  (read-only), or stale, or gone                             v
                     └──────────────────────────────────────────────────────> Inline
                                                                     created  │  ^
                                                                              v  │ stale
                                                                        Pipelined┘
  any result found stale ──> Stale ──(absorb_latest: the newest version)──> Inline
  any result of a gone partition blocks it (`Chain.gone`) until `absorb_latest` finds its
  version changed (repaired): then Unchecked again;  lose: the chain is forgotten
```

* `Unchecked`: gained, not folded since. Its first fold (`spec`) keeps its state in the
  executor (`Keep`), except in read-only mode, which never stages and so checkpoints its folds.
* `Deferred`: the first fold kept its state; the first staging step keeps it too (the part holds
  the whole load, which a checkpoint would write a second time); the step after that batch's
  append checkpoints what the read-back left. A step that staged nothing (`Outdated`) leaves it
  deferred. The part is the same whichever owner stages it (each step's state is
  `desired - shard` folded to the same frontiers); what the deferral delays is only when a
  second owner's chain is met (`Inline`) and when the holds and the trimming move.
* `Inline`: steps create their checkpoint before they report, so another owner still holding the
  partition meets this one there (the parts both may have reported before are kept once: append
  keeps one per lower and partition).
* `Pipelined`: this driver has continued the chain itself (a version it created since it gained
  the partition or last found it stale): a resident's staging step may report while its create
  is under way; folds stay inline.
* `Stale`: a step found a newer checkpoint (another owner's, or a lost attempt's of this
  driver's own task); the chain waits for the shell to read the newest version (`ReadLatest`,
  then `absorb_latest`) and continues from it inline, its kept desired offsets forgotten
  (they named its own older versions, not the newest).

What lets go of history follows versions known created only (invariants 0 and 4): each chain's
newest durable version, the `persist_folded` it folded (where the partition's critical hold and
the driver's reader lease hold the shard's `since`, `hold_target`) and the desired offsets of
its two newest durable versions (desired is trimmed below the older, `trim_below`). None of them
ever moves backwards while the partition is owned: an older confirmation is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

from mvsink.core.errors import InvalidUsage
from mvsink.core.frontier import Frontier, meet_all
from services.write.state import (
    CheckpointMode,
    Created,
    Gone,
    Inline,
    Keep,
    Kept,
    Outdated,
    Pending,
    Pipelined,
    Ran,
    Rebuild,
    StepOutcome,
    is_stale,
)

# -- a chain's phase --------------------------------------------------------------------------


@dataclass(frozen=True)
class Unchecked:
    """Gained, not folded since: folded (keeping its state) before any staging."""


@dataclass(frozen=True)
class Deferred:
    """Its first fold kept its state in the executor: its first staging step keeps it too."""


@dataclass(frozen=True)
class InlineSteps:
    """Its steps create their checkpoint before they report."""


@dataclass(frozen=True)
class PipelinedSteps:
    """This driver continued the chain itself: staging steps may report before their create."""


@dataclass(frozen=True)
class StaleSteps:
    """A step found a newer checkpoint: waits for `Chains.absorb_latest`."""


#: Where a partition's chain is (module docs).
Phase = Unchecked | Deferred | InlineSteps | PipelinedSteps | StaleSteps


@dataclass
class Chain:
    """What the driver knows of one owned partition's checkpoint chain."""

    #: The version the partition's next step continues from (-1: none): the newest its steps
    #: reported, which may still be being created (`Pending`).
    expected: int
    #: The newest version known created (durable).
    durable: int
    #: Where the chain is (module docs).
    phase: Phase = field(default_factory=Unchecked)
    #: The shard upper the newest durable version this driver saw created folded: where the
    #: partition's critical hold holds `since` (None: no such version yet, nothing held).
    persist_folded: Frontier | None = None
    #: The desired offsets of the two newest durable versions this driver saw created, oldest
    #: first: desired is trimmed below the older.
    kept_offsets: tuple[int, ...] = ()
    #: Whether the desired records its checkpoint needs are gone (nothing is staged until its
    #: version changes: invariant 5 of `services.write`).
    gone: Gone | None = None

    def advance_durable(self, version: int, persist_folded: Frontier, offset: int | None) -> None:
        """Checkpoint `version` is known created, having folded the shard to `persist_folded`
        and desired to `offset` (None: not known, nothing trimmed further). An older
        confirmation than the newest durable version moves nothing."""
        if version <= self.durable:
            return
        self.durable, self.persist_folded = version, persist_folded
        if offset is not None:
            self.kept_offsets = (*self.kept_offsets, offset)[-2:]


# -- what a step tells the driver ----------------------------------------------------------------


class Durable(Protocol):
    """A checkpoint version a step's Python worker found created (`checkpoint.Confirmed`)."""

    @property
    def version(self) -> int: ...
    @property
    def folded_offset(self) -> int: ...
    @property
    def persist_folded(self) -> Frontier: ...


class Report(Protocol):
    """What the chain reads of a step's result (`services.write.task.StepResult`)."""

    @property
    def partition(self) -> int: ...
    @property
    def version(self) -> int: ...
    @property
    def folded_offset(self) -> int: ...
    @property
    def desired_frontier(self) -> Frontier: ...
    @property
    def persist_folded(self) -> Frontier: ...
    @property
    def outcome(self) -> StepOutcome: ...
    @property
    def confirmed(self) -> Durable | None: ...
    @property
    def executor(self) -> str: ...


# -- commands ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvanceDesired:
    """The partition's in-band desired progress the step folded to (`WriteState`)."""

    partition: int
    frontier: Frontier


@dataclass(frozen=True)
class ReadLatest:
    """The partition's step was stale: read its newest checkpoint version and hand it to
    `Chains.absorb_latest`."""

    partition: int


@dataclass(frozen=True)
class Continued:
    """A stale partition continues from `version`, the newest (log it)."""

    partition: int
    version: int


@dataclass(frozen=True)
class Refold:
    """A gone partition's checkpoint version changed (`was` -> `version`: repaired, or
    restored): it is folded again before any staging (log it)."""

    partition: int
    was: int
    version: int


@dataclass(frozen=True)
class ReportGone:
    """The partition's needed desired records are gone, or gone below a new log start (log it,
    show it)."""

    partition: int
    gone: Gone


@dataclass(frozen=True)
class Cleared:
    """The partition no longer needs deleted desired records (log it, show it)."""

    partition: int


@dataclass(frozen=True)
class LogRebuilt:
    """The partition's step rebuilt its corrections from all of desired: the shard's `since`
    had passed its checkpoint."""

    partition: int


#: What the shell does for the chains.
Command = AdvanceDesired | ReadLatest | Continued | Refold | ReportGone | Cleared | LogRebuilt


@dataclass(frozen=True)
class StepPlan:
    """What a partition's next step continues from and how it checkpoints (`StepSpec`)."""

    #: The version it continues from (-1: none).
    version: int
    #: The newest version known created (None: `version`): a step finding `version` never
    #: created continues from it.
    durable: int | None
    mode: CheckpointMode


# -- all owned partitions ---------------------------------------------------------------------


@dataclass
class Chains:
    """Each owned partition's `Chain`, where each partition's warm state is, and when desired is
    trimmed next."""

    #: Seconds between trims of desired (`[sink] trim_interval`; 0 or less: never).
    trim_interval: float
    #: When desired is trimmed next (`trim_below`), on the shell's clock.
    next_trim: float
    #: Each owned partition's chain.
    chains: dict[int, Chain] = field(default_factory=dict)
    #: The executor holding each partition's warm state (`services.write.affinity`), owned or
    #: not: where its next step goes if it is gained again.
    home: dict[int, str] = field(default_factory=dict)

    @classmethod
    def starting(cls, trim_interval: float, now: float) -> Chains:
        """No partition owned yet, at `now`: the first trim after `trim_interval`."""
        return cls(trim_interval, now + trim_interval)

    @property
    def owned(self) -> frozenset[int]:
        """The owned partitions."""
        return frozenset(self.chains)

    # -- ownership ----------------------------------------------------------------------------

    def gain(self, partition: int, latest: int, persist_folded: Frontier | None = None) -> None:
        """`partition` is assigned, its newest checkpoint version `latest` (-1: none), which
        folded the shard to `persist_folded` (None: not known, no hold until a version this
        driver creates): it is folded before any staging, and its steps create their
        checkpoints inline until one created by this driver."""
        was = self.chains.get(partition)
        chain = Chain(latest, latest, persist_folded=persist_folded)
        if was is not None:  # (assigned again without a revoke: what is durable stays known)
            chain = replace(was, expected=latest, durable=latest, phase=Unchecked())
        self.chains[partition] = chain

    def lose(self, partition: int) -> list[Command]:
        """`partition` is revoked: its chain is forgotten (its home is kept)."""
        chain = self.chains.pop(partition, None)
        return [Cleared(partition)] if chain is not None and chain.gone is not None else []

    # -- steps --------------------------------------------------------------------------------

    def spec(self, partition: int, staging: bool, read_only: bool = False) -> StepPlan:
        """How `partition`'s next step runs: a `staging` one or a fold; `read_only`: the driver
        stages nothing, so a gained partition's first fold checkpoints."""
        chain = self.chains.get(partition)
        if chain is None:
            return StepPlan(-1, None, Inline())
        mode: CheckpointMode = Inline()
        match chain.phase:
            case Unchecked() if not staging and not read_only:
                mode = Keep()
            case Deferred() if staging:
                mode = Keep()
            case PipelinedSteps() if staging:
                mode = Pipelined()
            case StaleSteps():
                raise InvalidUsage(f"partition {partition}: its newest version is not read yet")
        return StepPlan(chain.expected, chain.durable, mode)

    def absorb_result(self, result: Report, staging: bool = False) -> list[Command]:
        """What a step (a `staging` one, or a fold) tells the driver: its partition's home,
        expected version, fold and desired frontier. The durable version, the hold and the kept
        desired offsets move only for a version known created (`Created`, or `confirmed`
        later): they must always name a durable checkpoint."""
        partition, outcome = result.partition, result.outcome
        self.home[partition] = result.executor
        chain = self.chains.get(partition)
        commands: list[Command] = []
        stale = is_stale(outcome)
        if chain is not None:
            outdated = isinstance(outcome, Ran) and isinstance(outcome.batch, Outdated)
            if staging and not outdated and isinstance(chain.phase, Deferred):
                chain.phase = InlineSteps()  # it staged: the step after the append checkpoints
            gone = outcome if isinstance(outcome, Gone) else None
            commands += self._set_gone(chain, partition, gone)
            if isinstance(chain.phase, Unchecked):
                # A first fold that kept its state in the executor: the first staging step
                # keeps it too. One that checkpointed (read-only), was stale or found its
                # records gone: inline.
                kept = isinstance(outcome, Ran) and isinstance(outcome.checkpoint, Kept | Pending)
                chain.phase = Deferred() if kept else InlineSteps()
        if isinstance(outcome, Gone):
            return commands
        # The in-band progress the step folded to: the partition's own record of its frontier,
        # committed with the `DesiredProgress` that `frontiers` carries, which a driver that
        # just started may read only after a whole shared topic.
        commands.append(AdvanceDesired(partition, result.desired_frontier))
        if stale and chain is not None:
            chain.phase = StaleSteps()
            commands.append(ReadLatest(partition))
        elif chain is not None:
            chain.expected = result.version
            # A pipelined step's version once a later result confirms it, an inline one's at once.
            if result.confirmed is not None:
                c = result.confirmed
                chain.advance_durable(c.version, c.persist_folded, c.folded_offset)
            if isinstance(outcome, Ran) and isinstance(outcome.checkpoint, Created):
                chain.advance_durable(result.version, result.persist_folded, result.folded_offset)
                chain.phase = PipelinedSteps()
        if isinstance(outcome, Ran) and isinstance(outcome.start, Rebuild):
            commands.append(LogRebuilt(partition))
        return commands

    def absorb_latest(self, partition: int, latest: int) -> list[Command]:
        """`partition`'s newest checkpoint version is `latest` (`ReadLatest`, or the recheck of
        a gone partition, `gone`): a stale chain continues from it inline; a gone one whose
        version changed (repaired, or restored) is folded again before any staging."""
        chain = self.chains.get(partition)
        if chain is None:
            return []
        if isinstance(chain.phase, StaleSteps):
            # The kept offsets were its own versions': the newest (another owner's, or a
            # repair's seed, which may have folded less of desired) is not among them, so
            # trimming below them could delete what it needs. They start over with the next
            # version this driver creates.
            chain.expected = chain.durable = latest
            chain.phase, chain.kept_offsets = InlineSteps(), ()
            return [Continued(partition, latest)]
        if chain.gone is None or latest == chain.expected:
            return []
        was = chain.expected
        chain.expected = chain.durable = latest
        chain.phase, chain.kept_offsets = Unchecked(), ()
        return [Refold(partition, was, latest), *self._set_gone(chain, partition, None)]

    def absorb_created(self, partition: int, version: int, persist_folded: Frontier) -> None:
        """`partition`'s `version` (one of `unconfirmed`) exists: durable, its desired offset
        not known (nothing trimmed further)."""
        chain = self.chains.get(partition)
        if chain is not None:
            chain.advance_durable(version, persist_folded, None)

    @staticmethod
    def _set_gone(chain: Chain, partition: int, gone: Gone | None) -> list[Command]:
        was, chain.gone = chain.gone, gone
        if gone is not None and (was is None or was.log_start != gone.log_start):
            return [ReportGone(partition, gone)]
        if gone is None and was is not None:
            return [Cleared(partition)]
        return []

    # -- what the loop asks ---------------------------------------------------------------------

    def unchecked(self) -> tuple[int, ...]:
        """The owned partitions to fold before any staging."""
        return tuple(p for p, c in sorted(self.chains.items()) if isinstance(c.phase, Unchecked))

    def gone(self) -> dict[int, Gone]:
        """The owned partitions whose needed desired records are gone (nothing is staged)."""
        return {p: c.gone for p, c in sorted(self.chains.items()) if c.gone is not None}

    def unconfirmed(self) -> list[tuple[int, int]]:
        """Each owned partition whose expected version is not known created yet, with that
        version (`Pending`): on the way out, the shell checks whether it exists."""
        return [(p, c.expected) for p, c in sorted(self.chains.items()) if c.expected > c.durable]

    def hold_target(self) -> tuple[Frontier | None, dict[int, Frontier]]:
        """Where the driver's reader lease holds `since`: the least upper its partitions'
        durable checkpoints have folded (the tasks read the shard's changes from there, or from
        a fold in memory past it, which merges keep distinct only at or after `since`), None
        (where it is) until every owned partition has one; and each owned partition's critical
        hold: its newest durable checkpoint's `persist_folded` (invariant 0)."""
        holds = {
            p: c.persist_folded
            for p, c in sorted(self.chains.items())
            if c.persist_folded is not None
        }
        everyone = self.chains and len(holds) == len(self.chains)
        return (meet_all(list(holds.values())) if everyone else None), holds

    def trim_below(self, now: float) -> dict[int, int] | None:
        """If a trim is due at `now`: each owned partition's desired offset below which nothing
        a driver may still load is needed (the older of its two newest durable checkpoints'),
        for the partitions that have two and are not gone; the next trim is then due after
        `trim_interval`. None: not due."""
        if self.trim_interval <= 0 or now < self.next_trim:
            return None
        self.next_trim = now + self.trim_interval
        return {
            p: min(c.kept_offsets)
            for p, c in sorted(self.chains.items())
            if len(c.kept_offsets) == 2 and c.gone is None
        }

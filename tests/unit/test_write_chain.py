"""The write driver's record of each owned partition's checkpoint chain (`services.write.chain`):
its transitions one by one, and two drivers racing over one partition under random
interleavings (Hypothesis), checked against a model of the checkpoint store."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from mvsink.core.errors import InvalidUsage
from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, BatchId
from services.write.chain import (
    AdvanceDesired,
    Chain,
    Chains,
    Cleared,
    Command,
    Continued,
    Deferred,
    InlineSteps,
    LogRebuilt,
    PipelinedSteps,
    ReadLatest,
    Refold,
    ReportGone,
    StaleSteps,
    StepPlan,
)
from services.write.checkpoint import Confirmed
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
    Resume,
    Stage,
    Stale,
    StepBatch,
    StepOutcome,
    is_stale,
)
from services.write.task import StepResult, StepSpec

F = Frontier.at
DESC = BatchDescription("holds", BatchId(0, 10), F(10), F(11), 0)


def ran(checkpoint: CheckpointOutcome, batch: StepBatch | None = None) -> Ran:
    return Ran(Resume(0), batch or FoldOnly(), None, checkpoint)


CREATED, KEPT, PENDING, LOST = ran(Created(1)), ran(Kept()), ran(Pending()), ran(Lost())
OUTDATED = ran(Kept(), Outdated(DESC, F(12)))


def result(
    partition: int,
    version: int,
    folded: int,
    offset: int,
    outcome: StepOutcome = KEPT,
    confirmed: Confirmed | None = None,
) -> StepResult:
    """A step's result: its state folded the shard to `folded` and desired to `offset`."""
    return StepResult(
        partition=partition,
        version=version,
        folded_offset=offset,
        desired_frontier=F(folded),
        persist_folded=F(folded),
        corrections=0,
        dead_letters=0,
        bytes_read_back=0,
        bytes_written=0,
        outcome=outcome,
        confirmed=confirmed,
        executor="e1",
    )


def owning(versions: dict[int, int]) -> Chains:
    """A driver that gained `versions`' partitions at those checkpoint versions."""
    chains = Chains.starting(trim_interval=10.0, now=0.0)
    for partition, version in versions.items():
        chains.gain(partition, version)
    return chains


def p0(chains: Chains) -> Chain:
    """Partition 0's chain (a call: each assertion reads it afresh)."""
    return chains.chains[0]


def mode(chains: Chains, staging: bool = True, partition: int = 0) -> CheckpointMode:
    return chains.spec(partition, staging).mode


# -- transitions ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [-1, 4], ids=["new sink", "restart"])
def test_the_lease_holds_and_kept_offsets_follow_durable_checkpoints_only(version: int) -> None:
    """Invariants 0 and 4 of `services.write`: what lets go of history (the lease, the critical
    holds, the kept desired offsets) follows versions known created only."""
    chains = owning({0: version, 1: version})
    for p in (0, 1):  # the first folds, no checkpoint: state only in the executors
        chains.absorb_result(result(p, version, folded=7 + p, offset=90))
    # The lease stays where it is (None), at or before the folds in memory; the critical holds
    # stay at the durable checkpoints (or none), and nothing is kept from trimming yet.
    assert chains.hold_target() == (None, {})
    assert [c.kept_offsets for c in chains.chains.values()] == [(), ()]
    assert [c.expected for c in chains.chains.values()] == [version, version]
    assert chains.unchecked() == ()
    chains.absorb_result(result(0, version + 1, folded=9, offset=120, outcome=CREATED))
    assert chains.hold_target() == (None, {0: F(9)})
    assert p0(chains).kept_offsets == (120,) and p0(chains).expected == version + 1
    assert chains.chains[1].expected == version
    chains.absorb_result(result(1, version + 1, folded=10, offset=130, outcome=CREATED))
    assert chains.hold_target() == (F(9), {0: F(9), 1: F(10)})
    chains.absorb_result(result(0, version + 1, folded=11, offset=150))
    assert chains.hold_target()[1][0] == F(9)  # not durable: unmoved
    assert [c.kept_offsets for c in chains.chains.values()] == [(120,), (130,)]


def test_pipelined_steps_move_the_holds_once_a_later_result_confirms_them() -> None:
    """Invariant 4 of `services.write`: a resident reports a staging step while its checkpoint
    is being created (`Pending`): the driver continues from that version, but the lease, the
    hold and the kept desired offsets move only when a later result confirms it (`confirmed`);
    a gained partition and one found stale stage inline until the driver has created a version
    of its own."""
    chains = owning({0: 4})
    assert mode(chains) == Inline()  # gained: its first checkpoint is inline
    chains.absorb_result(result(0, 5, folded=9, offset=100, outcome=CREATED))
    assert p0(chains).phase == PipelinedSteps() and p0(chains).durable == 5
    assert chains.spec(0, staging=True) == StepPlan(5, 5, Pipelined())
    assert mode(chains, staging=False) == Inline()  # folds stay inline
    chains.absorb_result(result(0, 6, folded=11, offset=150, outcome=PENDING), staging=True)
    # A step finding 6 never created falls back to 5.
    assert chains.spec(0, staging=True) == StepPlan(6, 5, Pipelined())
    assert chains.hold_target()[1] == {0: F(9)} and p0(chains).kept_offsets == (100,)
    assert chains.unconfirmed() == [(0, 6)]
    confirming = result(0, 7, 13, 200, PENDING, Confirmed(6, 150, F(11), 1))
    chains.absorb_result(confirming, staging=True)
    assert (p0(chains).expected, p0(chains).durable) == (7, 6)
    assert chains.hold_target()[1] == {0: F(11)}
    assert p0(chains).kept_offsets == (100, 150)  # trimmed below 100: what 6 and 5 need
    # A confirmation the chain has moved past moves nothing back.
    chains.absorb_result(result(0, 7, 13, 200, PENDING, Confirmed(5, 100, F(9), 1)), staging=True)
    assert chains.hold_target()[1] == {0: F(11)}
    assert p0(chains).kept_offsets == (100, 150) and p0(chains).durable == 6
    # Stale (7 lost to another owner): continue from the newest, inline until a create of its own.
    commands = chains.absorb_result(result(0, 7, folded=0, offset=0, outcome=Stale()), True)
    assert commands == [AdvanceDesired(0, F(0)), ReadLatest(0)]
    assert p0(chains).phase == StaleSteps()
    with pytest.raises(InvalidUsage):
        chains.spec(0, staging=True)  # not before the newest version is read
    assert chains.absorb_latest(0, 7) == [Continued(0, 7)]
    assert (p0(chains).expected, p0(chains).durable) == (7, 7)
    assert chains.spec(0, staging=True) == StepPlan(7, 7, Inline())
    assert chains.hold_target()[1] == {0: F(11)}  # never moved back


@pytest.mark.parametrize("version", [-1, 4], ids=["new sink", "restart"])
def test_a_gained_partition_checkpoints_first_after_its_first_append(version: int) -> None:
    """The first fold and the first staging step keep their state in the executor (the part
    holds the whole load, which a checkpoint would write again); the step after that batch's
    append creates the next version inline, and only then do the steps pipeline. Invariant 2
    of `services.write`: a gained partition is folded before it is staged."""
    chains = owning({0: version})
    assert chains.unchecked() == (0,)
    assert chains.spec(0, staging=False) == StepPlan(version, version, Keep())
    assert chains.spec(0, staging=False, read_only=True).mode == Inline()  # stages none
    chains.absorb_result(result(0, version, folded=7, offset=90))
    assert p0(chains).phase == Deferred() and chains.unchecked() == ()
    assert mode(chains) == Keep()
    assert mode(chains, staging=False) == Inline()  # a fold meanwhile checkpoints
    chains.absorb_result(result(0, version, folded=8, offset=95, outcome=ran(Kept())), True)
    assert p0(chains).phase == InlineSteps() and p0(chains).expected == version
    assert chains.hold_target() == (None, {})  # nothing durable yet: nothing moved
    assert mode(chains) == Inline()  # inline: meets another owner
    chains.absorb_result(result(0, version + 1, folded=9, offset=99, outcome=CREATED), True)
    assert mode(chains) == Pipelined()
    assert chains.hold_target() == (F(9), {0: F(9)})


@pytest.mark.parametrize(
    "first, phase",
    [
        (KEPT, Deferred()),
        (CREATED, PipelinedSteps()),  # read-only: its first fold checkpoints
        (Stale(), StaleSteps()),  # a newer checkpoint: continue from it, inline
        (Gone(0, 50, "gone"), InlineSteps()),  # nothing is staged until repaired
    ],
    ids=["kept", "read-only", "stale", "gone"],
)
def test_only_a_first_fold_that_kept_its_state_defers_the_checkpoint(
    first: StepOutcome, phase: object
) -> None:
    chains = owning({0: 3})
    chains.absorb_result(result(0, 3, folded=7, offset=90, outcome=first))
    assert p0(chains).phase == phase and chains.unchecked() == ()
    if phase == StaleSteps():
        chains.absorb_latest(0, 4)
        assert p0(chains).phase == InlineSteps() and p0(chains).expected == 4


@pytest.mark.parametrize(
    "second, phase",
    [
        (OUTDATED, Deferred()),  # it staged nothing: the next staging step still keeps
        (Stale(), InlineSteps()),  # continue from the newest version, inline
        (ran(Kept(), Stage(DESC)), InlineSteps()),  # staged: the next step checkpoints
    ],
    ids=["outdated", "stale", "staged"],
)
def test_a_deferred_staging_step(second: StepOutcome, phase: object) -> None:
    chains = owning({0: 3})
    chains.absorb_result(result(0, 3, folded=7, offset=90))
    for command in chains.absorb_result(result(0, 3, 7, 90, second), staging=True):
        if isinstance(command, ReadLatest):
            chains.absorb_latest(0, 4)
    assert p0(chains).phase == phase


def test_a_partition_regained_starts_its_deferral_over() -> None:
    """Revoked while deferred, then assigned again (at the version another owner left): not
    deferred until it is folded first again, then deferred again; its home stays known."""
    chains = owning({0: 3})
    chains.absorb_result(result(0, 3, folded=7, offset=90))
    assert p0(chains).phase == Deferred()
    assert chains.lose(0) == [] and chains.owned == frozenset() and chains.unchecked() == ()
    assert chains.home == {0: "e1"} and chains.hold_target() == (None, {})
    chains.gain(0, 6)
    assert chains.unchecked() == (0,) and p0(chains).expected == 6
    assert mode(chains) == Inline()  # (the driver folds it before any staging)
    chains.absorb_result(result(0, 6, folded=9, offset=120))
    assert p0(chains).phase == Deferred() and mode(chains) == Keep()


def test_results_of_a_partition_not_owned_move_only_its_home_and_progress() -> None:
    chains = owning({})
    commands = chains.absorb_result(result(3, 4, 9, 99, ran(Created(1))))
    assert commands == [AdvanceDesired(3, F(9))] and chains.home == {3: "e1"}
    assert chains.spec(3, staging=True) == StepPlan(-1, None, Inline())
    rebuilt = Ran(Rebuild(2, F(5), F(3)), FoldOnly(), None, Created(1))
    assert LogRebuilt(3) in chains.absorb_result(result(3, 5, 9, 99, rebuilt))


def test_a_gone_partition_blocks_until_its_version_changes() -> None:
    """Invariant 5 of `services.write`: a partition whose needed desired records are gone
    stages nothing until its checkpoint is repaired (its version changes); then it is folded
    again before any staging, and nothing is trimmed for it meanwhile."""
    chains = owning({0: 3, 1: 3})
    chains.trim_interval, chains.next_trim = 1.0, 0.0
    chains.absorb_result(result(0, 4, 9, 100, CREATED))
    chains.absorb_result(result(0, 5, 9, 150, CREATED))
    chains.absorb_result(result(1, 3, 9, 150))
    gone = Gone(80, 120, "records from 80 are gone below 120")
    assert chains.absorb_result(result(0, 4, 9, 150, gone)) == [ReportGone(0, gone)]
    assert chains.gone() == {0: gone} and chains.trim_below(5.0) == {}
    again = Gone(85, 120, "records from 85 are gone below 120")
    assert chains.absorb_result(result(0, 4, 9, 150, again)) == []  # the same log start
    further = Gone(85, 130, "records from 85 are gone below 130")
    assert chains.absorb_result(result(0, 4, 9, 150, further)) == [ReportGone(0, further)]
    assert chains.absorb_latest(0, 5) == []  # not repaired yet
    assert chains.absorb_latest(0, 6) == [Refold(0, 5, 6), Cleared(0)]
    assert chains.gone() == {} and chains.unchecked() == (0,)
    assert p0(chains).kept_offsets == () and p0(chains).expected == 6
    assert chains.hold_target()[1] == {0: F(9)}  # the hold stays where it was
    chains.absorb_result(result(1, 3, 9, 150, gone))
    assert chains.lose(1) == [Cleared(1)] and chains.gone() == {}


def test_a_stale_chain_forgets_the_offsets_of_its_own_older_versions() -> None:
    """Regression (the chain simulation's seed 235, `tests/sim`): a stale chain continued from
    the newest version but kept the desired offsets of its own older versions; when the newest
    is a repair's seed that folded less of desired, the next version it created paired an old
    offset with its own, and desired was trimmed below what the seed needs (invariant 4 of
    `services.write`: what lets go of history follows versions known created)."""
    chains = owning({0: -1})
    chains.trim_interval, chains.next_trim = 1.0, 0.0
    chains.absorb_result(result(0, 0, 9, 400, CREATED))
    chains.absorb_result(result(0, 1, 10, 444, CREATED))
    assert chains.absorb_result(result(0, 1, 0, 0, Stale()))[-1] == ReadLatest(0)
    chains.absorb_latest(0, 9)  # a repair's seed: version 9, desired folded to offset 286
    assert p0(chains).kept_offsets == ()
    chains.absorb_result(result(0, 10, 12, 300, CREATED))
    assert chains.trim_below(5.0) == {}  # 9's offset is not known: nothing below 286 goes
    chains.absorb_result(result(0, 11, 13, 320, CREATED))
    assert chains.trim_below(10.0) == {0: 300}  # the newest two: 10 and 11


def test_desired_is_trimmed_every_interval_below_the_older_of_two_durable_versions() -> None:
    chains = Chains.starting(trim_interval=10.0, now=100.0)
    chains.gain(0, -1)
    for version, offset in enumerate((100, 150, 190)):
        chains.absorb_result(result(0, version, 9 + version, offset, CREATED))
    assert chains.trim_below(109.0) is None  # not due
    assert chains.trim_below(110.0) == {0: 150}
    assert chains.trim_below(119.0) is None and chains.trim_below(120.0) == {0: 150}
    assert Chains.starting(trim_interval=0.0, now=0.0).trim_below(1e9) is None  # never


def test_a_pending_version_found_created_on_the_way_out_moves_the_hold() -> None:
    chains = owning({0: 4})
    chains.absorb_result(result(0, 5, 9, 100, CREATED))
    chains.absorb_result(result(0, 6, 11, 150, PENDING))
    assert chains.unconfirmed() == [(0, 6)]
    chains.absorb_created(0, 6, F(11))
    assert chains.unconfirmed() == [] and chains.hold_target()[1] == {0: F(11)}
    assert p0(chains).kept_offsets == (100,)  # its offset is not known: kept as was


@pytest.mark.parametrize("kind", [StepSpec, StepResult])
def test_a_step_carries_closed_unions_not_flags(kind: type) -> None:
    """How a step checkpoints and what became of it are `services.write.state`'s unions."""
    hints = typing.get_type_hints(kind)
    assert [f.name for f in fields(kind) if hints[f.name] is bool] == []


# -- two drivers, one partition ---------------------------------------------------------------


@dataclass(frozen=True)
class Version:
    """A created checkpoint: the time its state folded to (its `persist_folded` and desired
    offset), and who created it from which version."""

    folded: int
    writer: str
    parent: int


@dataclass
class Worker:
    """A driver's executor: the partition's state in memory (its version, the time it folded
    to, and whether it was loaded or created durable: `source`), and a create under way."""

    memory: tuple[int, int] | None = None
    pending: tuple[int, int] | None = None
    #: What became of `pending` once its create ran in the background (None: not yet).
    landed: bool | None = None
    resident: bool = True


@dataclass
class Driver:
    name: str
    chains: Chains = field(default_factory=lambda: Chains.starting(1.0, 0.0))
    worker: Worker = field(default_factory=Worker)
    #: A step that ran, its result not absorbed yet (the driver's loop waits for it).
    inflight: tuple[StepResult, bool] | None = None
    #: Where the hold and the kept offsets were, while owned (they never move backwards).
    hold: Frontier | None = None
    kept: tuple[int, ...] = ()
    durable: int = -1


@dataclass
class World:
    created: dict[int, Version] = field(default_factory=dict)
    drivers: tuple[Driver, Driver] = field(default_factory=lambda: (Driver("a"), Driver("b")))
    now: int = 0
    #: Creates of crashed workers still in flight (version, time), landing whenever.
    stragglers: list[tuple[int, int]] = field(default_factory=list)

    def latest(self) -> int:
        return max(self.created, default=-1)

    def create(self, version: int, folded: int, writer: str) -> bool:
        """The conditional create: a second create of one version loses."""
        if version in self.created:
            return False
        self.created[version] = Version(folded, writer, version - 1)
        return True

    # -- a step, as `services.write.task` runs it ------------------------------------------------

    def run(self, d: Driver, staging: bool, outdated: bool) -> None:
        plan = d.chains.spec(0, staging)
        w, lost, confirmed = d.worker, None, None
        if w.pending is not None:  # step 0: the create under way must have landed
            version, folded = w.pending
            landed = w.landed if w.landed is not None else self.create(version, folded, d.name)
            w.pending, w.landed = None, None
            if landed:
                confirmed = Confirmed(version, folded, F(folded), 1)
            else:
                lost, w.memory = version, None
        if lost is not None and lost >= plan.version:
            d.inflight = (result(0, plan.version, 0, 0, Stale(), confirmed), staging)
            return
        base = self.load(d, plan)
        if base is None:
            d.inflight = (result(0, plan.version, 0, 0, Stale(), confirmed), staging)
            return
        self.now += 1
        version, t = base[0], self.now
        batch: StepBatch = FoldOnly()
        if staging:
            batch = Outdated(DESC, F(99)) if outdated else Stage(DESC)
        checkpoint: CheckpointOutcome
        match plan.mode:
            case Keep():
                checkpoint, w.memory = Kept(), (version, t)
            case Pipelined() if w.resident:
                checkpoint, w.memory, w.pending = Pending(), (version + 1, t), (version + 1, t)
                version += 1
            case Inline() | Pipelined():
                if self.create(version + 1, t, d.name):
                    checkpoint, w.memory = Created(1), (version + 1, t)
                    version += 1
                else:
                    checkpoint, w.memory = Lost(), None
        outcome = Ran(Resume(version), batch, None, checkpoint)
        d.inflight = (result(0, version, t, t, outcome, confirmed), staging)

    def load(self, d: Driver, plan: StepPlan) -> tuple[int, int] | None:
        """The state the step continues from (`Checkpoints.load`), None if it is stale. No
        driver ever continues from a version it did not create or load durable (invariant 4
        of `services.write`)."""
        w = d.worker
        if w.memory is not None and w.memory[0] == plan.version:
            state = w.memory
        elif plan.version == -1:
            state = (-1, 0)
        elif plan.version in self.created:
            state = (plan.version, self.created[plan.version].folded)
        else:  # never created (a pipelined create lost with its worker)
            assert plan.durable is not None and plan.durable < plan.version, plan
            if self.latest() >= plan.version:
                return None
            assert plan.durable == -1 or plan.durable in self.created, plan
            state = (plan.durable, self.created[plan.durable].folded if plan.durable >= 0 else 0)
        assert state[0] == -1 or state[0] in self.created, f"{d.name} continues from {state}"
        w.memory = state
        return state

    def report(self, d: Driver) -> None:
        assert d.inflight is not None
        (reported, staging), d.inflight = d.inflight, None
        commands: list[Command] = d.chains.absorb_result(reported, staging)
        stale = is_stale(reported.outcome)
        owned = 0 in d.chains.owned
        assert (ReadLatest(0) in commands) == (stale and owned), commands
        for command in commands:
            if isinstance(command, ReadLatest):
                d.chains.absorb_latest(0, self.latest())
                assert p0(d.chains).expected == self.latest()  # a stale result reads it
                event("stale")

    # -- what the model checks after each event -------------------------------------------------

    def check(self) -> None:
        for version, created in self.created.items():  # invariant 4: one chain
            assert created.parent == version - 1
            assert version == 0 or version - 1 in self.created
        newest = self.created[self.latest()].folded if self.created else None
        for d in self.drivers:
            chain = d.chains.chains.get(0)
            if chain is None:
                d.hold, d.kept, d.durable = None, (), -1
                continue
            durable = {v.folded for v in self.created.values()}
            # What lets go of history names durable versions only (invariants 0 and 4).
            assert chain.durable == -1 or chain.durable in self.created
            if chain.persist_folded is not None:
                assert chain.persist_folded.time in durable
                assert newest is not None and chain.persist_folded.less_equal(F(newest))
            assert set(chain.kept_offsets) <= durable
            # ... and never moves backwards while owned.
            if d.hold is not None:
                assert chain.persist_folded is not None and d.hold.less_equal(chain.persist_folded)
            if d.kept and chain.kept_offsets:
                assert min(d.kept) <= min(chain.kept_offsets)
                assert max(d.kept) <= max(chain.kept_offsets)
            assert d.durable <= chain.durable
            d.hold, d.kept, d.durable = chain.persist_folded, chain.kept_offsets, chain.durable
            d.chains.next_trim = 0.0
            trim = d.chains.trim_below(1.0)
            if trim:  # the two newest versions' records are kept
                second = sorted(self.created)[-2]
                assert trim[0] <= self.created[second].folded

    # -- actions ------------------------------------------------------------------------------

    def step(self, data: st.DataObject) -> None:
        """One event: a driver gains or loses the partition, runs a step or absorbs its result,
        its worker's create under way lands or its worker crashes, or a straggler lands."""
        d = self.drivers[data.draw(st.integers(0, 1))]
        owned, busy, w = 0 in d.chains.owned, d.inflight is not None, d.worker
        enabled = ["crash"]
        if busy:
            enabled += ["report"] * 4
        elif owned:
            enabled += ["lose", *(["fold"] if d.chains.unchecked() else ["fold", *["stage"] * 4])]
        else:
            enabled += ["gain"] * 2
        if w.pending is not None and w.landed is None:
            enabled += ["land"]
        if self.stragglers:
            enabled += ["straggle"]
        action = data.draw(st.sampled_from(enabled))
        if action == "gain":
            d.chains.gain(0, self.latest())
        elif action == "lose":
            d.chains.lose(0)
        elif action in ("fold", "stage"):
            self.run(d, action == "stage", action == "stage" and data.draw(st.booleans()))
        elif action == "report":
            self.report(d)
        elif action == "land":
            assert w.pending is not None
            w.landed = self.create(*w.pending, d.name)
        elif action == "crash":  # the worker dies: its create under way lands later, or never
            if w.pending is not None and w.landed is None:
                self.stragglers.append(w.pending)
            d.worker = Worker(resident=data.draw(st.booleans()))
        elif action == "straggle":
            version, folded = self.stragglers.pop(0)
            if data.draw(st.booleans()):
                self.create(version, folded, "straggler")
        event(action)
        self.check()


@settings(max_examples=200, deadline=None)
@given(steps=st.integers(5, 60), data=st.data())
def test_two_drivers_racing_over_one_partition_keep_the_chain(
    steps: int, data: st.DataObject
) -> None:
    """Invariants 0 and 4 of `services.write`, under two drivers gaining and losing one
    partition, their steps reporting and their pipelined creates landing in any order, workers
    crashing with creates in flight: no driver continues from a version it did not create or
    load durable, every version is created once from the one before it, the hold and the kept
    offsets only name durable versions (the hold at or before the newest's fold, the trim below
    the older of the newest two) and never move backwards while owned, a stale result makes the
    chain read the latest; and a driver left alone creates a new version within a few steps."""
    world = World()
    for _ in range(steps):
        world.step(data)
    for d in world.drivers:  # the loops absorb what ran
        if d.inflight is not None:
            world.report(d)
            world.check()
    alone = world.drivers[0]
    for other in world.drivers[1:]:
        other.chains.lose(0)
    if 0 not in alone.chains.owned:
        alone.chains.gain(0, world.latest())
    before = world.latest()
    for _ in range(5):  # a fold, the deferred staging step, an inline create, ...
        world.run(alone, alone.chains.unchecked() == (), outdated=False)
        world.report(alone)
        world.check()
    assert world.latest() > before, "a driver alone makes progress"
    event(f"versions: {min(len(world.created), 5)}+")

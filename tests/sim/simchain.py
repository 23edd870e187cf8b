"""The write service's checkpoint chain under the deterministic world (`simworld`): two write
drivers owning one desired partition in turn, their tasks' steps, the creates they pipeline,
their lease keepers, a repair and desired trimming, all real code over the world's store, and
the checks made after every store call.

The actors:

* `driver0`, `driver1`: a write driver each (`services.write.chain.Chains` decides, as the
  shell does; the loop around it is a port of the shell's, which Kafka and Spark bind: it
  stages whenever the shard's upper is behind desired's progress, and takes the partition's
  critical hold when it gains it, `_hold_at_gain`), gaining and losing the partition as
  `owners` (the consumer group) says, running
  its steps in its task worker (`services.write.task.run_task`, a `WriteWorker` of real
  `Checkpoints` and a real `Shard` over the store; inline creates, and pipelined ones on
  `SimPool` actors), appending what they stage as append would, trimming desired below
  `Chains.trim_below`. A driver's crash restarts it with nothing in memory; its worker (the
  executor's Python worker) survives it or not, at random;
* `lease0`, `lease1`: each driver's lease keeper, moving its reader lease and the partition's
  critical hold to `Chains.hold_target` (`services.write.shell.WriteShell._hold`);
* `owners`: the consumer group, moving the partition from one driver to the other, each
  revocation seen a while after the new owner gained it (both run steps meanwhile);
* `upstream`: desired ticks (`Desired`: updates at time t, then the `Progress` to t+1);
* `repair`: `mvsink repair --partition 0` now and then (its plan ported, then
  `services.write.repair.reseed`, trusting the shard; an injected pause between the plan and
  the seed stands for the human confirming it);
* `checkpoint-gc`: the task workers' collectors of superseded versions
  (`services.write.checkpoint.Collector`: `QueuedCollector`), deleting what creates queued,
  late;
* the shard's compactor and collector (`simshard`).

Desired is an in-memory log (`Desired`) read by a deterministic `fold_desired` with the real
fold's contract (a hole is `DesiredGone`, a read until an upper stops at its `Progress`).

Checks (`ChainChecker`) after every store call, besides `simshard.Checker`'s of the shard
(invariants of `services.write`):

* 0: the shard's `since` never passes the `persist_folded` of the partition's newest created
  checkpoint;
* 1: a step stages only with the shard folded to its description's lower and desired to its
  upper (2, a driver staging each lower once, is `WriteState`'s gate, not simulated);
* 4: the first object written at each version key is *the* version; each one was created from
  the version before it as created (or, for version 0, from nothing; a repair's seed from the
  shard): never from an object written again at a collected key, nor from a version another
  owner continued from;
* 3 and the parts: every version's corrections are desired before its `folded_offset` minus
  the shard before its `persist_folded`; after every append the shard before its upper holds
  exactly desired's updates before it (each staged part is `desired(< upper) - shard(< lower)`,
  whichever state staged it);
* 5 and the desired life: desired is never trimmed above the `folded_offset` of either of the
  two newest versions (the fold refuses a hole, `Gone`; the chain then stages nothing until a
  repair: a trim past a version would stop the sink);
* every step ends in an outcome, never in an error a driver cannot retry (an error another
  process can cause must not stop the driver).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from typing import Any
from unittest import mock

import pyarrow as pa
import simshard
from simshard import FAULTS, ROWS, SHARD, SIM_S3, TIMING, Checker, _rows
from simworld import START, Actor, Crash, Faults, Stop, World

from mvsink.core.errors import DesiredGone, MvsinkError
from mvsink.core.frontier import Frontier, advance
from mvsink.core.messages import BatchDescription, BatchId
from mvsink.core.partitioning import CURRENT
from mvsink.core.updates import DIFF, TIME, normalize_updates
from mvsink.io.health import transient
from mvsink.shard import AsOfBeforeSince, IndefiniteAppend, PartTooOld, Shard
from services.write import chain, shell, task
from services.write.checkpoint import (
    Checkpoints,
    Snapshot,
    StateCache,
    checkpoint_key,
    holder_id,
    since_passed,
)
from services.write.repair import Seed, reseed
from services.write.state import Ran, Stage
from services.write.task import SinkSpec, StepResult, StepSpec, WriteWorker

SINK = "chain"
PARTITION = 0
PREFIX = f"sinks/{SINK}/write/p{PARTITION}/"
HOLDER = holder_id(SINK, PARTITION)
#: Seconds between the drivers' trims of desired (`[sink] trim_interval`, shrunk).
TRIM_INTERVAL = 5.0
#: The lease keeper's period (`services.write.shell.HOLD_INTERVAL`).
HOLD_INTERVAL = 1.0
SPEC = SinkSpec(
    sink_id=SINK,
    shard_id=SHARD,
    partitions=1,
    partitioning=CURRENT,
    bootstrap="sim",
    desired_topic="desired",
    dead_letter_topic="dead-letter",
    s3=SIM_S3,
    row_schema=ROWS,
    as_of=0,
    writer_id="",
)

Update = tuple[int, int, int]  # key, time, diff


# -- desired -----------------------------------------------------------------------------------


@dataclass
class Desired:
    """One desired partition: its records by offset (updates, or the `Progress` frontier a
    record moves the partition to) and its log start (records below it are deleted)."""

    records: list[list[Update] | int] = field(default_factory=list)
    start: int = 0

    @property
    def progress(self) -> int:
        return next((r for r in reversed(self.records) if isinstance(r, int)), 0)

    def tick(self, updates: list[Update]) -> None:
        time = self.progress
        self.records += [[(k, time, d) for k, _, d in updates], time + 1]

    def trim(self, below: int) -> None:
        """Delete the records below `below`, never the partition's last one."""
        self.start = max(self.start, min(below, len(self.records) - 1))

    def updates(self, end: int | None = None, below: int | None = None) -> list[Update]:
        """Every update of the records before offset `end` (trimmed ones too), at times before
        `below`."""
        return [
            u
            for r in self.records[:end]
            if not isinstance(r, int)
            for u in r
            if below is None or u[1] < below
        ]


def fold_desired(
    desired: Desired,
    world: World,
) -> Callable[..., int]:
    """`services.write.fold.fold_desired` on `desired` (its contract, module docs there)."""

    def fold(
        bootstrap: str,
        topic: str,
        dead_letter_topic: str,
        partition: int,
        row_schema: pa.Schema,
        partitioning: int,
        state: Any,
        until: Frontier | None = None,
        wait: float = 0.0,
        *,
        sink_id: str = "",
        why: str = "",
        readers: Any = None,
        framing: Any = None,
        max_bytes: int = 0,
    ) -> int:
        if until is not None and until.less_equal(state.desired_frontier):
            return 0
        actor = getattr(world._local, "actor", None)
        if actor is not None:
            world.yield_point(actor)  # the read takes its time: pauses, crashes
        if state.folded_offset < desired.start:
            raise DesiredGone(sink_id, topic, partition, state.folded_offset, desired.start, why)
        offset, updates = state.folded_offset, []
        frontier = state.desired_frontier
        reached = until is None
        while offset < len(desired.records):
            record = desired.records[offset]
            offset += 1
            if isinstance(record, int):
                frontier = advance(frontier, Frontier.at(record)).frontier
                if until is not None and until.less_equal(frontier):
                    reached = True
                    break
            else:
                updates += record
        if not reached:
            raise MvsinkError(f"{topic}[{partition}]: its progress did not reach {until}")
        state.folded_offset, state.desired_frontier = offset, frontier
        if updates:
            state.correction.insert(_table(updates))
        return 0

    return fold


def _table(updates: list[Update]) -> pa.Table:
    keys, times, diffs = zip(*updates, strict=True) if updates else ((), (), ())
    table = pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            TIME: pa.array(times, pa.int64()),
            DIFF: pa.array(diffs, pa.int64()),
        }
    )
    return normalize_updates(table, ROWS)


def _net(updates: list[Update]) -> Counter[int]:
    return _rows(updates)


# -- the task workers' pieces ------------------------------------------------------------------


class SimFuture(Future[Any]):
    """A future a pipelined create's actor completes; waiting for it yields the waiter."""

    def __init__(self, world: World) -> None:
        super().__init__()
        self.world = world

    def result(self, timeout: float | None = None) -> Any:
        actor = getattr(self.world._local, "actor", None)
        while actor is not None and not self.done():
            actor.sleep(0.05)
        return super().result(timeout)


class SimPool(Executor):
    """A resident's create threads: each submitted create runs as an actor of its own."""

    def __init__(self, world: World, name: str) -> None:
        self.world, self.name, self.count = world, name, 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = SimFuture(self.world)
        self.count += 1

        def body(actor: Actor) -> None:
            if future.done():  # (a restart after the create ended)
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except Stop:
                future.set_exception(OSError("the world stopped"))
                raise
            except Exception as error:
                future.set_exception(error)
            except BaseException as error:  # its Python worker died mid-create
                future.set_exception(OSError(f"the create's worker died: {error!r}"))

        self.world.spawn(f"{self.name}-create{self.count}", body)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        pass


class QueuedCollector:
    """A worker's collector of superseded versions: the keys wait for the `checkpoint-gc`
    actor, which deletes them whenever it runs (late, after pauses, or never)."""

    def __init__(self, sim: ChainSim) -> None:
        self.sim = sim

    def collect(self, keys: list[str]) -> None:
        self.sim.garbage.extend(keys)

    def settle(self) -> None:
        pass


class SimCheckpoints(Checkpoints):
    """`Checkpoints` that writes where each version came from into its metadata (`sim_id`, and
    `sim_parent`: the `sim_id` of the version this worker continued from), for the checker."""

    def __init__(self, sim: ChainSim, actor: Actor, name: str) -> None:
        super().__init__(sim.blob, actor, QueuedCollector(sim))
        self.name, self.rng = name, sim.world.rng
        #: The `sim_id` of each version this worker loaded or created.
        self.seen: dict[int, str] = {-1: "empty"}

    def _read(self, sink_id: str, partition: int, version: int) -> tuple[pa.Table, bool, int]:
        table, legacy, size = super()._read(sink_id, partition, version)
        meta = _meta(table.schema)
        self.seen[version] = meta.get("sim_id", "?")
        return table, legacy, size

    def create(self, sink_id: str, partition: int, snap: Snapshot) -> int | None:
        sim_id = f"{self.name}:{snap.version}:{self.rng.getrandbits(32):08x}"
        meta = {**snap.meta, "sim_id": sim_id, "sim_parent": self.seen.get(snap.version - 1, "?")}
        size = super().create(sink_id, partition, replace(snap, meta=meta))
        if size is not None:
            self.seen[snap.version] = sim_id
        return size


def _meta(schema: pa.Schema) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(schema.metadata[b"mvsink.write"])
    return raw


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Driver:
    """What one write driver process holds (lost in a crash) and what its executor keeps."""

    name: str
    worker: WriteWorker | None = None
    chains: chain.Chains | None = None
    target: tuple[Frontier | None, dict[int, Frontier]] = (None, {})
    incarnation: int = 0


class ChainSim:
    """One seeded run of the checkpoint chain: the world, its checkers, the actors."""

    def __init__(
        self, seed: int, faults: Faults = FAULTS, repair: bool = True, hold_at_gain: bool = True
    ) -> None:
        self.world = World(seed, faults)
        self.hold_at_gain = hold_at_gain
        self.checker = Checker(self.world)
        self.chain_checker = ChainChecker(self)
        self.world.checks += [self.checker, self.chain_checker]
        self.world.transient = (*self.world.transient, IndefiniteAppend)
        self.blob = simshard.create_shard(self.world)
        self.desired = Desired()
        self.garbage: list[str] = []
        self.drivers = {name: Driver(name) for name in ("driver0", "driver1")}
        #: Which drivers take the partition for theirs (the consumer group, as each sees it).
        self.owners: set[str] = {"driver0"}
        self.repairs = 0
        self.steps = Counter[str]()
        self.checker()
        for name in self.drivers:
            self.spawn(name, driver)
            self.spawn(name.replace("driver", "lease"), lease_keeper)
        self.spawn("owners", owners)
        self.spawn("upstream", upstream)
        self.spawn("checkpoint-gc", checkpoint_gc)
        self.spawn("compactor", simshard.compactor)
        self.spawn("gc", simshard.collector)
        if repair:
            self.spawn("repair", repairer)

    # (what `simshard`'s actors use of a sim)
    def shard(self, actor: Actor) -> Shard:
        shard = Shard(None, "sim", SHARD, ROWS, TIMING, blob=self.blob, clock=actor)
        shard.s3 = SIM_S3
        shard.read_threads = 1
        self.checker.handles.append(shard)
        return shard

    def checkpoints(self, actor: Actor, name: str) -> SimCheckpoints:
        return SimCheckpoints(self, actor, name)

    def spawn(self, name: str, body: Callable[[Any, Actor], None]) -> None:
        self.world.spawn(name, lambda actor: body(self, actor))

    def run(self, steps: int) -> None:
        with mock.patch.object(task, "fold_desired", fold_desired(self.desired, self.world)):
            self.world.run(steps)
        self.chain_checker()


def driver(sim: ChainSim, actor: Actor) -> None:
    """A write driver (module docs): started afresh after a crash."""
    me = sim.drivers[actor.name]
    me.incarnation += 1
    world, rng = sim.world, sim.world.rng
    if me.worker is None or rng.random() < 0.5:  # its executor died with it, or survived
        me.worker = worker(sim, actor, me.name)
    shard = sim.shard(actor)
    store = sim.checkpoints(actor, f"{me.name}-driver")
    chains = me.chains = chain.Chains.starting(TRIM_INTERVAL, actor.monotonic())
    me.target = (None, {})
    spec = replace(SPEC, writer_id=f"{me.name}.{me.incarnation}")
    while True:
        owned = me.name in sim.owners
        if owned and PARTITION not in chains.owned:
            latest = store.collect_superseded(SINK, PARTITION)
            held = _hold_at_gain(sim, shard, store, spec.writer_id, latest)
            chains.gain(PARTITION, latest, held)
            world.note(f"{me.name} gained p0 at {chains.chains[PARTITION].expected}")
        elif not owned and PARTITION in chains.owned:
            chains.lose(PARTITION)
            world.note(f"{me.name} lost p0")
        me.target = _target(chains)
        if not owned:
            actor.sleep(rng.uniform(0.1, 1.0))
            continue
        if chains.gone():  # `_recheck_gone`: folded again once its version changed
            _dispatch(chains, store, chains.absorb_latest(PARTITION, store.latest(SINK, PARTITION)))
            if chains.gone():
                actor.sleep(rng.uniform(0.5, 2.0))
                continue
        upper = shard.upper()
        progress = sim.desired.progress
        staging = PARTITION not in chains.unchecked() and (upper.time or 0) < progress
        if not staging and rng.random() < 0.6 and PARTITION not in chains.unchecked():
            actor.sleep(rng.uniform(0.1, 1.0))
            continue
        desc = None
        if staging:
            lower = upper.time or 0
            desc = BatchDescription(SINK, BatchId(0, lower), upper, Frontier.at(progress), 0)
        plan = chains.spec(PARTITION, staging)
        step = StepSpec(spec, PARTITION, plan.version, desc, mode=plan.mode, durable=plan.durable)
        try:
            result = task.run_task(step, me.worker)
        except Exception as error:
            if not transient(error):
                raise  # a driver would exit: the run fails
            world.note(f"{me.name}: step failed, retried: {error!r}")
            sim.steps["failed"] += 1
            continue
        sim.steps[_kind(result)] += 1
        _dispatch(chains, store, chains.absorb_result(result, staging))
        me.target = _target(chains)
        if desc is not None:
            sim.chain_checker.staged(result, desc)
            _append(sim, shard, result, desc)
        below = chains.trim_below(actor.monotonic())
        if below and PARTITION in below:
            sim.desired.trim(below[PARTITION])
            world.note(f"{me.name} trimmed desired below {below[PARTITION]}")


def _hold_at_gain(
    sim: ChainSim, shard: Shard, store: Checkpoints, writer_id: str, latest: int
) -> Frontier | None:
    """The partition's critical hold, taken before any step at the newest version's
    `persist_folded` (at `since`, for none), where the chain starts holding it (`hold_at_gain`;
    without it the first checkpoints a driver creates are unheld until its lease keeper's next
    round, and a keeper paused past the lease, or a driver killed, leaves them to `since`)."""
    if not sim.hold_at_gain:
        return None
    return shell.hold_at_gain(store, shard, SINK, writer_id, PARTITION, latest)


def worker(sim: ChainSim, actor: Actor, name: str) -> WriteWorker:
    """A resident task's worker in a fresh Python worker: no warm copies, the store's handles."""
    states = StateCache(warm_copies=False, warm_dir=None)
    made = WriteWorker(states, creates=SimPool(sim.world, name))  # type: ignore[arg-type]
    made.stores[SIM_S3] = sim.checkpoints(actor, name)
    made.shards[SHARD] = sim.shard(actor)
    return made


def _target(chains: chain.Chains) -> tuple[Frontier | None, dict[int, Frontier]]:
    return chains.hold_target()


def _dispatch(chains: chain.Chains, store: Checkpoints, commands: list[Any]) -> None:
    """The shell's dispatch of the chains' commands (only `ReadLatest` does I/O)."""
    for command in commands:
        match command:
            case chain.ReadLatest(partition=p):
                _dispatch(chains, store, chains.absorb_latest(p, store.latest(SINK, p)))
            case _:
                pass


def _append(sim: ChainSim, shard: Shard, result: StepResult, desc: BatchDescription) -> None:
    """What append does with the step's batch: appended at its lower, or refused."""
    outcome = result.outcome
    if not isinstance(outcome, Ran) or not isinstance(outcome.batch, Stage):
        return
    parts = [] if outcome.part is None else [outcome.part]
    try:
        shard.compare_and_append(parts, desc.lower, desc.upper)
    except (PartTooOld, IndefiniteAppend) as error:
        sim.world.note(f"append: {type(error).__name__}")


def _kind(result: StepResult) -> str:
    outcome = result.outcome
    return type(outcome.checkpoint if isinstance(outcome, Ran) else outcome).__name__


# -- the other actors --------------------------------------------------------------------------


def lease_keeper(sim: ChainSim, actor: Actor) -> None:
    """`WriteShell._keep_lease`: the lease and the critical hold follow the driver's target."""
    me = sim.drivers[actor.name.replace("lease", "driver")]
    shard = sim.shard(actor)
    while True:
        hold, holds = me.target
        named = {holder_id(SINK, p): f for p, f in holds.items()}
        writer = f"{me.name}.{me.incarnation}"
        try:
            try:
                shard.lease(writer, hold, holds=named)
            except AsOfBeforeSince:
                shard.lease(writer, holds=named)
        except (AsOfBeforeSince, IndefiniteAppend, OSError) as error:
            sim.world.note(f"{actor.name}: {error!r}")
        actor.sleep(HOLD_INTERVAL)


def owners(sim: ChainSim, actor: Actor) -> None:
    """The consumer group: the partition moves to the other driver now and then; the old owner
    sees its revocation a while later."""
    rng = sim.world.rng
    while True:
        actor.sleep(rng.uniform(5.0, 40.0))
        old = sorted(sim.owners)
        new = "driver1" if "driver0" in old else "driver0"
        sim.owners.add(new)
        sim.world.note(f"owners: {new} gains p0")
        actor.sleep(rng.uniform(0.0, 10.0))
        sim.owners.difference_update(o for o in old if o != new)
        sim.world.note(f"owners: {sorted(sim.owners)}")


def upstream(sim: ChainSim, actor: Actor) -> None:
    """Desired ticks: a few updates at the partition's progress, then the next progress."""
    rng = sim.world.rng
    while True:
        updates = [(rng.randrange(6), 0, rng.choice((1, 1, -1))) for _ in range(rng.randint(0, 3))]
        sim.desired.tick(updates)
        actor.sleep(rng.uniform(0.2, 2.0))


def checkpoint_gc(sim: ChainSim, actor: Actor) -> None:
    """The task workers' collector threads: delete the superseded versions queued."""
    rng = sim.world.rng
    while True:
        if sim.garbage:
            keys, sim.garbage[:] = list(sim.garbage), []
            with contextlib.suppress(OSError):
                sim.blob.remove(keys)
        actor.sleep(rng.uniform(0.0, 2.0))


def repairer(sim: ChainSim, actor: Actor) -> None:
    """`mvsink repair <sink> --partition 0`: `services.write.repair.plan` (the newest `Progress`
    of what is left of desired within the shard's `[since, upper]`), then its `reseed`."""
    rng = sim.world.rng
    shard, store = sim.shard(actor), sim.checkpoints(actor, "repair")
    while True:
        actor.sleep(rng.uniform(30.0, 120.0))
        state = shard.state()
        since, upper = state.since.time or 0, state.upper.time or 0
        desired = sim.desired
        best = None
        for offset in range(desired.start, len(desired.records)):
            record = desired.records[offset]
            if isinstance(record, int) and since <= record <= upper:
                best = (record, offset + 1)
        if best is None:
            continue
        frontier, folded_offset = best
        ahead = [u for u in desired.updates(folded_offset) if u[1] >= frontier]
        replaces = store.latest(SINK, PARTITION)
        seed = Seed(
            PARTITION, Frontier.at(frontier), folded_offset, desired.start, _table(ahead), replaces
        )
        try:
            [(_, version)] = reseed(shard, store, SINK, [seed], "repair", ROWS)
        except AsOfBeforeSince:  # since passed the frontier meanwhile: planned again
            continue
        except MvsinkError as error:  # a lost race: run again
            sim.world.note(f"repair: {error}")
            continue
        sim.repairs += 1
        sim.world.note(f"repair seeded version {version} at {frontier}, offset {folded_offset}")


# -- the checks --------------------------------------------------------------------------------


@dataclass
class Version:
    """A checkpoint version as first created."""

    sim_id: str
    parent: str
    writer: str
    folded_offset: int
    persist_folded: Frontier
    corrections: Counter[int]


class ChainChecker:
    """The chain's checks (module docs), from what is in the store and the desired log."""

    def __init__(self, sim: ChainSim) -> None:
        self.sim = sim
        self.genuine: dict[int, Version] = {}
        self.rewritten = 0
        self.seen_writes = 0
        self.checked_upper = 0
        self.created = 0
        self.stages = 0

    def __call__(self) -> None:
        sim, world = self.sim, self.sim.world
        for key in world.writes[self.seen_writes :]:
            if not key.startswith(PREFIX):
                continue
            version = int(key.rsplit("/", 1)[-1].split(".")[0])
            stored = world.objects.get(key)
            if version in self.genuine:
                self.rewritten += 1
                world.note(f"checkpoint {version} written again")
                continue
            assert stored is not None, f"{key} gone in the step that wrote it"
            self._absorb(version, stored.data)
        self.seen_writes = len(world.writes)
        if not self.genuine:
            return
        newest = max(self.genuine)
        shard_state = self.sim.checker.genuine[max(self.sim.checker.genuine)]
        persist = self.genuine[newest].persist_folded
        assert not since_passed(persist, shard_state.since), (
            f"invariant 0: the shard's since {shard_state.since} passed checkpoint {newest}'s "
            f"persist_folded {persist}"
        )
        for version in (newest, newest - 1):
            found = self.genuine.get(version)
            if found is not None and checkpoint_key(SINK, PARTITION, version) in world.objects:
                assert sim.desired.start <= found.folded_offset, (
                    f"desired trimmed below {sim.desired.start}, past checkpoint {version}'s "
                    f"folded_offset {found.folded_offset}"
                )
        upper = shard_state.upper.time or 0
        if upper != self.checked_upper:
            shard = self.sim.checker.model(upper)
            desired = _net(sim.desired.updates(below=upper))
            assert shard == desired, (
                f"the shard before {upper} holds {dict(shard)}, desired {dict(desired)}"
            )
            self.checked_upper = upper

    def staged(self, result: StepResult, desc: BatchDescription) -> None:
        """Invariant 1: a step stages only with the shard folded to the description's lower
        and desired folded to its upper."""
        outcome = result.outcome
        if isinstance(outcome, Ran) and isinstance(outcome.batch, Stage):
            assert result.persist_folded == desc.lower, (
                f"invariant 1: staged {desc} with the shard folded to {result.persist_folded}"
            )
            assert desc.upper.less_equal(result.desired_frontier), (
                f"invariant 1: staged {desc} with desired folded to {result.desired_frontier}"
            )
            self.stages += 1

    def _absorb(self, version: int, data: bytes) -> None:
        table = pa.ipc.open_stream(data).read_all()
        meta = _meta(table.schema)
        found = Version(
            meta["sim_id"],
            meta.get("sim_parent", "repair"),
            meta["writer_id"],
            meta["folded_offset"],
            Frontier.from_elements(meta["persist_folded"]),
            _rows(table),
        )
        if found.writer != "repair":
            parent = "empty" if version == 0 else self.genuine.get(version - 1)
            expected = parent if isinstance(parent, str) else getattr(parent, "sim_id", None)
            assert found.parent == expected, (
                f"invariant 4: version {version} ({found.sim_id}) was created from "
                f"{found.parent}, not from version {version - 1} as created ({expected})"
            )
        shard = self.sim.checker.model(found.persist_folded.time)
        desired = _net(self.sim.desired.updates(found.folded_offset))
        desired.subtract(shard)
        assert found.corrections == _rows([(k, 0, d) for k, d in desired.items()]), (
            f"version {version} holds corrections {dict(found.corrections)}, not desired "
            f"before offset {found.folded_offset} minus the shard before {found.persist_folded}"
        )
        self.genuine[version] = found
        self.created += 1


__all__ = ["START", "ChainSim", "Crash"]

"""The shard protocol under the deterministic world (`simworld`): real `mvsink.shard`
code (appends, compare-and-merge, leases, GC, the sweeper) and the write service's fold
(`services.write.fold.fold_persist`) as actors, and the checks made after every store call.

Checks (`Checker`), from what is actually in the store:

* the chain: the first object ever written at each state seqno is *the* version; each one's
  upper and since are at or past its predecessor's;
* no handle ever takes an object written again at a pruned seqno for the latest version (a
  collector may read one while it deletes it);
* the latest version references no missing part, and its contents at `since`, at `upper` and
  at a frontier between equal the model's: every update of every batch ever appended;
* every `Appended` a writer was told is the version that appended its parts;
* a retained version whose parts are all there has the model's contents at a frontier in
  `[since, upper]`; every reader's snapshot equals the model at its `as_of`;
* a pinned reader (`PinnedRead`) reading its parts slowly never finds one gone while its
  lease lives, and its read equals the model at its `as_of`;
* every fold's corrections equal desired (nothing) minus the shard's contents at its upper;
* at the end, after the collector and the sweeper ran with every grace passed: no pruned seqno
  written again is left, no part is left that no version references, few versions are left.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable

import pyarrow as pa
from simworld import START, Actor, Faults, SimBlob, World

from mvsink.core.frontier import Frontier
from mvsink.core.partitioning import CURRENT
from mvsink.core.settings import CompactionPolicy, S3Settings, Secret, Timing
from mvsink.core.updates import DIFF, TIME, part_schema
from mvsink.shard import (
    Appended,
    AsOfBeforeSince,
    IndefiniteAppend,
    PartGone,
    PartTooOld,
    Shard,
    ShardState,
)
from mvsink.shard.compact import compact_once, merge_on
from mvsink.shard.parts import consolidate_at, decode_part
from mvsink.shard.pin import PinnedRead
from services.write import checkpoint
from services.write.fold import SincePassed, fold_persist

ROWS = pa.schema([("k", pa.int64())])
SHARD = "sim"
PREFIX = f"shards/{SHARD}"
#: The bounds, shrunk as the integration tests shrink them; pauses go far past each.
TIMING = Timing(
    max_attempt_age=3.0,
    max_part_age=20.0,
    min_grace=30.0,
    poll_interval=0.05,
    part_grace=2.0,
    version_grace=8.0,
    reader_lease=15.0,
    request_timeout=3.0,
)
SIM_S3 = S3Settings("sim:0", "sim", "us-east-1", Secret("sim"), Secret("sim-secret"), False)
POLICY = CompactionPolicy(max_amplification=1.0, size_ratio=1.0, min_merge=2, max_batches=4)
#: The faults of a seed sweep: pauses past every bound, slow calls, lost replies, crashes.
FAULTS = Faults(
    pause_p=0.02, pause=120.0, slow_p=0.1, slow=2.0, lost_p=0.02, crash_p=0.005, skew=0.2
)

Rows = Counter[int]


Update = tuple[int, int, int]  # key, time, diff


def _updates(table: pa.Table) -> list[Update]:
    return list(zip(*(table.column(n).to_pylist() for n in ("k", TIME, DIFF)), strict=True))


def _rows(table: pa.Table | list[Update], below: int | None = None) -> Rows:
    """The net diff per key of the updates (with time `< below`)."""
    net: Rows = Counter()
    for key, time, diff in _updates(table) if isinstance(table, pa.Table) else table:
        if below is None or time < below:
            net[key] += diff
    return _net(net)


def _net(counter: Rows) -> Rows:
    return Counter({k: v for k, v in counter.items() if v})


class Checker:
    """What the store holds, checked against the model after every step (module docs)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.genuine: dict[int, ShardState] = {}
        self.rewritten: set[str] = set()
        self.parts: dict[str, list[Update]] = {}
        self._models: dict[int | None, Rows] = {}
        self.seen_writes = 0
        self.handles: list[Shard] = []
        self.latest_checked = -1
        self.folds = 0
        self.appends = 0
        self.reads = 0
        self.pinned_reads = 0

    def __call__(self) -> None:
        world = self.world
        for key in world.writes[self.seen_writes :]:
            stored = world.objects.get(key)
            if key.startswith(f"{PREFIX}/state/"):
                seqno = int(key.rsplit("/", 1)[-1])
                if seqno in self.genuine:
                    self.rewritten.add(key)
                    world.note(f"version {seqno} written again")
                    continue
                assert stored is not None, f"{key} gone in the step that wrote it"
                state = ShardState.from_bytes(stored.data)
                if seqno:
                    before = self.genuine.get(seqno - 1)
                    assert before is not None, f"version {seqno} has no predecessor"
                    assert before.upper.less_equal(state.upper), f"upper regressed at {seqno}"
                    assert before.since.less_equal(state.since), f"since regressed at {seqno}"
                self.genuine[seqno] = state
                self._models.clear()
            elif key.startswith(f"{PREFIX}/parts/") and stored is not None:
                self.parts[key] = _updates(decode_part(stored.data, ROWS))
        self.seen_writes = len(world.writes)
        for handle in self.handles:  # what each handle takes for the latest version
            cached = None if handle._latest is None else handle._states.get(handle._latest)
            if cached is not None and cached[1] == handle._latest_etag:
                assert cached[0].nonce == self.genuine[handle._latest].nonce, (
                    f"a handle took version {handle._latest} written again for the latest"
                )
        latest = max(self.genuine)
        if latest != self.latest_checked:
            self.check_contents(self.genuine[latest])
            self.latest_checked = latest
        self.check_retained()

    def model(self, below: int | None) -> Rows:
        """Every update ever appended (by a version of the chain), with time `< below`."""
        if below not in self._models:
            net: Rows = Counter()
            for state in self.genuine.values():
                if state.appended is not None:
                    for part in state.appended.parts:
                        net.update(_rows(self.parts[part.key], below))
            self._models[below] = _net(net)
        return self._models[below]

    def contents(self, state: ShardState, below: int | None) -> Rows:
        net: Rows = Counter()
        for part in state.parts():
            assert part.key in self.world.objects, (
                f"version {state.seqno} (the latest) references a missing part {part.key}"
            )
            net.update(_rows(self.parts[part.key], below))
        return _net(net)

    def check_contents(self, state: ShardState) -> None:
        since, upper = state.since.time or 0, state.upper.time or 0
        for as_of in sorted({since, upper, self.world.rng.randint(since, upper)}):
            assert self.contents(state, as_of) == self.model(as_of), (
                f"version {state.seqno}: contents at {as_of} differ from what was appended"
            )

    def check_retained(self) -> None:
        """One retained version, picked at random: its contents at a frontier in `[since,
        upper]` equal the model's, unless a part it names is gone (a merge replaced it more
        than `part_grace` ago: readers of that version start over from the latest)."""
        retained = [
            int(k.rsplit("/", 1)[-1])
            for k in self.world.objects
            if k.startswith(f"{PREFIX}/state/") and k not in self.rewritten
        ]
        state = self.genuine[self.world.rng.choice(retained)]
        if all(p.key in self.world.objects for p in state.parts()):
            since, upper = state.since.time or 0, state.upper.time or 0
            as_of = self.world.rng.randint(since, upper)
            net: Rows = Counter()
            for part in state.parts():
                net.update(_rows(self.parts[part.key], as_of))
            assert _net(net) == self.model(as_of), (
                f"retained version {state.seqno}: contents at {as_of} differ from the model"
            )

    def read(self, rows: Rows, as_of: int) -> None:
        """A reader's snapshot at `as_of`."""
        assert rows == self.model(as_of), f"a snapshot at {as_of} differs from the model"
        self.reads += 1

    def claim(self, seqno: int, keys: set[str]) -> None:
        """A writer was told `Appended(seqno)` for the parts `keys`."""
        appended = self.genuine[seqno].appended
        assert appended is not None and {p.key for p in appended.parts} == keys, (
            f"told Appended at {seqno}, but that version did not append {sorted(keys)}"
        )
        self.appends += 1

    def fold(self, state: checkpoint.PartitionState, upper: Frontier) -> None:
        """A fold's corrections: desired (nothing) minus the shard's contents at `upper`."""
        corrections = _rows(state.correction.consolidate())
        expected = Counter({k: -v for k, v in self.model(upper.time).items()})
        assert corrections == expected, (
            f"a fold to {upper} holds corrections {dict(corrections)}, not {dict(expected)}"
        )
        self.folds += 1


class Sim:
    """One seeded run: the world, its checker, the actors."""

    def __init__(self, seed: int, faults: Faults = FAULTS) -> None:
        self.world = World(seed, faults)
        self.checker = Checker(self.world)
        self.world.checks.append(self.checker)
        self.world.transient = (*self.world.transient, IndefiniteAppend)
        self.blob = create_shard(self.world)
        self.checker()

    def shard(self, actor: Actor) -> Shard:
        """A fresh handle for `actor` (after a crash too: nothing cached)."""
        shard = Shard(None, "sim", SHARD, ROWS, TIMING, blob=self.blob, clock=actor)
        shard.s3 = SIM_S3
        shard.read_threads = 1
        self.checker.handles.append(shard)
        return shard

    def spawn(self, name: str, body: Callable[[Sim, Actor], None]) -> None:
        self.world.spawn(name, lambda actor: body(self, actor))

    def standard(self, appenders: int = 2) -> Sim:
        for n in range(appenders):
            self.spawn(f"append{n}", appender)
        self.spawn("compactor", compactor)
        self.spawn("gc0", collector)
        self.spawn("gc1", collector)
        self.spawn("fold", folder)
        self.spawn("reader", reader)
        self.spawn("pinned", pinned_reader)
        self.spawn("lease", leaser)
        return self

    def run(self, steps: int) -> None:
        self.world.run(steps)
        self.finish()

    def finish(self) -> None:
        """Every grace passes; the collector and the sweeper run undisturbed; nothing may be
        left that they should have deleted."""
        world = self.world
        world.now += TIMING.min_grace + TIMING.version_grace + 1
        janitor = Shard(None, "sim", SHARD, ROWS, TIMING, blob=self.blob, clock=FixedClock(world))
        for _ in range(3):
            janitor.sweep(TIMING.min_grace)
            world.now += TIMING.version_grace + 1
        self.checker()
        retained = janitor.retained_seqnos()
        left = [k for k in self.checker.rewritten if k in world.objects]
        assert not left, f"pruned versions written again are left: {left}"
        assert len(retained) <= 3, f"{len(retained)} versions left after the collector ran"
        referenced = janitor.referenced_keys()
        parts = {k for k in world.objects if k.startswith(f"{PREFIX}/parts/")}
        assert parts <= referenced, f"parts no version references: {sorted(parts - referenced)}"


def create_shard(world: World) -> SimBlob:
    """The simulated store of `world`, holding the shard `SHARD` (created at the world's start)."""
    blob = SimBlob(world)
    Shard.create_or_open(
        None,
        "sim",
        SHARD,
        ROWS,
        TIMING,
        3,
        blob=blob,  # type: ignore[arg-type]
        clock=FixedClock(world),
    )
    return blob


class FixedClock:
    """The world's clock, for calls made outside any actor (setup, the final janitor)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def time(self) -> float:
        return self.world.now

    def monotonic(self) -> float:
        return self.world.now

    def sleep(self, seconds: float) -> None:
        self.world.now += seconds


# -- actors -------------------------------------------------------------------------------------


def appender(sim: Sim, actor: Actor) -> None:
    """A writer appending one part per batch at the shard's upper, as the append service does
    (a lost race deletes its staged part; a part too old is dropped)."""
    shard, rng = sim.shard(actor), sim.world.rng
    while True:
        upper = shard.upper()
        time = upper.time or 0
        keys = [rng.randrange(8) for _ in range(rng.randint(1, 3))]
        table = pa.table(
            {
                "k": pa.array(keys, pa.int64()),
                TIME: pa.array([time] * len(keys), pa.int64()),
                DIFF: pa.array([rng.choice((1, 1, -1)) for _ in keys], pa.int64()),
            }
        )
        part = shard.stage(table, upper, Frontier.at(time + 1), actor.name, 0, 1)
        try:
            result = shard.compare_and_append([part], upper, Frontier.at(time + 1))
        except (PartTooOld, IndefiniteAppend) as error:
            sim.world.note(f"{actor.name}: {type(error).__name__}")
            continue
        if isinstance(result, Appended):
            sim.checker.claim(result.seqno, {part.key})
        else:
            shard.delete_staged([part])
        actor.sleep(rng.uniform(0, 1.0))


def compactor(sim: Sim, actor: Actor) -> None:
    """Merges as the write service's compactor runs them, in this process."""
    shard, rng = sim.shard(actor), sim.world.rng

    def runner(tasks: list, _: Shard | None = None) -> list:  # type: ignore[type-arg]
        return [merge_on(shard, task) for task in tasks]

    while True:
        try:
            compact_once(shard, POLICY, actor.name, runner, force=rng.random() < 0.2)
        except (PartTooOld, IndefiniteAppend) as error:
            sim.world.note(f"{actor.name}: {type(error).__name__}")
        actor.sleep(rng.uniform(0, 3.0))


def collector(sim: Sim, actor: Actor) -> None:
    """Garbage collection often, a sweep now and then; now and then a fresh handle (a restarted
    compactor, an operator's `mvsink shard sweep`: nothing collected yet)."""
    shard, rng = sim.shard(actor), sim.world.rng
    while True:
        if rng.random() < 0.1:
            shard = sim.shard(actor)
        if rng.random() < 0.3:
            shard.sweep(TIMING.min_grace)
        else:
            shard.collect_garbage()
        actor.sleep(rng.uniform(0, 2.0))


def folder(sim: Sim, actor: Actor) -> None:
    """The write task's step 3 (`fold_persist`, desired empty), its read lease kept at what it
    folded (a pause lets it lapse), a rebuild when `since` passed its fold (`SincePassed`)."""
    shard, rng = sim.shard(actor), sim.world.rng
    state = checkpoint.empty(ROWS, 0, -1)
    while True:
        shard_state = shard.state()
        for _ in range(20):
            try:
                fold_persist(0, 1, CURRENT, state, shard, shard_state)
                break
            except PartGone:
                shard_state = shard.state()
            except SincePassed:
                sim.world.note(f"{actor.name}: since passed {state.persist_folded}: rebuilding")
                state, shard_state = checkpoint.empty(ROWS, 0, -1), shard.state()
        else:
            continue
        state.correction.advance_since(shard_state.upper)
        state.correction.consolidate()
        sim.checker.fold(state, shard_state.upper)
        with contextlib.suppress(AsOfBeforeSince):  # a lapsed lease: since moved on
            shard.lease(actor.name, state.persist_folded)
        actor.sleep(rng.uniform(0, 2.0))


def leaser(sim: Sim, actor: Actor) -> None:
    """A write driver's lease keeper: renews its lease often (each renewal a version that
    leaves the upper where it is)."""
    shard, rng = sim.shard(actor), sim.world.rng
    while True:
        with contextlib.suppress(AsOfBeforeSince):
            shard.lease(actor.name)
        actor.sleep(rng.uniform(0, 0.5))


def reader(sim: Sim, actor: Actor) -> None:
    """`Shard.snapshot` at a frontier between `since` and the upper, under a lease."""
    shard, rng = sim.shard(actor), sim.world.rng
    while True:
        state = shard.state()
        as_of = rng.randint(state.since.time or 0, state.upper.time or 0)
        try:
            shard.lease(actor.name, Frontier.at(as_of))
            table = shard.snapshot(as_of)
        except (AsOfBeforeSince, PartGone):  # since moved on, or parts kept vanishing: again
            continue
        sim.checker.read(_rows(table), as_of)
        actor.sleep(rng.uniform(0, 2.0))


def pinned_reader(sim: Sim, actor: Actor) -> None:
    """A long read, as a Spark job over many parts (`mvsink.shard.spark`): a `PinnedRead` at a
    frontier between `since` and the upper, then its parts one at a time with a wait between
    (past `part_grace`, so a merge's collector would delete unpinned ones under it), the lease
    renewed between parts. A part gone is a failure unless the pin lapsed (a pause past the
    lease, which `renew` must then report)."""
    shard, rng = sim.shard(actor), sim.world.rng
    while True:
        state = shard.state()
        as_of = Frontier.at(rng.randint(state.since.time or 0, state.upper.time or 0))
        try:  # a fresh reader id (a crash restarts this actor, whose old lease may still live)
            read = PinnedRead(shard, f"{actor.name}.{rng.getrandbits(32):08x}", as_of)
        except (AsOfBeforeSince, PartGone):  # since moved on, or paused past the lease
            continue
        parts = [p for b in read.state.batches if b.lower.less_than(as_of) for p in b.parts]
        tables = [part_schema(ROWS).empty_table()]
        try:
            for part in parts:
                tables.append(shard.read_part(part))
                actor.sleep(rng.uniform(0, 4 * TIMING.part_grace))
                if not read.renew():
                    raise PartGone("lapsed")
        except PartGone as error:
            assert not read.renew(), f"{error} while pinned by a live lease at {read.seqno}"
            sim.world.note(f"{actor.name}: pin {read.seqno} lapsed")
            continue
        read.release()
        table = consolidate_at(pa.concat_tables(tables), ROWS, as_of)
        sim.checker.read(_rows(table), as_of.time or 0)
        sim.checker.pinned_reads += 1


def replay(seed: int, steps: int, scenario: str = "standard") -> str:
    """The one-line command that replays a seed of `scenario`."""
    return (
        f"./run test tests/sim -k test_seed_sweep --sim-seed {seed} --sim-steps {steps} "
        f"--sim-scenario {scenario}"
    )


__all__ = ["START", "Sim", "replay"]

"""The shard protocol under pauses, slow calls, lost replies, crashes and skew: a seed sweep
and the named interleavings that once lost data (`simshard` has the actors and the checks).

`./run test tests/sim` runs a fixed budget; `./run test tests/sim --sim-seeds 100000` soaks;
a failing seed prints the one line that replays it.
"""

from __future__ import annotations

import time
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from simshard import (
    FAULTS,
    POLICY,
    PREFIX,
    ROWS,
    SHARD,
    SIM_S3,
    TIMING,
    FixedClock,
    Sim,
    appender,
    collector,
    compactor,
    folder,
    leaser,
    pinned_reader,
    replay,
)
from simworld import Faults, SimBlob, World, run_seed, sweep

from mvsink.core.frontier import Frontier
from mvsink.core.partitioning import partitions_of
from mvsink.core.updates import DIFF, TIME, normalize_updates
from mvsink.io.s3 import ConditionalResult, Written
from mvsink.shard import Appended, Merged, Shard, ShardState, UpperMismatch
from mvsink.shard.compact import MergeTask, MergeTaskResult, compact_once, merge_on

#: The sweep `./run test` runs: seeds and store calls per seed (under a minute on 2 cores).
BUDGET_SEEDS = 50
BUDGET_STEPS = 2000


def _run(seed: int, steps: int, build: str = "standard") -> Sim:
    sim = Sim(seed) if build == "standard" else SCENARIOS[build](seed)
    if build == "standard":
        sim.standard()
    run_seed(sim.world, lambda: sim.run(steps), replay(seed, steps, build))
    return sim


def test_seed_sweep(request: pytest.FixtureRequest) -> None:
    """Every seed of the sweep keeps every check (`simshard`), with the fault mix `FAULTS`."""
    option = request.config.getoption
    seeds, steps = sweep(option, BUDGET_SEEDS, BUDGET_STEPS)
    started, calls, folds, appends, reads, pinned = time.monotonic(), 0, 0, 0, 0, 0
    fenced: Counter[str] = Counter()
    scenario = option("--sim-scenario")
    for n, seed in enumerate(seeds, 1):
        sim = _run(seed, steps, scenario)
        calls += sim.world.steps
        folds += sim.checker.folds
        appends += sim.checker.appends
        reads += sim.checker.reads
        pinned += sim.checker.pinned_reads
        fenced["pruned seqnos written again"] += len(sim.checker.rewritten)
        fenced["late parts refused"] += sum("PartTooOld" in line for line in sim.world.trace)
        fenced["folds rebuilt"] += sum("rebuilding" in line for line in sim.world.trace)
        fenced["pins lapsed"] += sum("lapsed" in line for line in sim.world.trace)
        if n % 100 == 0 or n == len(seeds):
            took = time.monotonic() - started
            print(
                f"[sim] {n}/{len(seeds)} seeds, {calls} store calls, {appends} appends, "
                f"{folds} folds, {reads} snapshots and {pinned} pinned reads checked in {took:.0f}s ({n / took:.1f} seeds/s, "
                f"{calls / took:.0f} calls/s); fences met: {dict(fenced)}",
                flush=True,
            )
    assert appends > 0, "the sweep appended nothing: it checked nothing"
    if scenario == "standard" and len(seeds) >= 10:
        assert folds > 0 and reads > 0 and pinned > 0, "the sweep folded or read nothing"


# -- the named interleavings ----------------------------------------------------------------


def _late_append(seed: int) -> Sim:
    """Path 1: an appender pauses for minutes inside its compare-and-append (after its age
    check), while the collector sweeps; only appends and sweeps."""
    sim = Sim(seed, Faults(pause_p=0.05, pause=200.0, slow_p=0.1, slow=1.0))
    sim.spawn("append0", appender)
    sim.spawn("append1", appender)
    sim.spawn("gc", collector)
    return sim


def _fold_after_merge(seed: int) -> Sim:
    """Path 2: a fold's parts are replaced by a merge while it reads, and `since` passes it."""
    sim = Sim(seed, Faults(pause_p=0.03, pause=40.0, slow_p=0.2, slow=3.0))
    sim.spawn("append0", appender)
    sim.spawn("compactor", compactor)
    sim.spawn("gc", collector)
    sim.spawn("fold", folder)
    return sim


def _stale_latest(seed: int) -> Sim:
    """Path 3: writers pause between reading the latest version and creating its successor
    while the collector prunes versions."""
    sim = Sim(seed, Faults(pause_p=0.05, pause=60.0, slow_p=0.1, slow=1.0, lost_p=0.05))
    sim.spawn("append0", appender)
    sim.spawn("append1", appender)
    sim.spawn("gc", collector)
    return sim


def _stray_below(seed: int) -> Sim:
    """A writer pauses before its create lands while lease renewals (versions that leave the
    upper where it is) move the chain on and collectors prune it; its create lands at a pruned
    seqno right below the retained versions, it starts over and appends the same part again;
    fresh collectors must not take the stray for a version and delete that part."""
    sim = Sim(seed, Faults(pause_p=0.05, pause=30.0, slow_p=0.1, slow=1.0, lost_p=0.1))
    sim.spawn("append0", appender)
    sim.spawn("lease", leaser)
    sim.spawn("gc0", collector)
    sim.spawn("gc1", collector)
    return sim


def _pinned_read(seed: int) -> Sim:
    """A slow pinned read (a Spark job over the parts of one version) while merges replace
    those parts and collectors run; rare pauses let a pin lapse now and then."""
    sim = Sim(seed, Faults(pause_p=0.005, pause=40.0, slow_p=0.1, slow=1.0))
    sim.spawn("append0", appender)
    sim.spawn("append1", appender)
    sim.spawn("compactor", compactor)
    sim.spawn("gc", collector)
    sim.spawn("pinned", pinned_reader)
    return sim


SCENARIOS = {
    "late-append": _late_append,
    "fold-after-merge": _fold_after_merge,
    "stale-latest": _stale_latest,
    "stray-below": _stray_below,
    "pinned-read": _pinned_read,
}
#: Each scenario's seed, and its steps, that loses data with the scenario's fence taken out (the
#: sweep horizon; the since check in every fold; the LIST read and the proven create; the prev
#: links; the collector keeping a live lease's pinned version), so the fence is what makes it
#: pass.
REGRESSIONS = {
    "late-append": (0, 3000),
    "fold-after-merge": (5, 3000),
    "stale-latest": (5, 3000),
    "stray-below": (21, 3000),
    "pinned-read": (4, 3000),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regression_seed(name: str) -> None:
    seed, steps = REGRESSIONS[name]
    _run(seed, steps, name)


def test_faults_are_injected() -> None:
    """The sweep's fault mix does happen: pauses past the bounds, crashes, lost replies."""
    sim = Sim(3, FAULTS).standard()
    sim.run(BUDGET_STEPS)
    assert sim.world.now - 1_800_000_000.0 > 120
    assert any(a.restarts for a in sim.world.actors) or "reply lost" in " ".join(sim.world.trace)


def _fresh_shard(
    retain: int, store: type[SimBlob] = SimBlob
) -> tuple[World, SimBlob, FixedClock, Shard]:
    """A world at seed 0 holding a new shard `SHARD` (`retain_history` `retain`) in `store`."""
    world = World(0)
    blob, clock = store(world), FixedClock(world)
    shard = Shard.create_or_open(
        None,
        "sim",
        SHARD,
        ROWS,
        TIMING,
        retain,
        blob=blob,
        clock=clock,  # type: ignore[arg-type]
    )
    return world, blob, clock, shard


def test_a_retry_that_writes_a_pruned_version_again_byte_for_byte_proves_nothing() -> None:
    """Writer A's create of version 1 lands, its reply is lost, and its retry (the same bytes)
    lands only after versions 1-3 were pruned; writer C read version 1 before and paused. C's
    create of "version 2" succeeds at the pruned key, and version 1 is there with the etag C
    read it with: that must not count as proof (C starts over and sees the upper moved)."""
    world, blob, clock, shard = _fresh_shard(3)
    writer_a = Shard(None, "sim", SHARD, ROWS, TIMING, blob=blob, clock=clock)
    writer_c = Shard(None, "sim", SHARD, ROWS, TIMING, blob=blob, clock=clock)
    writer_a.advance_upper(Frontier.at(1))
    version_1 = world.objects[shard.state_key(1)].data
    read_before_pausing = writer_c.state()
    assert read_before_pausing.seqno == 1
    for t in range(2, 5):
        shard.advance_upper(Frontier.at(t))
    world.now += TIMING.version_grace + 1
    shard.advance_upper(Frontier.at(5))
    assert shard.collect_garbage().states_pruned == (0, 1, 2, 3)
    blob.create(shard.state_key(1), version_1)  # A's late retry, byte for byte
    latest, calls = writer_c.state, []

    def first_stale() -> ShardState:
        calls.append(1)
        return read_before_pausing if len(calls) == 1 else latest()

    writer_c.state = first_stale  # type: ignore[method-assign]
    assert writer_c.compare_and_append((), Frontier.at(1), Frontier.at(9)) == UpperMismatch(
        Frontier.at(5), 5
    )
    assert shard.state().seqno == 5
    shard.collect_garbage()
    assert shard.retained_seqnos() == [4, 5]  # both strays deleted


def test_a_merge_whose_tasks_outlast_max_part_age_is_not_refused_every_time() -> None:
    """A merge of P = 4 partitions whose tasks run one after another for 8 s each (a large
    shard merged two tasks at a time): its first outputs are 32 s old when it commits, past
    `max_part_age` (20 s). Planned again, the same happens: compaction would never commit.
    The merge stages its too old outputs again (same bytes, fresh keys) and commits."""
    world, _, _, shard = _fresh_shard(0)
    shard.s3 = SIM_S3
    for t in range(3):
        rows = normalize_updates(
            pa.table({"k": pa.array(range(8), pa.int64()), TIME: [t] * 8, DIFF: [1] * 8}), ROWS
        )
        hashes = partitions_of(rows, ROWS, 4)
        parts = [
            shard.stage(
                rows.filter(pc.equal(hashes, p)), Frontier.at(t), Frontier.at(t + 1), "w", p, 4
            )
            for p in range(4)
        ]
        appended = shard.compare_and_append(parts, Frontier.at(t), Frontier.at(t + 1))
        assert isinstance(appended, Appended)

    def slow(tasks: list[MergeTask], _: Shard | None = None) -> list[MergeTaskResult]:
        results = []
        for task in tasks:
            results.append(merge_on(shard, task))
            world.now += 8.0
        return results

    outcome = compact_once(shard, POLICY, "merger", slow, force=True)
    assert outcome is not None and isinstance(outcome.result, Merged), outcome
    assert len(shard.state().batches) == 1
    staged = {k for k in world.objects if k.startswith(f"{PREFIX}/parts/merger/")}
    assert staged == shard.state().part_keys  # the too old outputs were not left behind


class _OtherPutEtags(SimBlob):
    """A store whose create replies carry another entity tag than its LISTs and GETs show for
    the same object (some S3-compatible stores: encryption, their own etag schemes)."""

    def create(self, key: str, data: bytes, timeout: float | None = None) -> ConditionalResult:
        outcome = super().create(key, data, timeout)
        return Written(f'"put-{outcome.etag}"') if isinstance(outcome, Written) else outcome


def test_a_store_whose_put_etags_differ_from_its_list_etags_still_proves_creates() -> None:
    """`_proven` matched the create reply's etag to the LIST's: on such a store no create was
    ever proven, and every change started over and created one more version, forever. A
    create whose etags differ is proven by its bytes (unique to the attempt by its nonce)."""
    _, _, _, shard = _fresh_shard(3, _OtherPutEtags)
    assert shard.state().seqno == 0
    shard.lease("reader")
    shard.advance_upper(Frontier.at(3))
    assert shard.state().seqno == 2 and shard.upper() == Frontier.at(3)
    assert shard.retained_seqnos() == [0, 1, 2]  # one version per change, no more

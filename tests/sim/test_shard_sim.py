"""The shard protocol under pauses, slow calls, lost replies, crashes and skew: a seed sweep
and the named interleavings that once lost data (`simshard` has the actors and the checks).

`./run test tests/sim` runs a fixed budget; `./run test tests/sim --sim-seeds 100000` soaks;
a failing seed prints the one line that replays it.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from simshard import FAULTS, Sim, appender, collector, compactor, folder, replay
from simworld import Faults

#: The sweep `./run test` runs: seeds and store calls per seed (a few minutes on 2 cores).
BUDGET_SEEDS = 150
BUDGET_STEPS = 2000


def _run(seed: int, steps: int, build: str = "standard") -> Sim:
    sim = Sim(seed) if build == "standard" else SCENARIOS[build](seed)
    if build == "standard":
        sim.standard()
    try:
        sim.run(steps)
    except BaseException as error:
        tail = "\n".join(sim.world.trace[-15:])
        raise AssertionError(
            f"seed {seed} failed after {sim.world.steps} store calls: {error!r}\n"
            f"replay: {replay(seed, steps, build)}\nlast events:\n{tail}"
        ) from error
    return sim


def test_seed_sweep(request: pytest.FixtureRequest) -> None:
    """Every seed of the sweep keeps every check (`simshard`), with the fault mix `FAULTS`."""
    option = request.config.getoption
    steps = option("--sim-steps") or BUDGET_STEPS
    if option("--sim-seed") is not None:
        seeds = [option("--sim-seed")]
    else:
        first = option("--sim-first")
        seeds = list(range(first, first + (option("--sim-seeds") or BUDGET_SEEDS)))
    started, calls, folds, appends, reads = time.monotonic(), 0, 0, 0, 0
    fenced: Counter[str] = Counter()
    scenario = option("--sim-scenario")
    for n, seed in enumerate(seeds, 1):
        sim = _run(seed, steps, scenario)
        calls += sim.world.steps
        folds += sim.checker.folds
        appends += sim.checker.appends
        reads += sim.checker.reads
        fenced["pruned seqnos written again"] += len(sim.checker.rewritten)
        fenced["late parts refused"] += sum("PartTooOld" in line for line in sim.world.trace)
        fenced["folds rebuilt"] += sum("rebuilding" in line for line in sim.world.trace)
        if n % 100 == 0 or n == len(seeds):
            took = time.monotonic() - started
            print(f"[sim] {n}/{len(seeds)} seeds, {calls} store calls, {appends} appends, "
                  f"{folds} folds, {reads} snapshots checked in {took:.0f}s ({n / took:.1f} seeds/s, "
                  f"{calls / took:.0f} calls/s); fences met: {dict(fenced)}", flush=True)  # fmt: skip
    assert appends > 0 and folds > 0 and reads > 0, "the sweep checked nothing"


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


SCENARIOS = {"late-append": _late_append, "fold-after-merge": _fold_after_merge,
             "stale-latest": _stale_latest}  # fmt: skip
#: Each scenario's seed that lost data before its fence (issue 32's paths 1-3), and its steps.
REGRESSIONS = {"late-append": (0, 3000), "fold-after-merge": (0, 3000), "stale-latest": (0, 3000)}


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

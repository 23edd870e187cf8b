"""The write service's checkpoint chain under pauses, lost replies, late creates, crashes, a
repair and desired trimming: a seed sweep and the named seeds of the defects it found
(`simchain` has the actors and the checks, one per invariant of `services.write`).

The named seeds (`REGRESSIONS`), each failing with its fix taken out:

* `collected-version`: a driver's step expects a version it knows created, which another
  owner's chain has since gone two versions past and collected; the load raised `NoCheckpoint`
  (`NoSuchKey` before), an error a driver exits on (issue 66). Fix: `Checkpoints.load` finds
  the newer versions and reports the step `Superseded` (stale).
* `collected-key-create`: a step paused between its load and its create while the chain went
  two versions on and collected the version it creates; the create found the key free and
  succeeded, and the driver took that stray object for a durable version: its hold moved past
  the chain's newest version (`since` passed it) and desired was trimmed below what the chain
  needs. Fix: `Checkpoints.create` proves its version the newest (one LIST, as the shard's
  `_proven` does) and reports it lost otherwise.
* `repair-hold-first`: a repair planned while the partition's chain went on set the critical
  hold to its frontier, behind where the chain was, before its seed existed; the running
  driver's keeper moved it back up and `since` passed the seed. Fix:
  `services.write.repair.reseed` never moves a hold before its seed is written, seeds exactly
  the version after the one it planned to replace, and refuses a partition whose chain went on
  (a newer version, or one folded or held past the frontier).
* `unheld-first-checkpoints`: a gained partition had no critical hold until its first durable
  checkpoint and a lease-keeper round after it; a keeper paused past the lease (or a driver
  killed, issue 66) left that checkpoint to `since`. Fix: the hold is taken at gain, at the
  newest version's `persist_folded`, before any step (`simchain._hold_at_gain`, the driver
  side of the shell's `_on_assign`; `ChainSim(hold_at_gain=False)` takes it out).
* `stale-chain-offsets`: a chain found stale kept the desired offsets of its own older
  versions; after a repair's seed, desired was trimmed below what the seed needs. Fix:
  `Chains.absorb_latest` forgets them (they named versions that are not the newest).
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from simchain import ChainSim
from simworld import run_seed, sweep

#: The sweep `./run test` runs: seeds and store calls per seed.
BUDGET_SEEDS = 5
BUDGET_STEPS = 3000


def replay(seed: int, steps: int) -> str:
    """The one-line command that replays a seed of the chain's sweep."""
    return f"./run test tests/sim -k test_chain_seed_sweep --sim-seed {seed} --sim-steps {steps}"


def _run(seed: int, steps: int) -> ChainSim:
    sim = ChainSim(seed)
    run_seed(sim.world, lambda: sim.run(steps), replay(seed, steps), tail=20)
    return sim


def test_chain_seed_sweep(request: pytest.FixtureRequest) -> None:
    """Every seed of the sweep keeps every check (`simchain`)."""
    seeds, steps = sweep(request.config.getoption, BUDGET_SEEDS, BUDGET_STEPS)
    started, created, staged, outcomes = time.monotonic(), 0, 0, Counter[str]()
    for n, seed in enumerate(seeds, 1):
        sim = _run(seed, steps)
        created += sim.chain_checker.created
        staged += sim.chain_checker.stages
        outcomes.update(sim.steps)
        outcomes["written again"] += sim.chain_checker.rewritten
        outcomes["repairs"] += sim.repairs
        if n % 20 == 0 or n == len(seeds):
            took = time.monotonic() - started
            print(
                f"[sim chain] {n}/{len(seeds)} seeds, {created} versions created and {staged} "
                f"parts staged, checked in {took:.0f}s; outcomes: {dict(outcomes)}",
                flush=True,
            )
    assert created > 0 and staged > 0, "the sweep created or staged nothing: it checked nothing"


#: Each defect's seed and store calls (module docs).
REGRESSIONS = {
    "collected-version": (15, 4000),
    "collected-key-create": (12, 4000),
    "repair-hold-first": (2, 4000),
    "unheld-first-checkpoints": (3, 1500),
    "stale-chain-offsets": (235, 3000),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regression_seed(name: str) -> None:
    seed, steps = REGRESSIONS[name]
    _run(seed, steps)


def test_the_first_checkpoints_are_unheld_without_a_hold_at_gain() -> None:
    """`unheld-first-checkpoints` with its fix taken out: `since` passes a new checkpoint."""
    seed, steps = REGRESSIONS["unheld-first-checkpoints"]
    sim = ChainSim(seed, hold_at_gain=False)
    with pytest.raises(AssertionError, match="invariant 0"):
        sim.run(steps)

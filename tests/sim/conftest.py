"""Options of the simulations (`tests/sim`: the shard protocol's, the write checkpoint chain's):
how many seeds, which one, how long each."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sim", "the deterministic simulations (shard, checkpoint chain)")
    group.addoption(
        "--sim-seeds",
        type=int,
        default=None,
        help="seeds to sweep (default: a fixed budget for ./run test)",
    )
    group.addoption("--sim-seed", type=int, default=None, help="replay this one seed")
    group.addoption("--sim-steps", type=int, default=None, help="store calls per seed")
    group.addoption(
        "--sim-scenario",
        default="standard",
        help="the actors and faults: standard, or a named interleaving",
    )
    group.addoption("--sim-first", type=int, default=0, help="the first seed of a sweep")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A sweep of more seeds than the budget gets 10 s a seed instead of the suite's timeout
    (which still guards the budget run against a hang)."""
    seeds = config.getoption("--sim-seeds")
    if seeds:
        for item in items:
            if item.name in ("test_seed_sweep", "test_chain_seed_sweep"):
                item.add_marker(pytest.mark.timeout(max(600, 10 * seeds)))

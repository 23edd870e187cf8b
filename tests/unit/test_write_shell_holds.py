"""The write driver's record of its partitions' checkpoints (`WriteShell._absorb_result`): the
reader lease, a partition's critical hold and the desired offsets kept from trimming follow
only steps that wrote a durable checkpoint, so none ever names state that lives only in an
executor (a gained partition's first fold, `StepSpec.checkpoint`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mvsink.core.frontier import Frontier
from services.write.checkpoint import holder_id
from services.write.shell import WriteShell
from services.write.state import WriteState
from services.write.task import StepResult

F = Frontier.at


def shell(versions: dict[int, int]) -> WriteShell:
    """A driver owning `versions`' partitions at those checkpoint versions, as `_on_assign`
    leaves it (no Kafka, S3 or Spark: only what `_absorb_result` and `_hold_target` use)."""
    driver = WriteShell.__new__(WriteShell)
    driver.config = SimpleNamespace(sink_id="holds")  # type: ignore[assignment]
    driver.state = WriteState("holds", 2, read_only=False)
    driver.state.set_owned(frozenset(versions))
    driver.versions, driver.unchecked = dict(versions), set(versions)
    driver.folded, driver.home, driver.kept_offsets, driver.gone = {}, {}, {}, {}
    return driver


def result(partition: int, version: int, folded: int, offset: int, durable: bool) -> StepResult:
    return StepResult(
        partition=partition,
        version=version,
        part=None,
        folded_offset=offset,
        desired_frontier=F(folded),
        persist_folded=F(folded),
        corrections=0,
        dead_letters=0,
        bytes_read_back=0,
        bytes_written=0,
        checkpointed=durable,
    )


@pytest.mark.parametrize("version", [-1, 4], ids=["new sink", "restart"])
def test_the_lease_holds_and_kept_offsets_follow_durable_checkpoints_only(version: int) -> None:
    driver = shell({0: version, 1: version})
    for p in (0, 1):  # the first folds, no checkpoint: state only in the executors
        driver._absorb_result(result(p, version, folded=7 + p, offset=90, durable=False))
    # The lease stays where it is (None), at or before the folds in memory; the critical holds
    # stay at the durable checkpoints (or none), and nothing is kept from trimming yet.
    assert driver._hold_target() == (None, {})
    assert driver.kept_offsets == {} and driver.versions == {0: version, 1: version}
    assert driver.unchecked == set()
    driver._absorb_result(result(0, version + 1, folded=9, offset=120, durable=True))
    assert driver._hold_target() == (None, {holder_id("holds", 0): F(9)})
    assert driver.kept_offsets == {0: [120]} and driver.versions == {0: version + 1, 1: version}
    driver._absorb_result(result(1, version + 1, folded=10, offset=130, durable=True))
    assert driver._hold_target() == (F(9), {holder_id("holds", p): F(9 + p) for p in (0, 1)})
    driver._absorb_result(result(0, version + 1, folded=11, offset=150, durable=False))
    assert driver._hold_target()[1][holder_id("holds", 0)] == F(9)  # not durable: unmoved
    assert driver.kept_offsets == {0: [120], 1: [130]}

"""The write driver's record of its partitions' checkpoints (`WriteShell._absorb_result`): the
reader lease, a partition's critical hold and the desired offsets kept from trimming follow
only steps that wrote a durable checkpoint, so none ever names state that lives only in an
executor (a gained partition's first fold, `StepSpec.checkpoint`)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, BatchId
from services.write.checkpoint import Confirmed, holder_id
from services.write.shell import WriteShell
from services.write.state import StageJob, WriteState
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
    driver.durable, driver.pipelined = dict(versions), set()
    driver.sink = None  # type: ignore[assignment]  # carried in the specs only
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


def test_pipelined_steps_move_the_holds_once_a_later_result_confirms_them() -> None:
    """A resident reports a staging step while its checkpoint is being created (`pending`):
    the driver continues from that version, but the lease, the hold and the kept desired
    offsets move only when a later result confirms it (`confirmed`); a gained partition and
    one found stale stage inline until the driver has created a version of its own."""
    driver = shell({0: 4})
    desc = BatchDescription("holds", BatchId(0, 1), F(10), F(11), 0)
    job = StageJob(desc, (0,))
    assert not driver._specs((0,), job)[0].pipelined  # gained: its first staging is inline
    driver._absorb_result(result(0, 5, folded=9, offset=100, durable=True))
    assert driver.pipelined == {0} and driver.durable == {0: 5}
    (spec,) = driver._specs((0,), job)
    assert spec.pipelined and spec.version == 5 and spec.durable == 5
    assert not driver._specs((0,), None)[0].pipelined  # folds stay inline
    driver._absorb_result(replace(result(0, 6, folded=11, offset=150, durable=False), pending=True))
    (spec,) = driver._specs((0,), job)
    assert spec.version == 6 and spec.durable == 5  # a step finding 6 never created falls back
    assert driver._hold_target()[1] == {holder_id("holds", 0): F(9)}
    assert driver.kept_offsets == {0: [100]}
    confirming = replace(
        result(0, 7, folded=13, offset=200, durable=False),
        pending=True,
        confirmed=Confirmed(6, 150, F(11), 1),
    )
    driver._absorb_result(confirming)
    assert driver.versions == {0: 7} and driver.durable == {0: 6}
    assert driver._hold_target()[1] == {holder_id("holds", 0): F(11)}
    assert driver.kept_offsets == {0: [100, 150]}  # trimmed below 100: what 6 and 5 need
    # A confirmation the chain has moved past moves nothing back.
    driver._absorb_result(replace(confirming, version=7, confirmed=Confirmed(5, 100, F(9), 1)))
    assert driver._hold_target()[1] == {holder_id("holds", 0): F(11)}
    assert driver.kept_offsets == {0: [100, 150]} and driver.durable == {0: 6}
    # Stale (7 lost to another owner): continue from the newest, inline until a create of its own.
    driver._latest_checkpoint = lambda partition: 7  # type: ignore[method-assign]
    driver._absorb_result(replace(result(0, 7, folded=0, offset=0, durable=False), stale=True))
    assert driver.versions == {0: 7} and driver.durable == {0: 7} and driver.pipelined == set()
    assert not driver._specs((0,), job)[0].pipelined
    assert driver._hold_target()[1] == {holder_id("holds", 0): F(11)}  # never moved back

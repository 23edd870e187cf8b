"""The write driver's record of its partitions' checkpoints (`WriteShell._absorb_result`): the
reader lease, a partition's critical hold and the desired offsets kept from trimming follow
only steps that wrote a durable checkpoint, so none ever names state that lives only in an
executor (a gained partition's first fold and first staging step, `StepSpec.checkpoint`,
`WriteShell.deferred`)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, BatchId
from services.write import checkpoint
from services.write.checkpoint import Confirmed, holder_id
from services.write.shell import WriteShell
from services.write.state import StageJob, WriteState
from services.write.task import Gone, StepResult

F = Frontier.at


def shell(versions: dict[int, int]) -> WriteShell:
    """A driver owning `versions`' partitions at those checkpoint versions, as `_on_assign`
    leaves it (no Kafka, S3 or Spark: only what `_absorb_result` and `_hold_target` use)."""
    driver = WriteShell.__new__(WriteShell)
    driver.config = SimpleNamespace(sink_id="holds")  # type: ignore[assignment]
    driver.state = WriteState("holds", 2, read_only=False)
    driver.state.set_owned(frozenset(versions))
    driver.versions, driver.unchecked = dict(versions), set(versions)
    driver.durable, driver.pipelined, driver.deferred = dict(versions), set(), set()
    driver.sink = None  # type: ignore[assignment]  # carried in the specs only
    driver.folded, driver.home, driver.kept_offsets, driver.gone = {}, {}, {}, {}
    return driver


def stage_job(lower: int = 10) -> StageJob:
    return StageJob(BatchDescription("holds", BatchId(0, lower), F(lower), F(lower + 1), 0), (0,))


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
    job = stage_job()
    assert not driver._specs((0,), job)[0].pipelined  # gained: its first checkpoint is inline
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


def step_kinds(driver: WriteShell, job: StageJob) -> tuple[bool, bool]:
    """Whether partition 0's staging step of `job` would checkpoint, and pipelined."""
    (spec,) = driver._specs((0,), job)
    return spec.checkpoint, spec.pipelined


@pytest.mark.parametrize("version", [-1, 4], ids=["new sink", "restart"])
def test_a_gained_partition_checkpoints_first_after_its_first_append(version: int) -> None:
    """The first fold and the first staging step keep their state in the executor (the part
    holds the whole load, which a checkpoint would write again); the step after that batch's
    append creates the next version inline, and only then do the steps pipeline."""
    driver = shell({0: version})
    driver._absorb_result(result(0, version, folded=7, offset=90, durable=False))
    assert driver.deferred == {0} and driver.unchecked == set()
    assert step_kinds(driver, stage_job(7)) == (False, False)
    assert driver._specs((0,), None)[0].checkpoint  # a fold meanwhile checkpoints
    driver._absorb_result(result(0, version, folded=8, offset=95, durable=False), staging=True)
    assert driver.deferred == set() and driver.versions == {0: version}
    assert driver._hold_target() == (None, {})  # nothing durable yet: nothing moved
    assert step_kinds(driver, stage_job(8)) == (True, False)  # inline: meets another owner
    driver._absorb_result(result(0, version + 1, folded=9, offset=99, durable=True), staging=True)
    assert step_kinds(driver, stage_job(9)) == (True, True)
    assert driver._hold_target() == (F(9), {holder_id("holds", 0): F(9)})


@pytest.mark.parametrize(
    "first, deferred",
    [
        ({}, {0}),
        ({"checkpointed": True}, set()),  # read-only: its first fold checkpoints
        ({"stale": True}, set()),  # a newer checkpoint: continue from it, inline
        ({"gone": Gone(0, 50, "gone")}, set()),  # nothing is staged until repaired
    ],
    ids=["kept", "read-only", "stale", "gone"],
)
def test_only_a_first_fold_that_kept_its_state_defers_the_checkpoint(
    first: dict[str, Any], deferred: set[int]
) -> None:
    driver = shell({0: 3})
    driver._latest_checkpoint = lambda partition: 4  # type: ignore[method-assign]
    driver._absorb_result(replace(result(0, 3, folded=7, offset=90, durable=False), **first))
    assert driver.deferred == deferred and driver.unchecked == set()


@pytest.mark.parametrize(
    "second, deferred",
    [
        ({"outdated": True}, {0}),  # it staged nothing: the next staging step still keeps
        ({"stale": True}, set()),  # continue from the newest version, inline
    ],
    ids=["outdated", "stale"],
)
def test_a_deferred_staging_step_that_staged_nothing(
    second: dict[str, Any], deferred: set[int]
) -> None:
    driver = shell({0: 3})
    driver._latest_checkpoint = lambda partition: 4  # type: ignore[method-assign]
    driver._absorb_result(result(0, 3, folded=7, offset=90, durable=False))
    driver._absorb_result(replace(result(0, 3, folded=7, offset=90, durable=False), **second), True)
    assert driver.deferred == deferred


def test_a_partition_regained_starts_its_deferral_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Revoked while deferred, then assigned again (at the version another owner left): not
    deferred until it is folded first again, then deferred again."""
    driver = shell({0: 3})
    driver._absorb_result(result(0, 3, folded=7, offset=90, durable=False))
    driver.config = SimpleNamespace(sink_id="holds", s3=None)  # type: ignore[assignment]
    driver._lead_compaction = lambda: None  # type: ignore[method-assign]
    monkeypatch.setattr(checkpoint, "collect_superseded", lambda sink, partition, s3: 6)
    consumer = SimpleNamespace(pause=lambda partitions: None)
    tp = [TopicPartition("desired", 0)]
    driver._on_revoke(consumer, tp)  # type: ignore[arg-type]
    assert driver.deferred == set() and driver.unchecked == set()
    driver._on_assign(consumer, tp)  # type: ignore[arg-type]
    assert driver.deferred == set() and driver.unchecked == {0} and driver.versions == {0: 6}
    assert step_kinds(driver, stage_job())[0]  # (the driver folds it before any staging)
    driver._absorb_result(result(0, 6, folded=9, offset=120, durable=False))
    assert driver.deferred == {0} and step_kinds(driver, stage_job(9)) == (False, False)

"""Pipelined checkpoints (`services.write.state.Pipelined`) on real Kafka and MinIO, in
process: a resident's staging step reports its part while its checkpoint is being created; the
partition's next step waits for that create before anything else, and reports it confirmed;
a create lost to another owner makes that next step stale before it stages; a create that
never happened (its Python worker died or paused) is continued from the version before it,
and the straggler, if it ever lands, loses. A gained partition's first fold and first staging
step create no checkpoint at all (`services.write.state.Keep`): the step after that batch's append
creates the first, inline, of what the read-back left; two owners that both deferred meet
there. Each part appended is exact whatever lineage staged it, so the shard ends with every
update once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from minio.commonconfig import CopySource

from mvsink.core.frontier import Frontier
from mvsink.core.rows import parse_row_schema
from mvsink.io.config import S3Settings
from mvsink.io.s3 import s3_client
from mvsink.shard import Appended
from services.write import checkpoint, task
from services.write.state import (
    CheckpointOutcome,
    Created,
    Inline,
    Keep,
    Kept,
    Pending,
    Pipelined,
    Ran,
    is_stale,
)
from services.write.task import StepResult, StepSpec, WriteWorker
from tests.integration.sinkkit import ROW_SCHEMA, Sink, Upstream, contents, step_specs

pytestmark = pytest.mark.integration


def made(result: StepResult) -> CheckpointOutcome | None:
    """How a step's checkpoint ended (None: the step was stale or its records gone)."""
    return result.outcome.checkpoint if isinstance(result.outcome, Ran) else None


class Gate:
    """Holds the creates that resident workers run in the background (`checkpoint-create`
    threads) until opened; inline creates pass."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        real = checkpoint.Checkpoints.create

        def gated(*args: Any) -> Any:
            if threading.current_thread().name.startswith("checkpoint-create"):
                assert self.open.wait(60), "the gate was never opened"
            return real(*args)

        monkeypatch.setattr(checkpoint.Checkpoints, "create", gated)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    gate = Gate(monkeypatch)
    yield gate
    gate.open.set()  # never leave a worker thread waiting


@pytest.fixture
def sink(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Sink:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-1"))
    return Sink.create(kafka_bootstrap, s3_settings, tmp_path, partitions=1)


def step(sink: Sink, version: int, lower: int, upper: int, durable: int | None = None) -> StepSpec:
    """Partition 0's pipelined staging step of `[lower, upper)` from `version`."""
    [spec] = step_specs(sink, {0: version}, (lower, upper))
    return replace(spec, durable=durable, mode=Pipelined())


def append(sink: Sink, result: StepResult, lower: int, upper: int) -> None:
    """What append does with the step's batch."""
    parts = [] if result.part is None else [result.part]
    outcome = sink.shard.compare_and_append(parts, Frontier.at(lower), Frontier.at(upper))
    assert isinstance(outcome, Appended), outcome


def first_step(sink: Sink, worker: WriteWorker) -> tuple[Upstream, StepResult]:
    """Three ticks of four keys, and partition 0's first pipelined staging step of them (its
    create held by the gate), its part appended."""
    upstream = Upstream(sink, keys=4)
    for _ in range(3):
        upstream.tick()
    first = task.run_task(step(sink, -1, 0, 3), worker)
    assert made(first) == Pending() and first.version == 0
    append(sink, first, 0, 3)  # a reported part is exact, whoever continues the chain
    return upstream, first


def test_a_step_reports_before_its_checkpoint_and_the_next_step_confirms_it(
    sink: Sink, gate: Gate
) -> None:
    c = sink.config
    base = WriteWorker()  # a Python worker's: its one-shot tasks share the resident's states
    resident = base.resident()
    upstream, first = first_step(sink, resident)
    assert not isinstance(made(first), Created)
    assert first.part is not None and first.part.updates == upstream.sent
    assert first.bytes_written == first.part.bytes  # its create is counted once confirmed
    assert checkpoint.Checkpoints.of(c.s3).latest(c.sink_id, 0) == -1  # reported before its create
    upstream.tick()
    threading.Timer(0.5, gate.open.set).start()  # the next step waits for the create first
    second = task.run_task(step(sink, 0, 3, 4, durable=-1), resident)
    confirmed = second.confirmed
    assert confirmed is not None and confirmed.size > 0
    assert (confirmed.version, confirmed.folded_offset, confirmed.persist_folded) == (
        0,
        first.folded_offset,
        first.persist_folded,
    )
    assert made(second) == Pending() and second.version == 1 and not is_stale(second.outcome)
    assert second.part is not None
    assert second.bytes_written == second.part.bytes + confirmed.size
    meta = checkpoint.Checkpoints.of(c.s3).read_meta(c.sink_id, 0, 0)
    assert meta is not None and meta["folded_offset"] == first.folded_offset
    assert Frontier.from_elements(meta["persist_folded"]) == first.persist_folded
    append(sink, second, 3, 4)
    # Leaving, the resident waits for version 1 and writes its warm copy; the Python worker's
    # next task (a one-shot here) continues from it and reports it confirmed.
    resident.leave()
    assert checkpoint.Checkpoints.of(c.s3).latest(c.sink_id, 0) == 1
    assert base.states.states[(c.sink_id, 0)].version == 1
    upstream.tick()
    third = task.run_task(replace(step(sink, 1, 4, 5), mode=Inline()), base)
    assert isinstance(made(third), Created) and third.version == 2
    assert third.confirmed is not None and third.confirmed.version == 1
    append(sink, third, 4, 5)
    assert contents(sink, upstream.frontier) == upstream.expected()


def test_a_create_lost_to_another_owner_makes_the_next_step_stale_before_it_stages(
    sink: Sink, gate: Gate, tmp_path: Path
) -> None:
    c = sink.config
    resident = WriteWorker().resident()
    upstream, _ = first_step(sink, resident)
    # Another owner creates version 0 first (its own fold of nothing, as a gained partition's
    # first staging could), then the resident's create goes through and loses.
    other = checkpoint.empty(parse_row_schema(ROW_SCHEMA), c.as_of, -1)
    assert checkpoint.Checkpoints.of(c.s3).save(
        c.sink_id, 0, "other", other, checkpoint.StateCache()
    )
    gate.open.set()
    upstream.tick()
    stale = task.run_task(step(sink, 0, 3, 4, durable=-1), resident)
    assert is_stale(stale.outcome) and stale.part is None and stale.confirmed is None
    assert (c.sink_id, 0) not in resident.states.states
    assert not (tmp_path / "executor-1" / "warm" / c.sink_id / "p0.pickle").exists()
    assert checkpoint.Checkpoints.of(c.s3).latest(c.sink_id, 0) == 0
    # The driver continues from the newest version (the other owner's), inline.
    again = task.run_task(replace(step(sink, 0, 3, 4), mode=Inline()), resident)
    assert isinstance(made(again), Created) and again.version == 1 and not is_stale(again.outcome)
    append(sink, again, 3, 4)
    assert contents(sink, upstream.frontier) == upstream.expected()  # every update once
    resident.leave()


def test_a_create_that_never_happened_is_continued_from_the_version_before(
    sink: Sink, gate: Gate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resident's Python worker stops (a pause, or a death) with its create under way; the
    driver sends the partition's next step elsewhere, expecting that version; it is absent, so
    the step continues from the version before and creates it itself. The straggler's create,
    when it finally runs, loses; leaving, the resident keeps nothing of that state."""
    c = sink.config
    base = WriteWorker()
    paused = base.resident()
    upstream, _ = first_step(sink, paused)
    upstream.tick()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-2"))
    moved = task.run_task(replace(step(sink, 0, 3, 4, durable=-1), mode=Inline()), WriteWorker())
    assert isinstance(made(moved), Created) and moved.version == 0 and not is_stale(moved.outcome)
    assert moved.part is not None
    append(sink, moved, 3, 4)
    assert contents(sink, upstream.frontier) == upstream.expected()
    # The straggler resumes: its create of version 0 loses, and its state goes.
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-1"))
    gate.open.set()
    paused.leave()
    assert (c.sink_id, 0) not in base.states.states and not base.states.pending
    assert not (tmp_path / "executor-1" / "warm" / c.sink_id / "p0.pickle").exists()
    meta = checkpoint.Checkpoints.of(c.s3).read_meta(c.sink_id, 0, 0)
    assert meta is not None and meta["folded_offset"] == moved.folded_offset  # the mover's
    # A step expecting a version that is absent while a newer one exists lost the chain.
    bucket = c.s3.bucket
    client = s3_client(c.s3)
    client.copy_object(
        bucket,
        checkpoint.checkpoint_key(c.sink_id, 0, 2),
        CopySource(bucket, checkpoint.checkpoint_key(c.sink_id, 0, 0)),
    )
    upstream.tick()
    lost = task.run_task(replace(step(sink, 1, 4, 5, durable=0), mode=Inline()), WriteWorker())
    assert is_stale(lost.outcome) and lost.part is None


def test_a_lost_create_older_than_the_step_asked_for_does_not_make_it_stale(
    sink: Sink, gate: Gate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resident's create lost while the partition's chain went on elsewhere: when the
    partition comes back to it at a newer version, its step drops the lost state and continues
    from the version asked for (the chain's, in object storage)."""
    resident = WriteWorker().resident()
    upstream, _ = first_step(sink, resident)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-2"))
    elsewhere = WriteWorker()
    for version, lower in ((0, 3), (0, 4)):  # versions 0 (from nothing) and 1, inline
        upstream.tick()
        moved = task.run_task(
            replace(step(sink, version, lower, lower + 1, -1), mode=Inline()), elsewhere
        )
        assert isinstance(made(moved), Created) and not is_stale(moved.outcome)
        append(sink, moved, lower, lower + 1)
    assert moved.version == 1
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-1"))
    gate.open.set()  # the resident's create of version 0 now loses
    upstream.tick()
    back = task.run_task(replace(step(sink, 1, 5, 6), mode=Inline()), resident)
    assert not is_stale(back.outcome) and isinstance(made(back), Created) and back.version == 2
    assert back.bytes_read_back > 0  # version 1 from object storage, not the lost state
    append(sink, back, 5, 6)
    assert contents(sink, upstream.frontier) == upstream.expected()
    resident.leave()


def gained(sink: Sink, worker: WriteWorker) -> tuple[Upstream, StepResult, int]:
    """Three ticks of four keys, and partition 0's steps as a driver that gains it sends them:
    the first fold, then the first staging step of `[0, 3)`, neither checkpointing; its part's
    updates."""
    upstream = Upstream(sink, keys=4)
    for _ in range(3):
        upstream.tick()
    [fold_only] = step_specs(sink, {})
    folded = task.run_task(replace(fold_only, mode=Keep()), worker)
    assert folded.version == -1 and not isinstance(made(folded), Created)
    staged = task.run_task(replace(step(sink, -1, 0, 3), mode=Keep()), worker)
    assert (staged.version, made(staged)) == (-1, Kept())
    assert staged.part is not None and staged.part.updates == upstream.sent  # the whole load
    assert staged.bytes_written == staged.part.bytes  # the part, and no checkpoint
    return upstream, staged, staged.part.updates


def tick(upstream: Upstream) -> int:
    """One more tick; how many updates it published."""
    before = upstream.sent
    upstream.tick()
    return upstream.sent - before


def test_a_gained_partition_checkpoints_first_after_its_first_append(sink: Sink) -> None:
    """The first checkpoint holds what the read-back of the first part left (the next tick's
    updates), not the whole load; the state came from memory, the part was not read back."""
    c = sink.config
    resident = WriteWorker().resident()
    upstream, staged, load = gained(sink, resident)
    assert checkpoint.Checkpoints.of(c.s3).latest(c.sink_id, 0) == -1
    append(sink, staged, 0, 3)
    fresh = tick(upstream)
    first = task.run_task(replace(step(sink, -1, 3, 4), mode=Inline()), resident)
    assert isinstance(made(first), Created) and first.version == 0 and not is_stale(first.outcome)
    assert first.bytes_read_back == 0  # its own part negated from memory
    assert first.part is not None and first.part.updates == fresh == first.corrections
    stored, read = checkpoint.Checkpoints.of(c.s3).load(
        c.sink_id, 0, 0, parse_row_schema(ROW_SCHEMA), c.as_of, checkpoint.StateCache()
    )
    assert read > 0 and len(stored.correction) == fresh < load
    assert stored.folded_offset == first.folded_offset
    append(sink, first, 3, 4)
    assert contents(sink, upstream.frontier) == upstream.expected()
    resident.leave()


def test_a_deferred_state_lost_with_its_executor_is_folded_again(
    sink: Sink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The executor that kept the state is gone: the step after the append runs elsewhere from
    nothing (no checkpoint), folds all of desired and reads the first part back as anyone's,
    and stages only the new tick."""
    c = sink.config
    upstream, staged, _ = gained(sink, WriteWorker().resident())
    append(sink, staged, 0, 3)
    fresh = tick(upstream)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-2"))
    moved = task.run_task(replace(step(sink, -1, 3, 4), mode=Inline()), WriteWorker())
    assert isinstance(made(moved), Created) and moved.version == 0
    assert moved.bytes_read_back > 0  # the shard's part, read back
    assert moved.part is not None and moved.part.updates == fresh
    append(sink, moved, 3, 4)
    assert contents(sink, upstream.frontier) == upstream.expected()
    assert checkpoint.Checkpoints.of(c.s3).latest(c.sink_id, 0) == 0


def test_two_owners_that_both_deferred_meet_at_the_first_checkpoint(
    sink: Sink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two drivers gained the partition (a rebalance not yet seen by the old one): both stage
    the first batch without a checkpoint, and append keeps the first part for that lower. The
    step after it creates version 0 inline in each: one wins, the other is stale (its part is
    never reported) and continues from the winner's version; the shard has every update once."""
    c = sink.config
    one = WriteWorker().resident()
    upstream, ones, load = gained(sink, one)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-2"))
    two = WriteWorker().resident()
    [fold_only] = step_specs(sink, {})
    task.run_task(replace(fold_only, mode=Keep()), two)
    twos = task.run_task(replace(step(sink, -1, 0, 3), mode=Keep()), two)
    assert twos.part is not None and twos.part.updates == load  # the same part as the other's
    append(sink, ones, 0, 3)  # append keeps the first batch for the lower
    upstream.tick()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-1"))
    won = task.run_task(replace(step(sink, -1, 3, 4), mode=Inline()), one)
    assert isinstance(made(won), Created) and won.version == 0
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-2"))
    lost = task.run_task(replace(step(sink, -1, 3, 4), mode=Inline()), two)
    assert is_stale(lost.outcome) and not isinstance(made(lost), Created)
    assert (c.sink_id, 0) not in two.states.states  # nothing continues from the lost state
    append(sink, won, 3, 4)
    upstream.tick()
    again = task.run_task(replace(step(sink, 0, 4, 5), mode=Inline()), two)  # the newest
    assert isinstance(made(again), Created) and again.version == 1 and not is_stale(again.outcome)
    append(sink, again, 4, 5)
    assert contents(sink, upstream.frontier) == upstream.expected()
    for worker in (one, two):
        worker.leave()

"""The write service's resident tasks (`services.write.resident`) on real Spark, Kafka and MinIO:
the steps run in long-lived Python workers that keep their partitions' state, a lost resident
hands its partitions back for a one-shot job, residents step aside for another Spark job, and
only connections that show the crew's token join it. Also: a failed step drops the state it
left half-changed in memory (`services.write.task.run_task`), and a first fold that writes no
checkpoint leaves its state for the steps after it, and a crew launched ahead of the first
round (a driver starting) serves it."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mvsink.core.frontier import Frontier
from mvsink.core.messages import Progress
from mvsink.core.rows import parse_row_schema
from mvsink.io.config import S3Settings
from mvsink.io.kafka import delete_below
from mvsink.io.spark import driver_host, executor_dir, run_pinned
from mvsink.upstream.desired import decode_desired
from services.write import checkpoint, fold, task
from services.write.checkpoint import StateCache
from services.write.resident import Crew, Work
from services.write.state import (
    CheckpointOutcome,
    Created,
    Gone,
    Keep,
    Kept,
    Outdated,
    Ran,
    is_stale,
)
from services.write.task import StepResult, StepSpec, WriteWorker, one_shot
from tests.integration.sinkkit import ROW_SCHEMA, Sink, Upstream, step_specs, wait_until

pytestmark = pytest.mark.integration


def made(result: StepResult) -> CheckpointOutcome | None:
    """How a step's checkpoint ended (None: the step was stale or its records gone)."""
    return result.outcome.checkpoint if isinstance(result.outcome, Ran) else None


@pytest.fixture
def sink(kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path) -> Sink:
    return Sink.create(kafka_bootstrap, s3_settings, tmp_path, partitions=2)


@pytest.fixture
def crew(spark: Any) -> Iterator[Crew]:
    crew = Crew(spark, driver_host())
    yield crew
    crew.dismiss()  # the session's Spark serves the next tests


def one_each(of: list[StepSpec]) -> list[Work]:
    """A group per partition, on the local executor (two task slots)."""
    return [([spec], "driver") for spec in of]


def test_residents_run_the_steps_and_keep_the_state_in_memory(
    sink: Sink, crew: Crew, spark: Any
) -> None:
    # Where the executor keeps its warm copies (a one-shot job, before the crew holds the slots).
    [local] = run_pinned(spark, [(0, "driver")], lambda _: [str(executor_dir())])
    tracker = spark.sparkContext.statusTracker()  # (which may list that job a while longer)
    wait_until(lambda: not tracker.getActiveJobsIds(), 30, "no Spark job active")
    upstream = Upstream(sink, keys=8)
    for _ in range(3):
        upstream.tick()
    results, left = crew.run(one_each(step_specs(sink, {}, (0, 3))), ["driver"], 2)
    assert left == []
    assert sorted(r.partition for r in results) == [0, 1]
    assert all(
        isinstance(r.outcome, Ran)
        and not is_stale(r.outcome)
        and not isinstance(r.outcome.batch, Outdated)
        and r.version == 0
        for r in results
    )
    staged = sum(r.part.updates for r in results if r.part is not None)
    assert staged == upstream.sent  # every update, once
    pids = {r.pid for r in crew.residents}
    assert len(pids) == 2 and os.getpid() not in pids  # in Spark's Python workers
    # The next round: the same residents, each holding its partition's state in memory.
    warm = Path(local) / "warm" / sink.config.sink_id
    assert not warm.exists()  # residents write no warm copies while they serve
    again, left = crew.run(
        one_each(step_specs(sink, {r.partition: r.version for r in results})), ["driver"], 2
    )
    assert left == [] and {r.pid for r in crew.residents} == pids
    assert all(r.version == 1 and r.bytes_read_back == 0 for r in again)
    # Leaving, they write them, for the executor's other Python workers.
    crew.dismiss()
    copies = {p.name: pickle.loads(p.read_bytes()).version for p in warm.iterdir()}
    assert copies == {"p0.pickle": 1, "p1.pickle": 1}


def test_a_crew_launched_ahead_serves_the_first_round(sink: Sink, crew: Crew) -> None:
    """`Crew.launch`, as a driver starting calls it: the residents connect meanwhile, and the
    first round finds them there instead of launching them; launching a crew that is up does
    nothing."""
    crew.launch(["driver"], 2)
    launched = crew.launched_at
    assert crew.job is not None
    wait_until(crew._complete, 60, "the residents connected")
    upstream = Upstream(sink, keys=4)
    upstream.tick()
    results, left = crew.run(one_each(step_specs(sink, {})), ["driver"], 2)
    assert left == [] and sorted(r.partition for r in results) == [0, 1]
    assert crew.launched_at == launched and crew.rounds == 1
    crew.launch(["driver"], 2)
    assert crew.launched_at == launched


def test_a_lost_resident_hands_its_partitions_back(sink: Sink, crew: Crew, spark: Any) -> None:
    """A resident's Python worker killed between rounds: its group comes back as work left for
    a one-shot job, the crew is dismissed, and the one-shot job continues from the checkpoint
    the resident wrote (its memory went with it)."""
    upstream = Upstream(sink)
    upstream.tick()
    results, _ = crew.run(one_each(step_specs(sink, {}, (0, 1))), ["driver"], 2)
    versions = {r.partition: r.version for r in results}
    victim = crew.assign(one_each(step_specs(sink, versions)))[0][0]
    os.kill(victim.pid, signal.SIGKILL)
    upstream.tick()
    work = one_each(step_specs(sink, versions))
    done, left = crew.run(work, ["driver"], 2)
    assert [spec.partition for item in left for spec in item[0]] == [work[0][0][0].partition]
    assert [r.partition for r in done] == [work[1][0][0].partition]
    assert crew.job is None and crew.residents == []
    assert crew.run(work, ["driver"], 2) == ([], work)  # no relaunch right after a failure
    rerun: list[StepResult] = run_pinned(spark, left, one_shot)
    assert len(rerun) == 1 and not is_stale(rerun[0].outcome) and rerun[0].version == 1
    before = next(r for r in results if r.partition == rerun[0].partition)
    assert rerun[0].folded_offset > before.folded_offset  # it folded the second tick


def test_residents_step_aside_for_another_spark_job(sink: Sink, crew: Crew, spark: Any) -> None:
    Upstream(sink).tick()
    results, _ = crew.run(one_each(step_specs(sink, {})), ["driver"], 2)
    counted: list[int] = []
    other = threading.Thread(
        target=lambda: counted.append(spark.sparkContext.parallelize(range(10), 2).count())
    )
    other.start()  # its tasks wait: the residents hold both slots
    tracker = spark.sparkContext.statusTracker()
    wait_until(lambda: len(tracker.getActiveJobsIds()) >= 2, 30, "the other job to be submitted")
    versions = {r.partition: r.version for r in results}
    again, left = crew.run(one_each(step_specs(sink, versions)), ["driver"], 2)
    assert left == [] and len(again) == 2  # the round still ran in the residents
    assert crew.job is None  # ... and then they went home
    other.join(60)
    assert counted == [10]
    crewless = lambda: not tracker.getActiveJobsIds()  # noqa: E731
    wait_until(crewless, 30, "the status tracker to see the other job end")
    # With no other job active the next round launches a new crew.
    versions = {r.partition: r.version for r in again}
    third, left = crew.run(one_each(step_specs(sink, versions)), ["driver"], 2)
    assert left == [] and len(third) == 2 and crew.job is not None


def test_only_the_crews_token_joins(sink: Sink, crew: Crew) -> None:
    """A connection with a wrong token is refused before its hello is read, even a hello that
    would otherwise join (a free slot, on the crew's executor)."""
    Upstream(sink).tick()
    crew.run(one_each(step_specs(sink, {})), ["driver"], 2)
    assert crew.address is not None and len(crew.residents) == 2
    crew.expected = 3  # a slot free for the intruder, were its token right
    frames = b""
    for frame in (b"\0" * 32, pickle.dumps((2, "driver", os.getpid()))):
        frames += len(frame).to_bytes(8, "big") + frame
    with socket.create_connection(crew.address) as intruder:
        intruder.sendall(frames)
        intruder.settimeout(5)
        try:  # refused: the driver closed the connection (reset: it left our hello unread)
            closed = intruder.recv(1) == b""
        except ConnectionResetError:
            closed = True
        assert closed
    assert sorted(r.slot for r in crew.residents) == [0, 1]


def test_a_step_failing_in_a_resident_hands_its_group_back(
    sink: Sink, crew: Crew, caplog: pytest.LogCaptureFixture
) -> None:
    """A step that raises in a resident (here: a checkpoint version that does not exist) comes
    back as work left for a one-shot job, where Spark retries it and the error surfaces; the
    other group's result is kept."""
    Upstream(sink).tick()
    work = one_each(step_specs(sink, {0: 7}))
    done, left = crew.run(work, ["driver"], 2)
    assert [r.partition for r in done] == [1] and left == [work[0]]
    assert crew.job is None and crew.failures == 1
    # Reported by the resident (with its traceback), not seen as a broken connection.
    assert "a step failed in resident driver/" in caplog.text and "NoSuchKey" in caplog.text


def test_a_failed_step_drops_the_state_it_changed_in_memory(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that fails halfway must not leave its state in memory under the old version. Here
    the desired fold fails after it took a tick's progress but before it recorded the offset:
    the next attempt from that state would read the tick's updates again, find them below the
    progress, and quarantine them (they would be lost to the view)."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor"))
    worker = WriteWorker()
    sink = Sink.create(kafka_bootstrap, s3_settings, tmp_path, partitions=1)
    upstream = Upstream(sink, keys=2)
    upstream.tick()
    [first] = [task.run_task(s, worker) for s in step_specs(sink, {})]  # version 0, kept in memory
    upstream.tick()
    upstream.tick()  # partition 0 now holds: updates 1, progress 2, updates 2, progress 3
    [spec] = step_specs(sink, {0: first.version})
    original, calls = decode_desired, []

    def flaky(*args: Any) -> Any:
        record = original(*args)
        calls.append(record)
        if len(calls) > 2:
            raise RuntimeError("the broker went away mid-fold")
        return record

    with monkeypatch.context() as patch:
        patch.setattr(fold, "decode_desired", flaky)
        with pytest.raises(RuntimeError):
            task.run_task(spec, worker)
    assert isinstance(calls[1], Progress)  # the fold had taken tick 1's progress
    assert (spec.sink.sink_id, 0) not in worker.states.states
    again = task.run_task(spec, worker)
    assert again.dead_letters == 0 and again.version == 1
    assert again.desired_frontier == Frontier.at(3) and again.corrections == 4


def test_a_first_fold_checkpoints_nothing_and_a_later_step_continues_from_its_state(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gained partition's first fold without a checkpoint (`services.write.state.Keep`, what the
    driver sends): no object, the state kept at version -1 in memory and in the executor's warm
    copy, a result that does not claim a durable checkpoint. With the records below that fold
    deleted, a worker of another executor (neither memory nor warm copy) finds them gone, and
    a checkpointing step from the warm copy folds on and writes version 0 with every update
    once (`test_write_pipelined` follows the driver's deferred first staging step)."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-1"))
    sink = Sink.create(kafka_bootstrap, s3_settings, tmp_path, partitions=1)
    c, rows = sink.config, parse_row_schema(ROW_SCHEMA)
    upstream = Upstream(sink, keys=4)
    upstream.tick()
    upstream.tick()
    [fold_only] = step_specs(sink, {})
    first = task.run_task(replace(fold_only, mode=Keep()), WriteWorker())
    assert (first.version, made(first), first.bytes_written) == (-1, Kept(), 0)
    assert first.corrections == upstream.sent and first.folded_offset > 0
    assert checkpoint.Checkpoints.of(c.s3).latest(c.sink_id, 0) == -1  # nothing in object storage
    # Another Python worker of the executor finds the fold in the warm copy; another executor
    # finds nothing, and starts from empty.
    warm, read = checkpoint.Checkpoints.of(c.s3).load(c.sink_id, 0, -1, rows, c.as_of, StateCache())
    assert (len(warm.correction), warm.folded_offset, read) == (
        upstream.sent,
        first.folded_offset,
        0,
    )
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-2"))
    cold, read = checkpoint.Checkpoints.of(c.s3).load(c.sink_id, 0, -1, rows, c.as_of, StateCache())
    assert (len(cold.correction), cold.folded_offset, read) == (0, 0, 0)
    # Records below the fold deleted (as a trim would): only the kept state can go on now.
    delete_below(c.kafka_bootstrap, c.topics.desired, {0: first.folded_offset})
    upstream.tick()
    [stage] = step_specs(sink, {}, (0, 3))
    gone = task.run_task(stage, WriteWorker())  # executor-2: from nothing, offset 0
    assert isinstance(gone.outcome, Gone) and gone.part is None
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-1"))
    staged = task.run_task(stage, WriteWorker())  # another Python worker: from the warm copy
    assert not isinstance(staged.outcome, Gone)
    assert (staged.version, staged.bytes_read_back) == (0, 0)
    assert isinstance(made(staged), Created)
    assert staged.part is not None and staged.part.updates == upstream.sent  # each once
    assert checkpoint.Checkpoints.of(c.s3).latest(c.sink_id, 0) == 0
    meta = checkpoint.Checkpoints.of(c.s3).read_meta(c.sink_id, 0, 0)
    assert meta is not None and meta["folded_offset"] == staged.folded_offset

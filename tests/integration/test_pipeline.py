"""The whole pipeline as processes: desired producer -> mint + write (Spark) + append -> shard,
against real Kafka, MinIO and Spark."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from sinkkit import (
    BENCH,
    SHORT_BOUNDS,
    Service,
    Sink,
    Upstream,
    cli_env,
    contents,
    converged,
    start,
    updates,
    wait_until,
)

from mvsink.bench.rss import tree
from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, BatchId, Update, Updates, UpdatesArrow
from mvsink.core.rows import parse_row_schema, row_encoder
from mvsink.core.updates import ipc_decoded_size, normalize_updates, updates_to_ipc
from mvsink.io.config import S3Settings
from mvsink.io.kafka import client_config, poll_message, produce, read_compacted, tail_consumer
from mvsink.io.registry import OWN
from mvsink.shard import Timing, open_shard
from mvsink.tools.provision import provision
from mvsink.upstream.producer import DesiredProducer

pytestmark = pytest.mark.integration
F = Frontier.at


def test_a_changelog_with_retractions_converges(hosted_sinks: Callable[..., Sink]) -> None:
    """Both desired wire forms fold the same: on a sink of partitioning 1 (a desired topic from
    before partitioning 2), the upstream switches from v1 `Updates` (one Avro row per update)
    to `UpdatesArrow` mid-stream, as in a rolling upgrade. Served by the session's shared
    deployment, which picks the sink up from its definition."""
    sink = hosted_sinks(partitioning=1)
    upstream = Upstream(sink, wire="avro")
    for _ in range(2):
        upstream.tick()
    upstream.producer.wire = "arrow"
    for _ in range(3):
        upstream.tick()
    wait_until(lambda: sink.shard.upper() == F(upstream.frontier), 180, "the final upper")
    assert contents(sink, upstream.frontier) == upstream.expected()
    assert all(d == 1 for d in upstream.expected().values())


def test_the_write_driver_stages_a_load_its_first_fold_reached(
    sink: Sink, procs: list[Service]
) -> None:
    """A write driver learns a desired partition's frontier from the `Progress` its tasks
    folded to, not only from `DesiredProgress` in `frontiers`. Here the upstream's
    `DesiredProgress` goes to another topic, so only the partitions' own progress says the load
    is complete; the driver, given the description mint would mint, stages it and append
    commits it."""
    c = sink.config
    elsewhere = replace(c, topics=replace(c.topics, frontiers=f"{c.sink_id}.elsewhere"))
    provision(elsewhere)
    provision(c)  # the sink's definition names its own frontiers topic again
    producer = DesiredProducer(elsewhere, parse_row_schema(c.row_schema), "test-in-band")
    producer.start()
    producer.send(updates([("a", 1, 0, 1), ("b", 2, 0, 1), ("c", 3, 0, 1)]))
    producer.advance_to(F(1))
    for name in ("write", "append"):
        start(procs, sink, name)
    descs = Producer(client_config(c.kafka_bootstrap))
    desc = BatchDescription(c.sink_id, BatchId(0, 0), F(0), F(1), 0)
    produce(descs, c.topics.descs, c.sink_id, desc, 0, framing=OWN)
    assert descs.flush(30) == 0
    wait_until(lambda: sink.shard.upper() == F(1), 180, "the load appended")
    assert contents(sink, 1) == {("a", 1): 1, ("b", 2): 1, ("c", 3): 1}


def test_a_read_only_sink_writes_nothing_until_promoted(sink: Sink, procs: list[Service]) -> None:
    for name in ("mint", "write", "append"):
        start(procs, sink, name, MVSINK_READ_ONLY="true")
    upstream = Upstream(sink)
    for _ in range(3):
        upstream.tick()
    write = procs[1]
    wait_until(lambda: "folded partitions" in write.text(), 120, "a read-only fold")
    # No data and no upper move: the only versions are the read-only replica's reader lease.
    shard = sink.shard
    state = shard.state()
    assert (state.upper, state.batches, sink.descs()) == (F(0), (), [])
    changes = {shard.version(s).change for s in range(1, state.seqno + 1)}  # type: ignore[union-attr]
    assert changes <= {"lease", "retain"}, changes
    promote = subprocess.run(
        [sys.executable, "-m", "mvsink.cli", "promote", sink.config.sink_id],
        env=sink.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert promote.returncode == 0, promote.stderr
    wait_until(lambda: converged(sink, upstream), 120, "convergence after promotion")


def test_two_complete_replicas_racing_on_one_shard(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, procs: list[Service]
) -> None:
    first = Sink.create(kafka_bootstrap, s3_settings, tmp_path / "a")
    second = first.replica(tmp_path / "b")
    for replica in (first, second):
        for name in ("mint", "write", "append"):
            start(procs, replica, name, f"-{replica.config.sink_id}")
    upstreams = [Upstream(first), Upstream(second)]
    for _ in range(5):
        for upstream in upstreams:
            upstream.tick()
    assert upstreams[0].expected() == upstreams[1].expected()
    wait_until(lambda: converged(first, upstreams[0]), 180, "convergence of the shared shard")
    appenders = [p for p in procs if p.name == "append"]
    wins = [p.text().count("appended ") for p in appenders]
    print(f"appends won per replica: {wins}")


# A killed write driver's reader lease holds the shard's since until it expires, and merges
# wait for since until `max_batches - 4` batches do: 6 makes them run (and be killed) here.
FAST_SHARD = {
    "MVSINK_SHARD_MAX_ATTEMPT_AGE": "5",
    "MVSINK_SHARD_MAX_PART_AGE": "14",
    "MVSINK_SHARD_MIN_GRACE": "20",
    "MVSINK_SHARD_MAX_BATCHES": "6",
}


def test_kill_9_of_each_service_then_restart_converges_without_leaks(
    sink: Sink, procs: list[Service]
) -> None:
    """`kill -9` of mint, of the write driver and of append, each in turn at random points, with
    compaction on; after restarts the shard converges with no duplicates, and after a sweep no
    staged part is left unreferenced and no live part is missing."""
    rng = random.Random(99)
    running = {
        name: start(procs, sink, name, "-0", **FAST_SHARD) for name in ("mint", "write", "append")
    }
    upstream = Upstream(sink)
    for round_, victim in enumerate(["mint", "write", "append", "write", "append", "mint"], 1):
        upstream.tick()
        time.sleep(rng.uniform(0.0, 3.0))  # lands anywhere: minting, staging, appending
        running[victim].kill()
        running[victim] = start(procs, sink, victim, f"-{round_}", **FAST_SHARD)
        wait_until(lambda: converged(sink, upstream), 180, f"convergence after killing {victim}")
    assert all(d == 1 for d in contents(sink, upstream.frontier).values())  # no duplicates

    time.sleep(21)  # past the grace period of FAST_SHARD
    shard = open_shard(sink.config.shard_id, None, sink.config.s3, Timing(5, 14, 20))
    swept = shard.sweep(grace=20)
    listed = {
        o.object_name
        for o in shard.client.list_objects(
            shard.bucket, prefix=f"{shard.prefix}/parts/", recursive=True
        )
    }
    assert shard.state().part_keys <= listed, "a live part was deleted"
    # Older retained versions may still name parts a merge replaced and GC already deleted.
    assert listed <= set(shard.referenced_keys()), "unreferenced parts left after a sweep"
    merges = sum(p.text().count("committed merge") for p in procs if p.name == "write")
    print(
        f"swept {len(swept.parts_deleted)} leaked parts; {len(listed)} referenced remain; "
        f"{merges} merges committed"
    )
    assert merges > 0, "compaction never ran"


def _stop_inside(
    service: Service, inside: Callable[[str], bool], tick: Callable[[], object], attempts: int = 400
) -> str:
    """SIGSTOP `service` at a moment its main thread's stack is `inside` (read with py-spy while
    it is stopped; resumed and tried again otherwise, `tick`ing the upstream now and then); the
    stack it was stopped in."""
    assert service.proc is not None
    spy = str(Path(sys.executable).parent / "py-spy")
    rng = random.Random(7)
    for attempt in range(attempts):
        if attempt % 20 == 0:
            tick()
        time.sleep(rng.uniform(0.0, 0.05))
        service.proc.send_signal(signal.SIGSTOP)
        dump = subprocess.run(
            [spy, "dump", "--nonblocking", "--pid", str(service.proc.pid)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        main = dump.split("Thread ", 2)[1] if dump.count("Thread ") >= 1 else dump
        if inside(main):
            return main
        service.proc.send_signal(signal.SIGCONT)
    raise AssertionError(f"{service.name} was never caught where it was wanted")


def test_append_paused_between_its_age_check_and_its_commit_while_the_sweeper_runs(
    sink: Sink, procs: list[Service]
) -> None:
    """Append is stopped (SIGSTOP) inside a compare-and-append, after it checked its parts'
    ages, for longer than `min_grace`, while the sweeper deletes those unreferenced parts;
    resumed, its commit is refused (the state's sweep horizon), the batch is staged again,
    and the sink converges: nothing lost, no live part missing, the upper not stuck."""
    for name in ("mint", "write"):
        start(procs, sink, name, **SHORT_BOUNDS)
    append = start(procs, sink, "append", **SHORT_BOUNDS)
    upstream = Upstream(sink)
    upstream.tick()
    wait_until(lambda: converged(sink, upstream), 120, "convergence")

    def appending(stack: str) -> bool:  # past the age check, reading the state to commit on
        return (
            "compare_and_append" in stack
            and "Shard.state" in stack
            and ("advance_upper" not in stack)
        )

    stack = _stop_inside(append, appending, upstream.tick)
    print(f"append stopped in:\n{stack}")
    stopped_at = time.monotonic()
    upstream.tick()
    time.sleep(8 + 1)  # past min_grace: the batch's parts are old enough to sweep
    shard = open_shard(
        sink.config.shard_id,
        None,
        sink.config.s3,
        Timing(2, 4, 8, part_grace=2, version_grace=6, request_timeout=2),
    )
    swept = shard.sweep(grace=8)
    assert swept.parts_deleted, "the sweeper found no part of the paused append to delete"
    assert shard.state().sweep_horizon > 0
    assert append.proc is not None
    append.proc.send_signal(signal.SIGCONT)
    print(
        f"append stopped for {time.monotonic() - stopped_at:.1f}s; the sweep deleted "
        f"{len(swept.parts_deleted)} parts"
    )
    for _ in range(3):
        upstream.tick()
    wait_until(lambda: converged(sink, upstream), 180, "convergence after the pause")
    state = shard.state()
    listed = {
        o.object_name
        for o in shard.client.list_objects(
            shard.bucket, prefix=f"{shard.prefix}/parts/", recursive=True
        )
    }
    assert state.part_keys <= listed, "the latest version references a deleted part"
    assert all(d == 1 for d in contents(sink, upstream.frontier).values())  # nothing twice
    assert "sweep horizon" in append.text(), "the commit was not refused by the sweep horizon"
    assert append.proc.poll() is None, "append exited"


def test_a_checkpoint_left_by_a_lost_task_attempt_is_continued_from(
    sink: Sink, procs: list[Service]
) -> None:
    """An executor can die after its task checkpointed and before the result reached the
    driver; Spark runs the task again, whose checkpoint then loses the conditional create. The
    driver continues from the newest checkpoint instead of retrying the stale version forever."""
    from minio.commonconfig import CopySource

    from services.write.checkpoint import checkpoint_key

    write = start(procs, sink, "write")
    for name in ("mint", "append"):
        start(procs, sink, name)
    upstream = Upstream(sink)
    for _ in range(2):  # the step after the first append creates the first checkpoint
        upstream.tick()
        wait_until(lambda: converged(sink, upstream), 120, "convergence")
    client, bucket = sink.shard.client, sink.config.s3.bucket
    prefix = f"sinks/{sink.config.sink_id}/write/p0/"
    latest = max(
        int(o.object_name.rsplit("/", 1)[-1].split(".")[0])
        for o in client.list_objects(bucket, prefix=prefix)
    )
    key = checkpoint_key(sink.config.sink_id, 0, latest)  # the lost attempt's: same contents
    client.copy_object(
        bucket, checkpoint_key(sink.config.sink_id, 0, latest + 1), CopySource(bucket, key)
    )
    for _ in range(3):
        upstream.tick()
    wait_until(lambda: converged(sink, upstream), 120, "convergence past the lost attempt")
    assert all(d == 1 for d in contents(sink, upstream.frontier).values())
    assert "a lost task attempt: continuing from version" in write.text()


def test_two_write_and_two_append_replicas_split_the_work(sink: Sink, procs: list[Service]) -> None:
    """... one write replica running its steps in resident tasks, the other as a Spark job per
    batch (`[spark] residents = false`)."""
    start(procs, sink, "mint")
    writes = [
        start(procs, sink, "write", f"-{i}", MVSINK_SPARK_RESIDENTS=on)
        for i, on in enumerate(("true", "false"))
    ]
    appends = [start(procs, sink, "append", f"-{i}") for i in range(2)]
    wait_until(
        lambda: (
            all(_assigned(w, "desired partitions assigned:") for w in writes)
            and all(_assigned(a, "append workers assigned:") for a in appends)
        ),
        120,
        "every replica to own a share",
    )
    upstream = Upstream(sink)
    for _ in range(6):
        upstream.tick()
        time.sleep(0.5)
    wait_until(lambda: converged(sink, upstream), 180, "convergence")
    owned = sorted(p for w in writes for p in _assigned(w, "desired partitions assigned:"))
    assert owned == list(range(sink.config.partitions))
    assert all("staged desc" in w.text() for w in writes)
    assert [" residents on " in w.text() for w in writes] == [True, False]


def _assigned(service: Service, marker: str) -> list[int]:
    """What a replica owns now, from its last assignment line."""
    lines = [line for line in service.text().splitlines() if marker in line]
    if not lines:
        return []
    listed = lines[-1].split(marker)[1].split("]")[0].strip(" [")
    return [int(p) for p in listed.split(",") if p.strip()]


def test_the_demo_converges_and_corrects_a_foreign_write(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    """README command (a) minus the stack start: `mvsink demo` on the session's services."""
    env = cli_env(kafka_bootstrap, s3_settings, tmp_path)
    demo = subprocess.run(
        [sys.executable, "-m", "mvsink.cli", "demo", "--no-stack", "--ticks", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "40/40 customers match" in demo.stderr
    assert "40/42 customers match" in demo.stderr  # the junk was visible before the correction
    assert "demo OK" in demo.stderr


def test_invalid_desired_records_are_quarantined_and_a_foreign_writers_junk_is_corrected(
    sink: Sink, procs: list[Service]
) -> None:
    """One pipeline, two checks in turn: invalid desired records (undecodable, below their
    partition's progress, in the wrong partition for the sink's partitioning, decoding to more
    than `[sink] max_record_bytes`) are quarantined to the dead-letter topic and never reach the
    shard; then junk a foreign writer appends to the shard (a row the view never had, a wrong
    value three times, a key's row retracted) is corrected on the next tick."""
    for name in ("mint", "write", "append"):
        start(procs, sink, name, MVSINK_MAX_RECORD_BYTES="100000")
    upstream = Upstream(sink)
    upstream.tick()
    bad = Producer(client_config(sink.config.kafka_bootstrap))
    bad.produce(sink.config.topics.desired, key=b"x", value=b"\x00garbage", partition=0)
    schema = parse_row_schema(sink.config.row_schema)
    late = normalize_updates(
        pa.table({"k": ["late"], "v": [1], "_time": [0], "_diff": [1]}), schema
    )
    below = UpdatesArrow(updates_to_ipc(late), partitioning=2)  # below the progress {1}
    produce(bad, sink.config.topics.desired, "x", below, partition=0, framing=OWN)
    # The v1 wire form is hashed with partitioning 1: in the wrong partition for this sink.
    other = Updates((Update.ok(row_encoder(schema)({"k": "other", "v": 1}), 5, 1),))
    produce(bad, sink.config.topics.desired, "x", other, partition=0, framing=OWN)
    # A few kilobytes of zstd that decode to over 100 kB (the limit set above): valid otherwise.
    n = 20_000
    many = {"k": ["big"] * n, "v": [0] * n, "_time": [5] * n, "_diff": [1] * n}
    big = UpdatesArrow(updates_to_ipc(normalize_updates(pa.table(many), schema), "zstd"), 2)
    assert len(big.ipc) < 100_000 < ipc_decoded_size(big.ipc)[1]  # decoded, not sent, counts
    produce(bad, sink.config.topics.desired, "x", big, partition=0, framing=OWN)
    assert bad.flush(30) == 0
    upstream.tick()
    wait_until(lambda: converged(sink, upstream), 120, "convergence past the bad records")
    write = procs[1]
    wait_until(lambda: write.text().count("quarantining desired record") >= 4, 60, "the reports")
    assert f"topic={sink.config.topics.desired} partition=0" in write.text()
    assert "below the partition's progress" in write.text()
    assert "partitioned with function 1, but the sink uses 2" in write.text()
    assert "over the limit of 100,000 (`[sink] max_record_bytes`)" in write.text()
    consumer = tail_consumer(sink.config.kafka_bootstrap, sink.config.topics.dead_letter, [0])
    quarantined: list[bytes | None] = []

    def both_arrived() -> bool:
        message = poll_message(consumer, 0.5)
        if message is not None:
            quarantined.append(message.value())
        return len(quarantined) >= 4

    wait_until(both_arrived, 30, "four dead letters")
    consumer.close()
    rows = contents(sink, upstream.frontier)
    assert ("late", 1) not in rows and ("other", 1) not in rows and ("big", 0) not in rows

    # A foreign writer's junk, appended at the shard's upper, is corrected on the next tick.
    upper = sink.shard.upper().time or 0
    junk = updates(
        [("junk", 1, upper, 1), ("c0", 999, upper, 3), ("c1", upstream.values["c1"], upper, -1)]
    )
    shard = sink.shard
    part = shard.stage(junk, F(upper), F(upper + 1), "foreign")  # no partition recorded
    assert shard.compare_and_append([part], F(upper), F(upper + 1)).__class__.__name__ == "Appended"
    assert contents(sink, upper + 1) != upstream.expected()
    upstream.frontier = upper + 1
    upstream.tick()
    wait_until(lambda: converged(sink, upstream), 120, "the junk to be corrected")


@BENCH
def test_bench_pipeline_prints_measured_figures_and_baseline(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    """The benchmark runs and reports (figures are printed, never asserted)."""
    env = cli_env(kafka_bootstrap, s3_settings, tmp_path)
    bench = subprocess.run(
        [
            sys.executable,
            "-m",
            "mvsink.cli",
            "bench",
            "pipeline",
            "--no-stack",
            "--seconds",
            "3",
            "--keys",
            "500",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    for figure in (
        "sustained updates/s through the pipeline",
        "baseline: producer alone",
        "freshness p50",
        "freshness p99",
    ):
        assert figure in bench.stderr


def test_the_view_job_alone_publishes_ticks(sink: Sink) -> None:
    """`mvsink view` (compose's upstream): ticks of desired updates and progress."""
    from mvsink.tools.demo import ROW_SCHEMA

    env = {**sink.env(), "MVSINK_ROW_SCHEMA": ROW_SCHEMA}
    view = subprocess.run(
        [
            sys.executable,
            "-m",
            "mvsink.cli",
            "view",
            "--ticks",
            "2",
            "--orders",
            "20",
            "--interval",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert view.returncode == 0, view.stderr[-2000:]
    assert "view stopped after 2 ticks" in view.stderr
    latest = read_compacted(sink.config.kafka_bootstrap, sink.config.topics.frontiers, framing=OWN)
    assert latest[f"desired:{sink.config.sink_id}:0"].frontier == F(2)  # type: ignore[union-attr]


def _signal_tree(service: Service, how: signal.Signals) -> None:
    """Send `how` to a service and all its descendants (its Spark JVM and Python workers)."""
    assert service.proc is not None
    for pid in tree(service.proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, how)


def test_a_write_replica_paused_with_checkpoints_under_way_forks_no_chain(
    sink: Sink, procs: list[Service]
) -> None:
    """Two write replicas in resident tasks, whose staging steps report before their
    checkpoints are created (`services.write.state.Pipelined`). One is paused whole (driver,
    JVM, Python workers) right after a tick, so with creates likely under way, for longer than
    the group's session: the other gains its partitions, stages them from the newest
    checkpoints, and meets the paused one's creates, landed or not, at its own conditional
    creates. Resumed, the paused one is revoked or stale. No partition's chain forks (a fork would halt the sink with
    desired records gone), the shard ends with every update once, and after a clean stop no
    partition's hold, nor `since`, is past its newest checkpoint's fold. (They may be behind
    it: a driver revoked moves its partitions' holds no further, and the next owner moves them
    at its first create.)"""
    from services.write import checkpoint

    start(procs, sink, "mint")
    start(procs, sink, "append")
    writes = [start(procs, sink, "write", f"-{i}", MVSINK_SPARK_RESIDENTS="true") for i in range(2)]
    wait_until(
        lambda: all(_assigned(w, "desired partitions assigned:") for w in writes),
        120,
        "both replicas to own a share",
    )
    upstream = Upstream(sink)
    for _ in range(4):
        upstream.tick()
        time.sleep(0.3)
    wait_until(lambda: converged(sink, upstream), 180, "convergence")
    paused, other = writes
    upstream.tick()
    time.sleep(0.05)
    _signal_tree(paused, signal.SIGSTOP)
    try:
        for _ in range(3):
            upstream.tick()
            time.sleep(0.5)
        every = list(range(sink.config.partitions))
        wait_until(
            lambda: _assigned(other, "desired partitions assigned:") == every,
            60,
            "the other replica to gain every partition",
        )
        wait_until(lambda: converged(sink, upstream), 180, "convergence without the paused one")
    finally:
        _signal_tree(paused, signal.SIGCONT)
    for _ in range(4):
        upstream.tick()
        time.sleep(0.3)
    wait_until(lambda: converged(sink, upstream), 180, "convergence after the resume")
    assert all(d == 1 for d in contents(sink, upstream.frontier).values())
    for write in writes:
        assert write.proc is not None and write.proc.poll() is None, write.text()[-3000:]
        assert "are gone" not in write.text() and "mvsink repair" not in write.text()
    assert other.stop() == 0 and paused.stop() == 0
    c, state = sink.config, sink.shard.state()
    store = checkpoint.Checkpoints.of(c.s3)
    for p in range(c.partitions):
        meta = store.read_meta(c.sink_id, p, store.latest(c.sink_id, p))
        assert meta is not None, p
        folded = Frontier.from_elements(meta["persist_folded"])
        hold = state.hold(checkpoint.holder_id(c.sink_id, p))
        assert hold is not None and not folded.less_than(hold.since), (p, hold, folded)
        assert not folded.less_than(state.since), (p, state.since, folded)

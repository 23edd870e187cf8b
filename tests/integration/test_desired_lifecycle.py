"""The desired topic's whole life on the real stack: records deleted below the checkpoints are
never needed again, records a checkpoint needs are never folded across, a write service away
for longer than its reader lease continues from its checkpoints, and a sink whose checkpoints
are gone is recovered only by an explicit `mvsink repair`."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
)
from sinkkit import (
    Service,
    Sink,
    Upstream,
    checkpoint_offsets,
    cli_env,
    contents,
    converged,
    log_starts,
    probe,
    start,
    wait_status,
    wait_until,
)

from mvsink.core.frontier import Frontier
from mvsink.core.messages import Progress, SinkRepair
from mvsink.core.rows import parse_row_schema
from mvsink.io.config import S3Settings
from mvsink.io.kafka import (
    client_config,
    delete_below,
    last_record,
    read_compacted,
    topic_configs,
    watermarks,
)
from mvsink.io.registry import OWN
from mvsink.stack.procs import free_ports
from mvsink.upstream.producer import DesiredProducer

pytestmark = pytest.mark.integration
F = Frontier.at
#: The write service deletes what its checkpoints are past every second here.
TRIM = {"MVSINK_DESIRED_TRIM_INTERVAL": "1"}


def tick_and_check(sink: Sink, upstream: Upstream, ticks: int, what: str) -> None:
    """Publish `ticks` ticks, each followed by the shard equal to desired at its upper."""
    for _ in range(ticks):
        upstream.tick()
        wait_until(lambda: converged(sink, upstream), 120, f"{what}: tick {upstream.frontier}")


def rebuilt(service: Service) -> bool:
    return "rebuilding" in service.text() or "rebuilt its corrections" in service.text()


def mvsink(sink: Sink, *args: str) -> subprocess.CompletedProcess[str]:
    """An `mvsink` command against the session's stack, for `sink`'s shard and frontiers."""
    c = sink.config
    env = {
        **cli_env(c.kafka_bootstrap, c.s3, sink.logs / "cli"),
        "MVSINK_SHARD_ID": c.shard_id,
        "MVSINK_FRONTIERS_TOPIC": c.topics.frontiers,
    }
    return subprocess.run(
        [sys.executable, "-m", "mvsink.cli", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )


def test_records_below_the_checkpoints_are_deleted_and_never_needed(
    sink: Sink, procs: list[Service]
) -> None:
    """The write service trims desired below its checkpoints; then records up to each
    checkpoint's very offset are deleted by hand while it is stopped, and the restart continues
    from the checkpoints: no rebuild, the shard equal to desired at every upper."""
    write = start(procs, sink, "write", **TRIM)
    for name in ("mint", "append"):
        start(procs, sink, name)
    upstream = Upstream(sink)
    tick_and_check(sink, upstream, 4, "before the restart")
    wait_until(
        lambda: all(low > 0 for low in log_starts(sink).values()),
        60,
        "the write service to delete desired records below its checkpoints",
    )
    trimmed = log_starts(sink)
    c = sink.config
    # The upstream side restores its frontier all the same: a publishing producer from each
    # partition's last record (the write service always keeps it), a restarted one from
    # `frontiers` (below, after everything before the checkpoints is gone).
    for p in range(c.partitions):
        assert last_record(c.kafka_bootstrap, c.topics.desired, p, framing=OWN) == Progress(
            F(upstream.frontier)
        )
    assert write.stop() == 0
    offsets = checkpoint_offsets(sink)
    assert all(trimmed[p] <= offsets[p] for p in offsets), (trimmed, offsets)
    delete_below(sink.config.kafka_bootstrap, sink.config.topics.desired, offsets)
    assert log_starts(sink) == offsets
    print(f"log starts trimmed by the service {trimmed}, deleted by hand up to {offsets}")
    restarted = DesiredProducer(c, parse_row_schema(c.row_schema), upstream.producer.producer_id)
    assert restarted.start() == F(upstream.frontier)
    upstream.producer = restarted

    again = start(procs, sink, "write", "-again", **TRIM)
    tick_and_check(sink, upstream, 3, "after the restart")
    assert "desired partitions assigned" in again.text()
    assert not rebuilt(again) and "deleted everything below" not in again.text()
    assert all(d == 1 for d in contents(sink, upstream.frontier).values())


def test_a_sink_whose_checkpoints_need_deleted_records_stages_nothing_until_repaired(
    sink: Sink, procs: list[Service]
) -> None:
    """Checkpoints deleted by hand and desired no longer starting at offset 0: the restarted
    write service stages nothing, says which partition and offsets, and is not ready; after
    `mvsink repair` it continues and the shard equals desired at every later upper."""
    (port,) = free_ports(1)
    c = sink.config
    write = start(procs, sink, "write", MVSINK_METRICS_PORT=str(port))
    for name in ("mint", "append"):
        start(procs, sink, name)
    upstream = Upstream(sink)
    tick_and_check(sink, upstream, 1, "the first tick")
    after_first = {
        p: high
        for p, (_, high) in watermarks(
            c.kafka_bootstrap, c.topics.desired, range(c.partitions)
        ).items()
    }
    tick_and_check(sink, upstream, 2, "before the restart")
    assert write.stop() == 0
    client = sink.shard.client
    for obj in client.list_objects(c.s3.bucket, prefix=f"sinks/{c.sink_id}/write/", recursive=True):
        client.remove_object(c.s3.bucket, obj.object_name)
    delete_below(c.kafka_bootstrap, c.topics.desired, after_first)
    upper, seqno = sink.shard.upper(), sink.shard.state().seqno

    def parts() -> set[str]:
        listed = client.list_objects(c.s3.bucket, f"{sink.shard.prefix}/parts/", recursive=True)
        return {o.object_name for o in listed}

    parts_before = parts()

    blocked = start(procs, sink, "write", "-blocked", MVSINK_METRICS_PORT=str(port))
    upstream.tick()  # mint mints a description for it; nothing may be staged for it
    why = wait_status(port, 503, 90, "the write service refusing to fold across deleted records")
    print(f"/readyz 503: {why}")
    assert "mvsink repair" in why and f"deleted below {after_first[0]}" in why
    wait_until(
        lambda: (
            "desired partition" in blocked.text() and "must be read from offset 0" in blocked.text()
        ),
        60,
        "the error in the log",
    )
    assert f"{c.topics.desired}[0] must be read from offset 0" in blocked.text()
    assert f"deleted everything below offset {after_first[0]}" in blocked.text()
    time.sleep(10)
    assert sink.shard.upper() == upper, "the sink appended without its desired records"
    latest = sink.shard.state().seqno
    versions = [v for v in map(sink.shard.version, range(seqno + 1, latest + 1)) if v]
    assert "append" not in {v.change for v in versions}  # leases and the compactor's merges
    merged = {
        p.key
        for v in versions
        if v.change == "merge"
        for b in v.batches
        if b.seqno == v.seqno
        for p in b.parts
    }
    assert parts() - parts_before <= merged, "a correction part was staged"
    assert blocked.proc is not None and blocked.proc.poll() is None

    shown = mvsink(sink, "sink", "show", c.sink_id)
    assert shown.returncode == 0, shown.stderr
    print(shown.stdout)
    assert "need `mvsink repair" in shown.stdout
    refused = mvsink(sink, "repair", c.sink_id)  # no --yes, no terminal: nothing happens
    assert refused.returncode == 2 and "not confirmed" in refused.stderr, refused.stderr
    repaired = mvsink(sink, "repair", c.sink_id, "--yes")
    print(repaired.stderr)
    assert repaired.returncode == 0, repaired.stderr
    assert "Cannot know" in repaired.stderr and "repair recorded on" in repaired.stderr
    record = read_compacted(c.kafka_bootstrap, c.topics.control, framing=OWN)[f"repair:{c.sink_id}"]
    assert isinstance(record, SinkRepair) and record.shard_upper == upper
    assert [(p.partition, p.frontier, p.replaced) for p in record.partitions] == [
        (p, upper, -1) for p in range(c.partitions)
    ]

    wait_until(lambda: converged(sink, upstream), 120, "convergence after the repair")
    tick_and_check(sink, upstream, 2, "after the repair")
    assert all(d == 1 for d in contents(sink, upstream.frontier).values())
    wait_status(port, 200, 60, "the write service ready again")
    assert "repaired?" in blocked.text()
    gauge = f'mvsink_write_desired_gone{{partition="0",sink="{c.sink_id}"}}'
    metrics = probe(port, "/metrics")[1]
    assert f"{gauge} 0.0" in metrics, [m for m in metrics.splitlines() if "gone" in m]


def set_cleanup_policy(sink: Sink, policy: str) -> None:
    """Set the sink's desired topic's `cleanup.policy` by hand, as an operator or a tool would."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, sink.config.topics.desired)
    resource.add_incremental_config(
        ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)
    )
    admin = AdminClient(client_config(sink.config.kafka_bootstrap))
    admin.incremental_alter_configs([resource])[resource].result(30)


def test_a_desired_topic_made_compacted_is_refused_until_provisioning_sets_it_back(
    sink: Sink, procs: list[Service]
) -> None:
    """Desired switched to `cleanup.policy=compact` while the sink's write service is paused for
    longer than its check interval (the log cleaner would keep one record a partition): resumed,
    it folds and stages nothing, is not ready and says which setting and how to fix it, and the
    shard stays as it was while desired moves on;
    `mvsink provision` sets the policy back, and the sink converges again. Then a partition added
    to desired stops it (exit 2): its `partitions` is a start setting."""
    (port,) = free_ports(1)
    c = sink.config
    check = {"MVSINK_TOPIC_CHECK_INTERVAL": "1", "MVSINK_METRICS_PORT": str(port)}
    write = start(procs, sink, "write", **check)
    for name in ("mint", "append"):
        start(procs, sink, name)
    upstream = Upstream(sink)
    tick_and_check(sink, upstream, 1, "the first tick")

    # The driver is paused (SIGSTOP) while the policy changes and the next tick's description
    # is minted, for longer than its check interval: resumed, it checks before it stages.
    upper, seqno = sink.shard.upper(), sink.shard.state().seqno
    assert write.proc is not None
    write.proc.send_signal(signal.SIGSTOP)
    try:
        set_cleanup_policy(sink, "compact")
        upstream.tick()  # mint mints a description for it; nothing may be staged for it
        wait_until(lambda: len(sink.descs()) == 2, 60, "the description of the second tick")
        time.sleep(3)  # three check intervals
    finally:
        write.proc.send_signal(signal.SIGCONT)
    why = wait_status(port, 503, 60, "the write service refusing a compacted desired topic")
    print(f"/readyz 503: {why}")
    assert f"topic {c.topics.desired} has cleanup.policy=compact" in why
    assert "mvsink provision" in why
    gauge = f'mvsink_write_desired_refused{{sink="{c.sink_id}"}}'
    assert f"{gauge} 1.0" in probe(port, "/metrics")[1]
    time.sleep(5)
    assert sink.shard.upper() == upper, "the sink appended from a compacted desired topic"
    versions = [v for v in map(sink.shard.version, range(seqno + 1, sink.shard.state().seqno + 1))]
    assert "append" not in {v.change for v in versions if v}
    assert write.proc is not None and write.proc.poll() is None

    provisioned = subprocess.run(
        [sys.executable, "-m", "mvsink.cli", "provision"],
        env=sink.env(),
        text=True,
        capture_output=True,
        timeout=180,
    )
    assert provisioned.returncode == 0, provisioned.stderr
    assert topic_configs(c.kafka_bootstrap, c.topics.desired)["cleanup.policy"] == "delete"
    wait_status(port, 200, 60, "the write service ready again")
    wait_until(lambda: converged(sink, upstream), 120, "convergence once deleted from again")
    tick_and_check(sink, upstream, 1, "after the fix")
    assert "is cleanup.policy=delete again: folding and staging resume" in write.text()
    assert f"{gauge} 0.0" in probe(port, "/metrics")[1]

    # Partitions added to desired while it runs: P is a start setting, so it stops (exit 2).
    admin = AdminClient(client_config(c.kafka_bootstrap))
    grown = NewPartitions(c.topics.desired, c.partitions + 1)
    admin.create_partitions([grown])[c.topics.desired].result(30)
    assert write.proc.wait(60) == 2, write.text()[-2000:]
    assert f"topic {c.topics.desired} has {c.partitions + 1} partitions" in write.text()


def test_a_write_service_away_longer_than_its_lease_continues_from_its_checkpoints(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, procs: list[Service]
) -> None:
    """A racing replica keeps appending and the shard is compacted while one replica's write
    service is paused, then down, for longer than `reader_lease`: its checkpoints' critical holds keep
    `since` at them, so it continues without a rebuild (its desired topic trimmed below them,
    a rebuild would need deleted records) and the shard equals both replicas' desired."""
    lease = {"MVSINK_SHARD_READER_LEASE": "4"}
    first = Sink.create(kafka_bootstrap, s3_settings, tmp_path / "a")
    second = first.replica(tmp_path / "b")
    writes = {}
    for replica in (first, second):
        for name in ("mint", "write", "append"):
            label = f"-{replica.config.sink_id}"
            service = start(procs, replica, name, label, **lease, **TRIM)
            if name == "write":
                writes[replica.config.sink_id] = service
    upstreams = [Upstream(first), Upstream(second)]

    def tick_both(ticks: int, sinks: tuple[Sink, ...]) -> None:
        for _ in range(ticks):
            for upstream in upstreams:
                upstream.tick()
            for replica in sinks:
                wait_until(lambda r=replica: converged(r, upstreams[0]), 180, "convergence")  # type: ignore[misc]

    tick_both(3, (first, second))
    # A trim deletes below a partition's older kept checkpoint: each tick's steps checkpoint (an
    # idle driver writes none), so tick until one is past the records of the first ticks.
    wait_until(
        lambda: all(low > 0 for low in log_starts(first).values()),
        120,
        "a trim",
        step=lambda: tick_both(1, (first, second)),
    )
    # Paused (SIGSTOP) for longer than its lease, then resumed: it finds since where its holds
    # kept it and goes on from its state, no rebuild.
    paused = writes[first.config.sink_id]
    assert paused.proc is not None
    paused.proc.send_signal(signal.SIGSTOP)
    tick_both(2, (second,))
    time.sleep(6)  # past the lease
    assert mvsink(first, "shard", "compact", "--all").returncode == 0
    paused.proc.send_signal(signal.SIGCONT)
    tick_both(2, (first, second))
    assert not rebuilt(paused), "the paused write service rebuilt its corrections"
    assert "deleted everything below" not in paused.text()
    paused.kill()  # now gone for good: its lease is left to lapse
    tick_both(3, (second,))
    time.sleep(6)  # past the lease
    compacted = mvsink(first, "shard", "compact", "--all")
    assert compacted.returncode == 0, compacted.stderr
    state = first.shard.state()
    again = start(procs, first, "write", "-again", **lease, **TRIM)
    wait_until(lambda: "folded partitions" in again.text(), 120, "the restart's first fold")
    tick_both(2, (first, second))
    assert not rebuilt(again), "the restarted write service rebuilt its corrections"
    assert "deleted everything below" not in again.text()
    assert "desired partitions assigned" in again.text()
    assert all(d == 1 for d in contents(first, upstreams[0].frontier).values())
    holds = {h.holder_id: h.since for h in state.holds}
    print(f"before the restart: since {state.since}, upper {state.upper}, holds {holds}")
    assert f"checkpoint:{first.config.sink_id}:p0" in holds
    assert all(state.since.less_equal(f) for f in holds.values())

    for service in procs:  # the first sink is dropped: its services stop, its holds go
        if f"-{first.config.sink_id}" in service.log.name or service is again:
            service.stop()
    listed = mvsink(first, "sink", "release", first.config.sink_id)
    assert listed.returncode == 2 and f"checkpoint:{first.config.sink_id}:p0" in listed.stderr
    released = mvsink(first, "sink", "release", first.config.sink_id, "--yes")
    assert released.returncode == 0, released.stderr
    assert not any(first.config.sink_id in h.holder_id for h in first.shard.state().holds)


def test_a_write_service_stopped_right_after_its_first_checkpoints_leaves_them_held(
    sink: Sink, procs: list[Service]
) -> None:
    """The lease keeper moves the critical holds up to a second after a checkpoint; a write
    service stopped inside that second (here: as soon as it logs the staged batch whose steps
    created the first checkpoints, the one after the first append) moves them on its way out,
    so `since` cannot pass the checkpoints it leaves: each partition's hold is its newest
    checkpoint's `persist_folded`."""
    from services.write import checkpoint

    write = start(procs, sink, "write")
    for name in ("mint", "append"):
        start(procs, sink, name)
    upstream = Upstream(sink)
    upstream.tick()
    wait_until(lambda: "staged desc" in write.text(), 120, "the first staged batch")
    upstream.tick()
    wait_until(lambda: write.text().count("staged desc") >= 2, 120, "the second staged batch")
    assert write.stop() == 0
    c, state = sink.config, sink.shard.state()
    store = checkpoint.Checkpoints.of(c.s3)
    for p in range(c.partitions):
        meta = store.read_meta(c.sink_id, p, store.latest(c.sink_id, p))
        assert meta is not None, f"partition {p} has no checkpoint"
        folded = Frontier.from_elements(meta["persist_folded"])
        hold = state.hold(checkpoint.holder_id(c.sink_id, p))
        assert hold is not None and hold.since == folded, (p, state.holds)
        assert not folded.less_than(state.since), (p, state.since, folded)

"""mint and append as real processes against real Kafka and MinIO: commits and upper
notifications, fencing, read-only and promotion, replicas splitting append workers, and
`kill -9` at random points."""

from __future__ import annotations

import random
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from sinkkit import Service, Sink, WriteRole, cli_env, mvsink_cli, start, wait_until

from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, BatchId, ShardUpper, StagedBatch
from mvsink.core.settings import S3Settings
from mvsink.io.kafka import (
    client_config,
    poll_message,
    produce,
    read_compacted,
    read_latest,
    tail_consumer,
)
from mvsink.io.registry import OWN
from mvsink.io.s3 import s3_client
from mvsink.tools.dead_letters import read_letters
from mvsink.tools.provision import provision

pytestmark = pytest.mark.integration
F = Frontier.at
SERVICES = ("mint", "write", "append")


def _owned(service: Service) -> list[int]:
    """The append workers a replica owns now (its last assignment line)."""
    lines = [line for line in service.text().splitlines() if "append workers assigned:" in line]
    if not lines:
        return []
    return [int(w) for w in lines[-1].split("assigned:")[1].strip(" []").split(",") if w.strip()]


def upper_is(sink: Sink, time_: int) -> bool:
    return sink.shard.upper() == F(time_)


def _metrics(service: Service) -> str:
    """Scrape the service's Prometheus endpoint (its address is in its log)."""
    line = next(li for li in service.text().splitlines() if "metrics on http://" in li)
    url = line.split("metrics on ")[1].split()[0]
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


@pytest.mark.parametrize(
    ("setting", "value", "topic"),
    [("MVSINK_PARTITIONS", "3", "desired"), ("MVSINK_APPEND_WORKERS", "1", "batches")],
)
def test_a_replica_whose_p_or_a_disagrees_with_the_topics_refuses_to_start(
    sink: Sink, procs: list[Service], setting: str, value: str, topic: str
) -> None:
    """Each of mint, write and append started with a P (or A) other than its provisioned
    topic's count exits 2 naming the topic, both counts and the setting, before it does
    anything (append would count a batch complete before every partition reported)."""
    name = getattr(sink.config.topics, topic)
    count = sink.config.partitions if topic == "desired" else sink.config.append_workers
    for service in [start(procs, sink, s, "-mismatch", **{setting: value}) for s in SERVICES]:
        assert service.proc is not None and service.proc.wait(120) == 2, service.text()[-2000:]
        assert f"topic {name} has {count} partitions" in service.text()
        assert f"({setting}) is {value}: set it to {count}" in service.text()
    assert sink.shard.upper() == F(0)


def test_a_replica_refused_by_its_sinks_definition_and_a_dropped_sink_purged(
    sink: Sink, procs: list[Service]
) -> None:
    """Provisioning defines the sink on the sinks topic (`mvsink sink list` shows it). Each of
    mint, write and append started with an `as_of` or a shard other than the definition's
    (its topics agree) exits 2 naming both values. `mvsink sink drop --purge` asks first, then
    writes the definition dropped, releases the sink's checkpoint holds and deletes its topics,
    its keys on `frontiers`, its checkpoints and its shard (kept while another sink's definition
    names it); a replica of it then refuses to start. The services of a sink dropped while they
    run stop by themselves, and a dropped sink is purged later."""
    c = sink.config
    env = cli_env(c.kafka_bootstrap, c.s3, sink.logs / "cli")
    listed = mvsink_cli(["sink", "list"], env)
    assert listed.returncode == 0, listed.stderr
    (line,) = [li for li in listed.stdout.splitlines() if li.startswith(f"{c.sink_id}\t")]
    assert f"shard {c.shard_id}\tP 2\tA 2\tpartitioning 2\tas_of 0\tupper {{0}}" in line, line

    for setting, value, named in (
        ("MVSINK_AS_OF", "5", "this replica's as_of 5 disagree with the sink's definition"),
        ("MVSINK_SHARD_ID", "elsewhere", "this replica's shard_id elsewhere disagree"),
    ):
        for name in SERVICES:
            service = start(procs, sink, name, f"-{value}", **{setting: value})
            assert service.proc is not None and service.proc.wait(120) == 2, service.text()[-2000:]
            assert named in service.text() and f"on {c.topics.sinks} (" in service.text()
    assert sink.shard.upper() == F(0)

    # A bad record under the sink's key wedges nothing: the sink has no definition until the
    # next provisioning, and its replicas are served as configured.
    producer = Producer(client_config(c.kafka_bootstrap))
    producer.produce(c.topics.sinks, key=c.sink_id.encode(), value=b"not a definition")
    assert producer.flush(30) == 0
    listed = mvsink_cli(["sink", "list"], env)
    assert listed.returncode == 0 and f"{c.sink_id}\t" not in listed.stdout, listed.stderr
    mint = start(procs, sink, "mint", "-undefined")
    wait_until(lambda: "started: epoch" in mint.text(), 60, "mint started")
    assert f"sink {c.sink_id} has no definition on {c.topics.sinks} (its latest" in mint.text()
    assert mint.stop() == 0
    provision(c)
    assert f"{c.sink_id}\t" in mvsink_cli(["sink", "list"], env).stdout

    # A second sink on the same shard keeps the shard through the first one's purge.
    other = sink.replica(sink.logs / "other")
    running = [start(procs, other, n, MVSINK_TOPIC_CHECK_INTERVAL="1") for n in SERVICES]
    holds = {f"checkpoint:{c.sink_id}:0": F(0), f"checkpoint:{other.config.sink_id}:0": F(0)}
    sink.shard.set_holds(holds)
    upper = ShardUpper(  # the upper, as append notifies it
        c.shard_id, F(0), sink.shard.state().seqno
    )
    produce(producer, c.topics.frontiers, f"persist:{c.shard_id}", upper, framing=OWN)
    assert producer.flush(30) == 0
    plan = mvsink_cli(["sink", "drop", c.sink_id, "--purge"], env)
    assert plan.returncode == 0 and "nothing done" in plan.stderr, plan.stderr
    assert c.sink_id in mvsink_cli(["sink", "list"], env).stdout
    done = mvsink_cli(["sink", "drop", c.sink_id, "--purge", "--yes"], env)
    assert done.returncode == 0, done.stderr
    assert f"released holds: ['checkpoint:{c.sink_id}:0']" in done.stderr
    assert "purged 5 topics" in done.stderr
    assert f"kept the shard: sink(s) {other.config.sink_id} use shard {c.shard_id}" in done.stderr
    # The running write service of the other sink may have added holds of its own by now.
    held = {h.holder_id for h in sink.shard.state().holds}
    assert f"checkpoint:{other.config.sink_id}:0" in held, held
    assert not [h for h in held if h.startswith(f"checkpoint:{c.sink_id}:")], held
    listed = mvsink_cli(["sink", "list", "--dropped"], env).stdout
    assert f"{c.sink_id}\tdropped\tshard {c.shard_id}\tP 2" in listed
    topics = AdminClient(client_config(c.kafka_bootstrap)).list_topics(timeout=30).topics
    assert [t for t in topics if t.startswith(f"{c.sink_id}.")] == [c.topics.frontiers]
    latest = read_latest(c.kafka_bootstrap, c.topics.frontiers, framing=OWN, tombstones=True)
    assert latest[f"persist:{c.shard_id}"] == upper  # the shard is kept, and its upper

    # The second sink dropped while its services run: each stops by itself, with exit 0.
    done = mvsink_cli(["sink", "drop", other.config.sink_id, "--yes"], env)
    assert done.returncode == 0 and "purged" not in done.stderr, done.stderr
    for service in running:
        assert service.proc is not None and service.proc.wait(120) == 0, service.text()[-2000:]
        assert f"sink {other.config.sink_id} was dropped (by " in service.text()
    assert sink.shard.state().holds == ()
    again = mvsink_cli(["sink", "drop", other.config.sink_id, "--yes"], env)
    assert again.returncode == 2 and "was dropped already" in again.stderr, again.stderr
    done = mvsink_cli(["sink", "drop", other.config.sink_id, "--purge", "--yes"], env)
    assert done.returncode == 0 and "kept the shard" not in done.stderr, done.stderr
    assert "purged 5 topics" in done.stderr
    client = s3_client(c.s3)
    assert not list(client.list_objects(c.s3.bucket, f"shards/{c.shard_id}/", recursive=True))
    latest = read_latest(c.kafka_bootstrap, c.topics.frontiers, framing=OWN, tombstones=True)
    assert latest[f"persist:{c.shard_id}"] is None
    for name in SERVICES:
        service = start(procs, sink, name, "-dropped")
        assert service.proc is not None and service.proc.wait(120) == 2, service.text()[-2000:]
        assert f"sink {c.sink_id} was dropped" in service.text()


def test_sink_create_defines_a_sink_once_and_refuses_other_settings_for_it(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    """`mvsink sink create ID` with settings of its own: the topics with its P and A, the shard,
    the definition; again with the same settings it changes nothing, with another P it exits 2
    naming both and creates nothing."""
    env = cli_env(kafka_bootstrap, s3_settings, tmp_path)
    sink_id = f"created-{uuid.uuid4().hex[:8]}"
    settings = ["--partitions", "3", "--append-workers", "1", "--as-of", "7"]
    rows = ["--row-schema", "k string not null, v int64"]
    for _ in range(2):
        created = mvsink_cli(["sink", "create", sink_id, *settings, *rows], env)
        assert created.returncode == 0, created.stderr
    (line,) = [li for li in mvsink_cli(["sink", "list"], env).stdout.splitlines() if sink_id in li]
    assert f"shard {sink_id}\tP 3\tA 1\tpartitioning 2\tas_of 7\tupper {{0}}" in line, line
    topics = AdminClient(client_config(kafka_bootstrap)).list_topics(timeout=30).topics
    assert len(topics[f"{sink_id}.desired"].partitions) == 3
    assert len(topics[f"{sink_id}.batches"].partitions) == 1
    other = mvsink_cli(["sink", "create", sink_id, "--partitions", "4", *settings[2:]], env)
    assert other.returncode == 2, other.stderr
    assert f"sink {sink_id} exists with other settings" in other.stderr
    assert "partitions 4 disagree" in other.stderr and "(partitions 3;" in other.stderr
    topics = AdminClient(client_config(kafka_bootstrap)).list_topics(timeout=30).topics
    assert len(topics[f"{sink_id}.desired"].partitions) == 3
    dropped = mvsink_cli(["sink", "drop", sink_id, "--purge", "--yes"], env)
    assert dropped.returncode == 0, dropped.stderr


def test_append_commits_staged_parts_and_publishes_the_upper(
    sink: Sink, procs: list[Service]
) -> None:
    mint = start(procs, sink, "mint")
    append = start(procs, sink, "append")
    write = WriteRole(sink)
    sink.advance_desired(F(3))
    wait_until(lambda: upper_is(sink, 3), 60, "shard upper {3}", step=write.pump)
    sink.advance_desired(F(6))
    wait_until(lambda: upper_is(sink, 6), 60, "shard upper {6}", step=write.pump)
    write.close()

    latest = read_compacted(sink.config.kafka_bootstrap, sink.config.topics.frontiers, framing=OWN)
    notified = latest[f"persist:{sink.config.shard_id}"]
    assert isinstance(notified, ShardUpper) and notified.upper == F(6)
    rows = {(r["k"], r["v"]): r["_diff"] for r in sink.shard.snapshot(6).to_pylist()}
    assert rows == {("p0", 0): 1, ("p1", 0): 1, ("p0", 3): 1, ("p1", 3): 1}
    assert [d.lower for d in sink.descs()] == [F(0), F(3)]
    sink_label = f'sink="{sink.config.sink_id}"'
    assert f'mvsink_append_appends_total{{outcome="ok",{sink_label}}} 2.0' in _metrics(append)
    assert f"mvsink_mint_persist_frontier{{{sink_label}}} 6.0" in _metrics(mint)
    assert f"mvsink_mint_descs_minted_total{{{sink_label}}} 2.0" in _metrics(mint)


def test_append_quarantines_bad_records_and_keeps_going(sink: Sink, procs: list[Service]) -> None:
    start(procs, sink, "mint")
    append = start(procs, sink, "append")
    producer = Producer(client_config(sink.config.kafka_bootstrap))
    producer.produce(sink.config.topics.batches, key=b"0", value=b"not a record", partition=0)
    assert producer.flush(30) == 0
    wait_until(lambda: "quarantining bad record" in append.text(), 60, "the bad record report")
    assert f"topic={sink.config.topics.batches} partition=0 offset=0" in append.text()
    write = WriteRole(sink)
    sink.advance_desired(F(2))
    wait_until(lambda: upper_is(sink, 2), 60, "shard upper {2}", step=write.pump)
    write.close()
    consumer = tail_consumer(sink.config.kafka_bootstrap, sink.config.topics.dead_letter, [0])
    values: list[bytes | None] = []

    def dead_letter_arrived() -> bool:
        message = poll_message(consumer, 0.5)
        if message is not None:
            values.append(message.value())
        return b"not a record" in values

    wait_until(dead_letter_arrived, 30, "the dead letter")
    consumer.close()


def test_append_dead_letters_batches_whose_parts_the_shard_refutes(
    sink: Sink, procs: list[Service]
) -> None:
    """Forged `StagedBatch`es for the next description, each covering every partition: one
    naming a fresh key nobody staged (appended, every later read would fail with `PartGone`),
    one a real part staged for other bounds, one a key not of a staged part's form (append
    exited 2 on it at every start), and an empty one whose lower is far ahead (the worker
    skipped every real description below it). Each is dead-lettered with why, append stays
    up, and the real batches are appended: the shard reads whole."""
    start(procs, sink, "mint")
    append = start(procs, sink, "append")
    write, c = WriteRole(sink), sink.config
    sink.advance_desired(F(3))
    wait_until(lambda: upper_is(sink, 3), 60, "shard upper {3}", step=write.pump)
    real = sink.shard.stage(
        pa.table({"k": ["x"], "v": [1], "_time": [100], "_diff": [1]}), F(100), F(101), "w"
    ).to_message()
    prefix = f"{sink.shard.prefix}/parts"
    forged = {
        "does not exist": replace(
            real, key=f"{prefix}/{int(time.time() * 1000)}-{uuid.uuid4()}.parquet"
        ),
        "was staged for [{100}, {101}), not the claimed [{3}, {6})": real,
        "is not a key of a part staged by mvsink": replace(real, key=f"{prefix}/evil.parquet"),
    }
    producer = Producer(client_config(c.kafka_bootstrap))
    covers = tuple(range(c.partitions))
    for part in forged.values():
        parts = tuple(replace(part, partition=p, partitions_total=c.partitions) for p in covers)
        batch = StagedBatch(BatchId(0, 1), F(3), F(6), covers, parts, "forger")
        produce(producer, c.topics.batches, "0", batch, partition=0, framing=OWN)
    # No parts to check, but a lower no description had: the worker would skip to it.
    ahead = StagedBatch(BatchId(0, 9), F(10**9), F(10**9 + 1), covers, (), "forger")
    produce(producer, c.topics.batches, "0", ahead, partition=0, framing=OWN)
    forged["its lower {1000000000} is ahead of the shard's upper {3}"] = real
    assert producer.flush(30) == 0
    wait_until(lambda: append.text().count("quarantining the batch of forger") == 4, 60, "refusals")
    sink.advance_desired(F(6))
    wait_until(lambda: upper_is(sink, 6), 60, "shard upper {6}", step=write.pump)
    write.close()
    assert append.proc is not None and append.proc.poll() is None
    assert sorted(r["v"] for r in sink.shard.snapshot(6).to_pylist()) == [0, 0, 3, 3]
    letters = read_letters(c.kafka_bootstrap, c.topics.dead_letter)
    reasons = [letter.header("mvsink-error") or "" for letter in letters]
    for why in forged:
        assert sum(why in reason for reason in reasons) == 1, (why, reasons)


def test_a_second_mint_fences_the_first(sink: Sink, procs: list[Service]) -> None:
    """mint invariant 1 (`services.mint`): a new mint fences the old one, lowers keep increasing."""
    first = start(procs, sink, "mint", "-first")
    wait_until(lambda: "started: epoch" in first.text(), 60, "first mint started")
    second = start(procs, sink, "mint", "-second")
    wait_until(lambda: "started: epoch" in second.text(), 60, "second mint started")
    sink.advance_desired(F(2))
    wait_until(
        lambda: first.proc is not None and first.proc.poll() is not None,
        60,
        "the first mint to exit",
    )
    assert first.proc is not None and first.proc.returncode == 0
    assert "fenced by a newer mint" in first.text()
    wait_until(lambda: len(sink.descs()) >= 1, 30, "the second mint to mint")
    assert second.proc is not None and second.proc.poll() is None
    lowers = [d.lower for d in sink.descs()]
    assert lowers == sorted(set(lowers), key=lambda f: f.time or 0)


def test_a_mint_restarts_past_records_on_descs_that_are_no_description_of_its_sink(
    sink: Sink, procs: list[Service]
) -> None:
    """A start restores from the last description of its own sink on `descs`: the records
    after it (bytes that decode to nothing, a record of another kind, a description whose
    lower the shard never reached) are dead-lettered with why, and the mint starts and
    carries on from the description (its epoch the next), ignoring a `ShardUpper` ahead of
    the shard's upper."""
    c = sink.config
    mint = start(procs, sink, "mint")
    sink.advance_desired(F(2))
    wait_until(lambda: len(sink.descs()) == 1, 60, "the first description")
    assert mint.stop() == 0
    producer = Producer(client_config(c.kafka_bootstrap))
    producer.produce(c.topics.descs, key=b"x", value=b"not a record", partition=0)
    produce(producer, c.topics.descs, c.shard_id, ShardUpper(c.shard_id, F(9), 1), 0, framing=OWN)
    ahead = BatchDescription(c.sink_id, BatchId(7, 0), F(10**9), F(10**9 + 1), 0)
    produce(producer, c.topics.descs, c.sink_id, ahead, 0, framing=OWN)
    assert producer.flush(30) == 0

    again = start(procs, sink, "mint", "-again")
    wait_until(lambda: "started: epoch" in again.text(), 60, "the mint to start again")
    assert "started: epoch 1, last lower {0}" in again.text(), again.text()
    assert again.proc is not None and again.proc.poll() is None
    consumer = tail_consumer(c.kafka_bootstrap, c.topics.dead_letter, [0])
    dead: list[tuple[bytes | None, str]] = []

    def both_dead_lettered() -> bool:
        message = poll_message(consumer, 0.5)
        if message is not None:
            dead.append((message.value(), dict(message.headers() or [])["mvsink-error"].decode()))
        return len(dead) == 3

    wait_until(both_dead_lettered, 30, "the three records dead-lettered")
    consumer.close()
    assert dead[0][0] == b"not a record" and "cannot decode record at" in dead[0][1]
    assert "a ShardUpper, not a BatchDescription" in dead[1][1]
    assert "its lower {1000000000} is ahead of the shard's upper {0}" in dead[2][1]
    assert again.text().count("not restored from") == 3

    # A ShardUpper far ahead on frontiers (forward-only, replayed at every start) is ignored:
    # minting goes on from the shard's own upper.
    wrong = ShardUpper(c.shard_id, F(10**9), 99)
    produce(producer, c.topics.frontiers, wrong.key, wrong, framing=OWN)
    assert producer.flush(30) == 0
    wait_until(
        lambda: "ignoring a ShardUpper {1000000000}" in again.text(), 60, "the upper ignored"
    )
    sink.shard.advance_upper(F(2))
    sink.advance_desired(F(5))

    def minted_from_the_real_upper() -> bool:
        descs = sink.descs(strict=False)
        return any(d.id.epoch == 1 and (d.lower, d.upper) == (F(2), F(5)) for d in descs)

    wait_until(minted_from_the_real_upper, 60, "a description from the shard's real upper")


def test_a_read_only_mint_mints_nothing_until_promote(sink: Sink, procs: list[Service]) -> None:
    """mint invariant 5: a read-only mint mints nothing until `mvsink promote`."""
    mint = start(procs, sink, "mint", MVSINK_READ_ONLY="true")
    wait_until(lambda: "read_only=True" in mint.text(), 60, "mint started read-only")
    sink.advance_desired(F(4))
    wait_until(lambda: "advanced `desired` frontier" in mint.text(), 30, "mint saw progress")
    assert sink.descs() == []
    promote = subprocess.run(
        [sys.executable, "-m", "mvsink.cli", "promote", sink.config.sink_id],
        env=sink.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert promote.returncode == 0, promote.stderr
    wait_until(lambda: len(sink.descs()) == 1, 30, "a description after promotion")
    assert "promoted: writes allowed" in mint.text()


def test_two_append_replicas_split_workers_and_both_progress(
    sink: Sink, procs: list[Service]
) -> None:
    start(procs, sink, "mint")
    replicas = [start(procs, sink, "append", f"-{i}") for i in range(2)]
    wait_until(lambda: all(_owned(r) for r in replicas), 90, "both replicas to own a worker")
    assert sorted(w for r in replicas for w in _owned(r)) == [0, 1]
    write = WriteRole(sink)
    for t in range(2, 12, 2):
        sink.advance_desired(F(t))
        wait_until(lambda t=t: upper_is(sink, t), 60, f"shard upper {{{t}}}", step=write.pump)
    write.close()
    assert all("appended" in r.text() for r in replicas), [r.log for r in replicas]


def test_kill_9_of_mint_and_append_keeps_the_invariants(sink: Sink, procs: list[Service]) -> None:
    """Random `kill -9`s of mint and append, then restart: minted lowers strictly increase (mint
    invariant 1), no part and no row is appended twice (append invariants 2 and 3), and the sink
    converges to the final desired."""
    rng = random.Random(1234)
    mint = start(procs, sink, "mint", "-0")
    append = start(procs, sink, "append", "-0")
    write = WriteRole(sink)
    kills = Counter[str]()
    t = 0
    for round_ in range(1, 11):
        t += 2
        sink.advance_desired(F(t))
        write.pump(rng.uniform(0.0, 1.5))  # the kill lands anywhere in minting and appending
        victim = rng.choice(["mint", "append", "none"])
        if victim == "mint":
            mint.kill()
            mint = start(procs, sink, "mint", f"-{round_}")
        elif victim == "append":
            append.kill()
            append = start(procs, sink, "append", f"-{round_}")
        kills[victim] += 1
        wait_until(lambda t=t: upper_is(sink, t), 90, f"convergence to {{{t}}}", step=write.pump)
    write.close()

    lowers = [d.lower.time for d in sink.descs()]
    assert lowers == sorted(set(lowers)), f"minted lowers not strictly increasing: {lowers}"
    state = sink.shard.state()
    assert set(Counter(p.key for p in state.parts()).values()) == {1}
    snapshot = sink.shard.snapshot(t).to_pylist()
    assert all(r["_diff"] == 1 for r in snapshot), "a row was appended twice"
    assert len(snapshot) == sink.config.partitions * len(state.batches)
    assert kills["mint"] > 0 and kills["append"] > 0
    assert len(state.batches) >= 5  # progress between the kills, not one final catch-up
    print(f"kills: {dict(kills)}; {len(lowers)} descriptions, {len(state.batches)} batches")


def test_inspect_decodes_any_topic_and_shows_bad_records(sink: Sink) -> None:
    sink.advance_desired(F(3))
    producer = Producer(client_config(sink.config.kafka_bootstrap))
    # neither framing (mvsink's starts 0x6D, the Schema Registry's 0x00)
    producer.produce(sink.config.topics.frontiers, key=b"junk", value=b"\x01not avro")
    # the registry's framing, read by a process with no registry and no schema header
    producer.produce(sink.config.topics.frontiers, key=b"framed", value=b"\x00\x00\x00\x00\x07?")
    assert producer.flush(30) == 0
    shown = subprocess.run(
        [sys.executable, "-m", "mvsink.cli", "inspect", sink.config.topics.frontiers],
        env=sink.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert any(
        f"desired:{sink.config.sink_id}:0" in li
        and "DesiredProgress(" in li
        and "Frontier([3])" in li
        for li in lines
    )
    assert any("junk" in li and "UNDECODABLE (not an mvsink record" in li for li in lines)
    assert any(
        "framed" in li
        and "UNDECODABLE (a Schema Registry framed record (schema id 7) without" in li
        for li in lines
    )
    limited = subprocess.run(
        [
            sys.executable,
            "-m",
            "mvsink.cli",
            "inspect",
            sink.config.topics.frontiers,
            "--limit",
            "1",
        ],
        env=sink.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert len(limited.stdout.splitlines()) == 1

"""Dead letters listed and replayed on the real stack: a write service quarantines an
undecodable desired record and records larger than its `max_record_bytes`; once the limit is
raised, `mvsink dead-letters replay` sends them back: the large ones are folded and reach the
shard, the undecodable one goes back to the dead-letter topic with its reason; replayed again,
or read again from the start by a cold start, nothing is folded twice."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from sinkkit import (
    Service,
    Sink,
    Upstream,
    checkpoint_offsets,
    cli_env,
    converged,
    mvsink_cli,
    start,
    updates,
    wait_until,
)

from mvsink.core.settings import S3Settings
from mvsink.io.kafka import REPLAYED_FROM, client_config
from mvsink.io.s3 import s3_client
from mvsink.tools.dead_letters import read_letters

pytestmark = pytest.mark.integration
#: A limit the ticks stay far below and the large record's parts exceed.
LIMIT = "65536"


def test_dead_letters_are_listed_and_replayed_through_the_producer_contract(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, procs: list[Service]
) -> None:
    sink = Sink.create(kafka_bootstrap, s3_settings, tmp_path)
    c = sink.config
    env = {**cli_env(kafka_bootstrap, s3_settings, tmp_path / "cli"), "MVSINK_SINK_ID": c.sink_id}
    start(procs, sink, "mint")
    start(procs, sink, "append")
    write = start(procs, sink, "write", MVSINK_MAX_RECORD_BYTES=LIMIT)
    upstream = Upstream(sink)
    upstream.tick()
    ahead = upstream.frontier + 3  # not yet final when it is replayed: it is not late then
    large = [(f"large{i}", i, ahead, 1) for i in range(8000)]
    upstream.producer.send(updates(large))
    garbage = Producer(client_config(kafka_bootstrap))
    garbage.produce(c.topics.desired, key=b"0", value=b"\x00not a record", partition=0)
    garbage.flush(10)
    upstream.tick()
    wait_until(lambda: converged(sink, upstream), 120, "convergence without the bad records")
    wait_until(lambda: len(read_letters(kafka_bootstrap, c.topics.dead_letter)) == 3, 60, "letters")

    listed = mvsink_cli(["dead-letters", "list", c.sink_id], env)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 3 and all(f"{c.topics.desired}[" in line for line in lines), lines
    assert sum("over the limit of 65,536" in line for line in lines) == 2, lines
    assert "3 dead letters" in listed.stderr + listed.stdout

    # The checkpoints past the letters: the next write service folds on from there (a cold
    # start would read the large records again, now under a limit that takes them, and then
    # refuse their replays as folded already).
    offsets = {p: 0 for p in range(c.partitions)}
    for letter in read_letters(kafka_bootstrap, c.topics.dead_letter):
        assert letter.source is not None
        _, partition, offset = letter.source
        offsets[partition or 0] = max(offsets[partition or 0], (offset or 0) + 1)

    def past_letters() -> bool:
        try:
            return all(o >= offsets[p] for p, o in checkpoint_offsets(sink).items())
        except AssertionError:  # no checkpoint yet
            return False

    wait_until(past_letters, 60, "checkpoints past the letters", step=lambda: time.sleep(1))
    assert write.stop() == 0
    write = start(procs, sink, "write", "-again")  # the default limit
    shown = mvsink_cli(["dead-letters", "replay", c.sink_id], env)
    assert shown.returncode == 0 and "2 of 3 letters would be sent back" in shown.stderr, shown
    assert len(read_letters(kafka_bootstrap, c.topics.dead_letter)) == 3  # a plan only

    replayed = mvsink_cli(["dead-letters", "replay", c.sink_id, "--yes"], env)
    assert replayed.returncode == 0 and "replayed 2 of 3 letters" in replayed.stderr, replayed
    for key, value, _, diff in large:
        upstream.model[(key, value)] += diff
    while upstream.frontier <= ahead:
        upstream.tick()
    wait_until(lambda: converged(sink, upstream), 180, "convergence with the replayed records")
    letters = read_letters(kafka_bootstrap, c.topics.dead_letter)
    assert len(letters) == 4, [letter.line() for letter in letters]
    back = letters[-1]
    assert back.header(REPLAYED_FROM) is not None and "still undecodable" in back.reason
    assert back.value == b"\x00not a record"

    # The same letters again: the write service folds a replay only in place of a record it
    # quarantined, once; these come back with that reason, and the shard is unchanged.
    again = mvsink_cli(["dead-letters", "replay", c.sink_id, "--to", "2", "--yes"], env)
    assert again.returncode == 0 and "replayed 2 of 3 letters" in again.stderr, again
    upstream.tick()
    wait_until(
        lambda: len(read_letters(kafka_bootstrap, c.topics.dead_letter)) == 7, 60, "refusals"
    )
    refused = read_letters(kafka_bootstrap, c.topics.dead_letter)[4:]
    assert sum("folded or replayed already" in letter.reason for letter in refused) == 2, [
        letter.line() for letter in refused
    ]
    wait_until(lambda: converged(sink, upstream), 120, "convergence, unchanged")

    # A cold start reads all of desired again, now under a limit that takes the large records
    # where they were first sent; the replays of them are refused, not folded a second time.
    assert write.stop() == 0
    client = s3_client(s3_settings)
    prefix = f"sinks/{c.sink_id}/write/"
    for found in list(client.list_objects(s3_settings.bucket, prefix=prefix, recursive=True)):
        client.remove_object(s3_settings.bucket, found.object_name or "")
    start(procs, sink, "write", "-cold")
    upstream.tick()
    wait_until(lambda: converged(sink, upstream), 120, "convergence after a cold start")

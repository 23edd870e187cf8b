"""A write task's desired fold on a real broker: with a batch's upper it stops after the
`Progress` that reaches it, so the next fold reads on from there and nothing is read twice or
skipped, and it waits past the end for a progress still to come; without one (read-only) it
reads to the end. A resident's kept readers read on from where the state folded."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from sinkkit import Sink

from mvsink.core.errors import MvsinkError
from mvsink.core.frontier import Frontier
from mvsink.core.rows import parse_row_schema
from mvsink.io.config import S3Settings
from mvsink.upstream.producer import DesiredProducer
from services.write import checkpoint, fold
from services.write.fold import fold_desired

pytestmark = pytest.mark.integration
F = Frontier.at


def test_a_fold_until_an_upper_stops_at_its_progress_and_the_next_reads_on(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    sink = Sink.create(kafka_bootstrap, s3_settings, tmp_path, partitions=1)
    config, schema = sink.config, parse_row_schema(sink.config.row_schema)
    producer = DesiredProducer(config, schema, f"fold-{uuid.uuid4().hex[:6]}")
    producer.start()
    for tick in (0, 1, 2):  # key-t inserted at time t, then progress to t + 1
        producer.send(pa.table({"k": [f"key-{tick}"], "v": [tick], "_time": [tick], "_diff": [1]}))
        producer.advance_to(F(tick + 1))
    state = checkpoint.empty(schema, 0, -1)

    def fold(until: Frontier | None, wait: float = 30.0) -> list[str]:
        before = state.correction.consolidate().column("k").to_pylist()
        fold_desired(
            kafka_bootstrap,
            config.topics.desired,
            config.topics.dead_letter,
            0,
            schema,
            config.partitioning,
            state,
            until,
            wait,
        )
        after = state.correction.consolidate().column("k").to_pylist()
        return sorted(set(after) - set(before))

    assert fold(F(1)) == ["key-0"] and state.desired_frontier == F(1)
    stopped_at = state.folded_offset
    assert fold(F(1)) == [] and state.folded_offset == stopped_at  # reached: not read at all
    assert fold(F(2)) == ["key-1"] and state.desired_frontier == F(2)
    assert state.folded_offset > stopped_at
    # The progress to 9 never comes: the read does not stop at the end, and fails after `wait`
    # (the step fails; its half-folded state is dropped, as here).
    reached = state.folded_offset
    with pytest.raises(MvsinkError, match=r"did not reach \{9\} within 1s"):
        fold_desired(
            kafka_bootstrap,
            config.topics.desired,
            config.topics.dead_letter,
            0,
            schema,
            config.partitioning,
            checkpoint.empty(schema, 0, -1),
            F(9),
            1.0,
        )

    # A progress still to come (its transaction's markers reach the partitions one by one):
    # the read waits for it past the end.
    def later() -> None:
        producer.send(pa.table({"k": ["key-3"], "v": [3], "_time": [3], "_diff": [1]}))
        producer.advance_to(F(4))

    threading.Timer(1.5, later).start()
    assert fold(F(4)) == ["key-2", "key-3"] and state.desired_frontier == F(4)
    assert state.folded_offset > reached
    end = state.folded_offset
    # read-only: to the end, past the transaction's commit marker the fold stopped before
    assert fold(None) == [] and state.folded_offset == end + 1
    assert sorted(state.correction.consolidate().column("k").to_pylist()) == [
        "key-0",
        "key-1",
        "key-2",
        "key-3",
    ]


def test_a_resident_keeps_its_readers_from_where_the_state_folded(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = Sink.create(kafka_bootstrap, s3_settings, tmp_path, partitions=1)
    config, schema = sink.config, parse_row_schema(sink.config.row_schema)
    producer = DesiredProducer(config, schema, f"fold-{uuid.uuid4().hex[:6]}")
    producer.start()
    for tick in (0, 1, 2):
        producer.send(pa.table({"k": [f"key-{tick}"], "v": [tick], "_time": [tick], "_diff": [1]}))
        producer.advance_to(F(tick + 1))
    readers = fold.Readers(keep=True)  # a resident's
    key = (kafka_bootstrap, config.topics.desired, 0)

    def run(state: checkpoint.PartitionState, until: Frontier | None) -> None:
        _fold_kept(readers, kafka_bootstrap, sink, state, until)

    state = checkpoint.empty(schema, 0, -1)
    try:
        run(state, F(1))
        reader, offset = readers.kept[key]
        assert offset == state.folded_offset
        run(state, F(2))  # reads on with the same reader
        assert readers.kept[key][0] is reader and readers.kept[key][1] == state.folded_offset
        # A state reloaded at another offset (a failed step, a checkpoint) gets a new reader,
        # from its own offset: it folds what it has not, nothing twice.
        again = checkpoint.empty(schema, 0, -1)
        run(again, F(3))
        assert readers.kept[key][0] is not reader
        assert sorted(again.correction.consolidate().column("k").to_pylist()) == [
            "key-0",
            "key-1",
            "key-2",
        ]
        run(again, None)  # read-only: a new reader, read to the end and closed
        assert key not in readers.kept
        run(state, F(3))
        readers.close(keep=[key])
        assert key in readers.kept
    finally:
        readers.close()
    assert not readers.kept
    assert sorted(state.correction.consolidate().column("k").to_pylist()) == [
        "key-0",
        "key-1",
        "key-2",
    ]


def test_a_kept_reader_waits_at_the_end_for_records_instead_of_asking_again(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between a resident's steps its kept readers sit at the end of their partitions: each
    fetch there waits at the broker for records (`fold.KEPT`), so an idle reader asks a few
    times a second, not a hundred, and still reads the next committed progress."""
    sink = Sink.create(kafka_bootstrap, s3_settings, tmp_path, partitions=1)
    config, schema = sink.config, parse_row_schema(sink.config.row_schema)
    producer = DesiredProducer(config, schema, f"fold-{uuid.uuid4().hex[:6]}")
    producer.start()
    producer.send(pa.table({"k": ["key-0"], "v": [0], "_time": [0], "_diff": [1]}))
    producer.advance_to(F(1))
    fetches: list[int] = []  # librdkafka's count of Fetch requests sent, from its statistics

    def on_stats(stats: str) -> None:
        brokers = json.loads(stats)["brokers"].values()
        fetches.append(sum(b.get("req", {}).get("Fetch", 0) for b in brokers))

    monkeypatch.setitem(fold.KEPT, "statistics.interval.ms", 100)
    monkeypatch.setitem(fold.KEPT, "stats_cb", on_stats)
    readers = fold.Readers(keep=True)
    state = checkpoint.empty(schema, 0, -1)

    def run(until: Frontier) -> None:
        _fold_kept(readers, kafka_bootstrap, sink, state, until)

    try:
        run(F(1))
        reader = readers.kept[(kafka_bootstrap, config.topics.desired, 0)][0]

        def fetched_after(seconds: float) -> int:
            """Fetches sent while the reader sat idle for `seconds` (stats are served by polls;
            nothing is there to read)."""
            fetches.clear()
            while not fetches:
                assert reader.consumer.poll(0.05) is None
            first = fetches[-1]
            time.sleep(seconds)
            fetches.clear()
            while not fetches:
                assert reader.consumer.poll(0.05) is None
            return fetches[-1] - first

        # 2 s at the end: a fetch at most every 0.5 s (with a 10 ms wait: about 200)
        assert fetched_after(2.0) <= 12
        producer.send(pa.table({"k": ["key-1"], "v": [1], "_time": [1], "_diff": [1]}))
        producer.advance_to(F(2))
        run(F(2))  # the waiting fetch is answered by the commit
        assert readers.kept[(kafka_bootstrap, config.topics.desired, 0)][0] is reader
    finally:
        readers.close()
    assert sorted(state.correction.consolidate().column("k").to_pylist()) == ["key-0", "key-1"]


def _fold_kept(
    readers: fold.Readers,
    bootstrap: str,
    sink: Sink,
    state: checkpoint.PartitionState,
    until: Frontier | None,
) -> None:
    """Fold partition 0 of `sink`'s desired into `state` with `readers` (a resident's)."""
    config = sink.config
    fold_desired(
        bootstrap,
        config.topics.desired,
        config.topics.dead_letter,
        0,
        parse_row_schema(config.row_schema),
        config.partitioning,
        state,
        until,
        readers=readers,
    )

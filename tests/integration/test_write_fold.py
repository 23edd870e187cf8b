"""A write task's desired fold on a real broker: with a batch's upper it stops after the
`Progress` that reaches it, so the next fold reads on from there and nothing is read twice or
skipped; without one (read-only), or when the progress never comes, it reads to the end."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from sinkkit import Sink

from mvsink.config import S3Settings
from mvsink.frontier import Frontier
from mvsink.producer import DesiredProducer
from mvsink.rows import parse_row_schema
from services.write import checkpoint
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

    def fold(until: Frontier | None) -> list[str]:
        before = state.correction.consolidate().column("k").to_pylist()
        fold_desired(kafka_bootstrap, config.topics.desired, config.topics.dead_letter, 0,
                     schema, config.partitioning, state, until)  # fmt: skip
        after = state.correction.consolidate().column("k").to_pylist()
        return sorted(set(after) - set(before))

    assert fold(F(1)) == ["key-0"] and state.desired_frontier == F(1)
    stopped_at = state.folded_offset
    assert fold(F(1)) == [] and state.folded_offset == stopped_at  # reached: not read at all
    assert fold(F(2)) == ["key-1"] and state.desired_frontier == F(2)
    assert state.folded_offset > stopped_at
    # The progress to 9 never comes: the end stops the read, with everything folded.
    assert fold(F(9)) == ["key-2"] and state.desired_frontier == F(3)
    end = state.folded_offset
    assert fold(None) == [] and state.folded_offset == end  # read-only: to the end
    assert sorted(state.correction.consolidate().column("k").to_pylist()) == [
        "key-0",
        "key-1",
        "key-2",
    ]

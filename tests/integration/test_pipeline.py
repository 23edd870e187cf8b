"""The whole pipeline as processes: desired producer -> mint + write (Spark) + append -> shard,
against real Kafka, MinIO and Spark."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from sinkkit import Service, Sink, wait_until

from mvsink.config import S3Settings
from mvsink.frontier import Frontier
from mvsink.producer import DesiredProducer
from mvsink.rows import parse_row_schema

pytestmark = pytest.mark.integration
F = Frontier.at


@pytest.fixture
def sink(kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path) -> Sink:
    return Sink.create(kafka_bootstrap, s3_settings, tmp_path)


@pytest.fixture
def procs(sink: Sink) -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        service.stop()
        print(f"--- {service.log.name} ---\n{service.text()[-4000:]}")


def start(procs: list[Service], sink: Sink, name: str, label: str = "", **env: str) -> Service:
    service = Service(name, sink.env(**env), sink.logs / f"{name}{label}.log").start()
    procs.append(service)
    return service


def updates(rows: list[tuple[str, int, int, int]]) -> pa.Table:
    return pa.table({
        "k": pa.array([r[0] for r in rows], pa.string()),
        "v": pa.array([r[1] for r in rows], pa.int64()),
        "_time": pa.array([r[2] for r in rows], pa.int64()),
        "_diff": pa.array([r[3] for r in rows], pa.int64()),
    })  # fmt: skip


def contents(sink: Sink, as_of: int) -> dict[tuple[str, int], int]:
    return {(r["k"], r["v"]): r["_diff"] for r in sink.shard.snapshot(as_of).to_pylist()}


def test_a_changelog_with_retractions_converges(sink: Sink, procs: list[Service]) -> None:
    for name in ("mint", "write", "append"):
        start(procs, sink, name)
    producer = DesiredProducer(sink.config, parse_row_schema(sink.config.row_schema),
                               f"test-{uuid.uuid4().hex[:6]}")  # fmt: skip
    producer.start()
    model: Counter[tuple[str, int]] = Counter()
    counts = {f"c{i}": 0 for i in range(6)}
    for tick in range(1, 6):
        changes = []
        for i, key in enumerate(counts):
            if (i + tick) % 2:
                if counts[key]:
                    changes.append((key, counts[key], tick, -1))  # retraction
                counts[key] += tick
                changes.append((key, counts[key], tick, 1))  # insertion
        producer.send(updates(changes))
        producer.advance_to(F(tick + 1))
        for k, v, _, d in changes:
            model[(k, v)] += d
    final = 6
    wait_until(lambda: sink.shard.upper() == F(final), 180, f"shard upper {{{final}}}")
    expected = {key: d for key, d in model.items() if d}
    assert contents(sink, final) == expected
    assert all(d == 1 for d in expected.values())

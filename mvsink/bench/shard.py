"""`mvsink bench shard`: the shard library against raw S3 calls on the same bytes, in one run.

1. part write: `Shard.stage` (normalize + bounds check + Parquet + PUT) vs a raw PUT of the
   same Parquet bytes;
2. compare-and-append latency p50/p99 vs a raw conditional create of the same state bytes;
3. snapshot read: `Shard.snapshot` (GETs + decode + consolidate) vs raw GETs of the same parts.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from mvsink import Say
from mvsink.core.frontier import Frontier
from mvsink.core.updates import normalize_updates
from mvsink.io.config import Config
from mvsink.io.s3 import (
    conditional_http,
    conditional_put,
    ensure_bucket,
    get_bytes,
    put_bytes,
    s3_client,
)
from mvsink.shard import open_shard
from mvsink.shard.parts import encode_part

ROWS = pa.schema([("key", pa.string()), ("value", pa.int64())])


@dataclass(frozen=True)
class Figure:
    """One measured figure and its same-run baseline."""

    name: str
    unit: str
    measured: float
    baseline: float
    baseline_name: str

    def line(self) -> str:
        ratio = self.measured / self.baseline if self.baseline else float("nan")
        return (
            f"{self.name:<34} {self.measured:>12,.1f} {self.unit:<9} "
            f"{self.baseline_name:<30} {self.baseline:>12,.1f} {self.unit:<9} x{ratio:.2f}"
        )


def _table(rows: int, time_: int) -> pa.Table:
    index = pa.array(range(rows), pa.int64())
    return pa.table(
        {
            "key": pc.binary_join_element_wise(
                "k", pc.cast(pc.bit_wise_and(index, 65535), pa.string()), ""
            ),
            "value": index,
            "_time": pa.repeat(pa.scalar(time_, pa.int64()), rows),
            "_diff": pa.repeat(pa.scalar(1, pa.int64()), rows),
        }
    )


def _best(runs: int, action: Callable[[], object]) -> float:
    """Median wall time of `runs` runs of `action`."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(config: Config, rows: int, parts: int, appends: int, say: Say) -> list[Figure]:
    """Run the benchmark against the S3 of `config`; the figures (also printed via `say`)."""
    client, http = s3_client(config.s3), conditional_http()
    ensure_bucket(client, config.s3.bucket)
    shard = open_shard(f"bench-{uuid.uuid4().hex[:8]}", ROWS, config.s3)
    per_part = rows // parts
    say(f"bench shard {shard.shard_id}: {rows:,} rows in {parts} parts, {appends} appends")
    figures = []

    table = _table(per_part, 0)
    data = encode_part(normalize_updates(table, ROWS), {})
    staged = _best(3, lambda: shard.stage(table, Frontier.at(0), Frontier.at(1), "bench"))
    raw_key = f"bench/{uuid.uuid4().hex}"
    raw = _best(
        3, lambda: put_bytes(client, config.s3.bucket, raw_key, data, "application/octet-stream")
    )
    figures.append(
        Figure(
            "part write (stage)",
            "rows/s",
            per_part / staged,
            per_part / raw,
            "raw put_object, same bytes",
        )
    )
    figures.append(
        Figure(
            "part write (stage)",
            "MB/s",
            len(data) / staged / 1e6,
            len(data) / raw / 1e6,
            "raw put_object, same bytes",
        )
    )

    small = _table(10, 0)
    latencies, raw_latencies = [], []
    for i in range(appends):
        part = shard.stage(
            small.set_column(2, "_time", pa.repeat(pa.scalar(i, pa.int64()), 10)),
            Frontier.at(i),
            Frontier.at(i + 1),
            "bench",
        )
        started = time.perf_counter()
        shard.compare_and_append([part], Frontier.at(i), Frontier.at(i + 1))
        latencies.append(time.perf_counter() - started)
        state_bytes = shard.state().to_bytes()
        started = time.perf_counter()
        conditional_put(
            client, config.s3.bucket, f"bench/{uuid.uuid4().hex}", state_bytes, http=http
        )
        raw_latencies.append(time.perf_counter() - started)
    for q, label in ((50, "p50"), (99, "p99")):
        measured = _percentile(latencies, q) * 1000
        baseline = _percentile(raw_latencies, q) * 1000
        figures.append(
            Figure(
                f"compare_and_append latency {label}",
                "ms",
                measured,
                baseline,
                "raw If-None-Match PUT of state",
            )
        )

    lower = appends
    keys = []
    for i in range(parts):
        chunk = _table(per_part, lower).set_column(
            1, "value", pa.array(range(i * per_part, (i + 1) * per_part), pa.int64())
        )
        part = shard.stage(chunk, Frontier.at(lower), Frontier.at(lower + 1), "bench")
        keys.append(part)
        shard.compare_and_append([part], Frontier.at(lower), Frontier.at(lower + 1))
        lower += 1
    total_bytes = sum(p.bytes for p in keys)
    snap = _best(3, lambda: shard.snapshot(lower))
    raw_get = _best(3, lambda: [get_bytes(client, config.s3.bucket, p.key) for p in keys])
    total_rows = per_part * parts + appends * 10
    figures.append(
        Figure(
            "snapshot read",
            "rows/s",
            total_rows / snap,
            total_rows / raw_get,
            "raw get_object, same parts",
        )
    )
    figures.append(
        Figure(
            "snapshot read",
            "MB/s",
            total_bytes / snap / 1e6,
            total_bytes / raw_get / 1e6,
            "raw get_object, same parts",
        )
    )
    say(
        f"{'measured':<34} {'value':>12} {'unit':<9} {'baseline (same run)':<30} {'value':>12} {'unit':<9} ratio"
    )
    for figure in figures:
        say(figure.line())
    return figures


def _percentile(values: list[float], q: int) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]

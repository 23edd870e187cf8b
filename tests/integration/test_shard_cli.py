"""`mvsink shard show|snapshot|sweep` and `mvsink bench shard`, run as a user runs them, against
the real S3 of the test session."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from sinkkit import BENCH, cli_env, mvsink_cli

from mvsink.core.frontier import Frontier
from mvsink.io.config import S3Settings
from mvsink.shard import open_shard

pytestmark = pytest.mark.integration

F = Frontier.at


def test_shard_show_snapshot_sweep(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    shard_id = f"cli-{uuid.uuid4().hex[:8]}"
    shard = open_shard(shard_id, pa.schema([("k", pa.string()), ("v", pa.int64())]), s3_settings)
    table = pa.table(
        {"k": ["a", "b", "a"], "v": [1, 2, 1], "_time": [0, 1, 2], "_diff": [1, 1, -1]}
    )
    shard.compare_and_append([shard.stage(table, F(0), F(3), "w1")], F(0), F(3))
    env = cli_env(kafka_bootstrap, s3_settings, tmp_path)

    show = mvsink_cli(["shard", "--shard", shard_id, "show"], env)
    assert show.returncode == 0, show.stderr
    assert "upper    {3}" in show.stdout and "parts    1 live  (by writer: w1 1)" in show.stdout
    assert "since    {0}  (retain all history; leases: -)" in show.stdout
    assert "k string, v int64" in show.stdout

    snap = mvsink_cli(["shard", "--shard", shard_id, "snapshot"], env)
    assert snap.returncode == 0, snap.stderr
    assert [json.loads(line) for line in snap.stdout.splitlines()] == [
        {"k": "b", "v": 2, "_time": 2, "_diff": 1, "_err": None}
    ]
    early = mvsink_cli(
        ["shard", "--shard", shard_id, "snapshot", "--as-of", "2", "--format", "csv"], env
    )
    assert early.stdout.splitlines()[0] == '"k","v","_time","_diff","_err"'
    assert len(early.stdout.splitlines()) == 3

    refused = mvsink_cli(["shard", "--shard", shard_id, "sweep", "--grace", "1"], env)
    assert refused.returncode == 2 and "below the minimum" in refused.stderr
    swept = mvsink_cli(["shard", "--shard", shard_id, "sweep", "--grace", "3600"], env)
    assert swept.returncode == 0 and "parts deleted:     0" in swept.stdout

    missing = mvsink_cli(["shard", "--shard", "no-such-shard", "show"], env)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_shard_compact_merges_and_reads_before_since_are_refused(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    shard_id = f"cmp-{uuid.uuid4().hex[:8]}"
    rows = pa.schema([("k", pa.string()), ("v", pa.int64())])
    shard = open_shard(shard_id, rows, s3_settings, retain_history=0)
    for t in range(3):  # one key whose value changes every time
        changes = {
            "k": ["a", "a"][: 1 + bool(t)],
            "v": [t, t - 1][: 1 + bool(t)],
            "_time": [t, t][: 1 + bool(t)],
            "_diff": [1, -1][: 1 + bool(t)],
        }
        shard.compare_and_append(
            [shard.stage(pa.table(changes), F(t), F(t + 1), "w1")], F(t), F(t + 1)
        )
    env = cli_env(kafka_bootstrap, s3_settings, tmp_path)

    compact = mvsink_cli(["shard", "--shard", shard_id, "compact", "--all"], env)
    assert compact.returncode == 0, compact.stderr
    assert "merged: 3 batches [{0}, {3}) at since {3} (forced): 5 -> 1 updates" in compact.stderr
    show = mvsink_cli(["shard", "--shard", shard_id, "show"], env)
    assert "batches  1 live  (updates each, oldest first: 1)" in show.stdout, show.stdout
    assert "since    {3}  (retain 0 times" in show.stdout
    snap = mvsink_cli(["shard", "--shard", shard_id, "snapshot"], env)
    assert [json.loads(line)["v"] for line in snap.stdout.splitlines()] == [2]
    early = mvsink_cli(["shard", "--shard", shard_id, "snapshot", "--as-of", "2"], env)
    assert early.returncode == 2 and "compacted away" in early.stderr


@BENCH
def test_bench_shard_prints_measured_and_baseline(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    env = cli_env(kafka_bootstrap, s3_settings, tmp_path)
    bench = mvsink_cli(
        ["bench", "shard", "--no-stack", "--rows", "20000", "--parts", "2", "--appends", "5"], env
    )
    assert bench.returncode == 0, bench.stderr
    for figure in (
        "part write (stage)",
        "compare_and_append latency p50",
        "compare_and_append latency p99",
        "snapshot read",
    ):
        assert figure in bench.stderr
    assert bench.stderr.count(" x") >= 6  # every figure has its same-run ratio

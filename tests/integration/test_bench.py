"""`mvsink bench` end to end on the real stack (small workloads): the systems run (also fed
from DataFrames published by executors), the figures land in JSON and a PNG, the shard and the
Delta MERGE peer's table equal the view; the restart and read-only benchmarks run and report. Figures are printed, never asserted (DEVELOPERS.md: ratios, not timings)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from sinkkit import BENCH, cli_env

from mvsink.io.config import CompactionPolicy, S3Settings
from mvsink.io.kafka import client_config
from mvsink.io.s3 import s3_client

pytestmark = [pytest.mark.integration, BENCH]


def bench(kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, *args: str) -> str:
    env = cli_env(kafka_bootstrap, s3_settings, tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "mvsink.cli", "bench", *args, "--no-stack"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stderr


def left_behind(kafka_bootstrap: str, s3_settings: S3Settings, text: str) -> list[str]:
    """The topics and objects of the bench run that printed `text` (its sinks are named after
    the run's id, `cmp-<hex>`) still on the stack."""
    run_id = re.findall(r"logs in \S*/(cmp-[0-9a-f]+)", text)[-1]
    topics = AdminClient(client_config(kafka_bootstrap)).list_topics(timeout=30).topics
    client = s3_client(s3_settings)
    objects = [
        obj.object_name or ""
        for top in ("shards", "sinks", "bench")
        for obj in client.list_objects(s3_settings.bucket, f"{top}/{run_id}-", recursive=True)
    ]
    return [t for t in topics if t.startswith(f"{run_id}-")] + objects


def test_bench_compares_mvsink_peer_delta_and_raw(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    text = bench(
        kafka_bootstrap,
        s3_settings,
        tmp_path,
        *("--keys", "3000", "--ticks", "3", "--repeats", "1", "--seconds", "0"),
        *("--out", str(out)),
    )
    figures = json.loads((out / "bench.json").read_text())
    for key in (
        "mvsink_updates_per_s",
        "peer_updates_per_s",
        "raw_updates_per_s",
        "ratio_vs_peer",
        "ratio_vs_raw",
        "freshness_p50_s",
        "freshness_p99_s",
    ):
        assert isinstance(figures[key], float) and figures[key] > 0, key
    assert figures["mvsink_shard_equals_desired"] is True
    # Hydration is timed from the system able to take input, against one plain read of the
    # load (tick 0: all 3,000 keys inserted), read from a desired topic no system trims.
    assert "one plain read of the initial load (3,000 updates)" in text
    assert figures["plain_read_load_s"] > 0
    for name in ("mvsink", "peer", "delta", "raw"):
        assert figures[f"{name}_start_s"] > 0 and figures[f"{name}_initial_load_s"] > 0, name
        assert 0 < figures[f"{name}_load_publish_s"] <= figures[f"{name}_initial_load_s"], name
        assert figures[f"{name}_hydration_vs_plain_read"] > 0, name
    assert "hydration / one plain read" in text and "process start" in text
    # The Delta MERGE peer maintains the view too: its table, read at the end, equals it.
    assert isinstance(figures["ratio_vs_delta"], float) and figures["ratio_vs_delta"] > 0
    assert figures["delta_shard_equals_desired"] is True
    assert figures["delta_bytes_read_back_per_byte_written"] > 0  # MERGE rewrites files
    assert figures["delta_table_bytes"] > 0 and figures["mvsink_table_bytes"] > 0
    assert "ratio mvsink/Delta MERGE" in text and "table in the bucket (MiB)" in text
    # Fed from the upstream's DataFrames (publish_dataframe from the executors), end to end.
    for key in (
        "mvsink-e2e_updates_per_s",
        "peer-e2e_updates_per_s",
        "ratio_e2e_vs_peer_e2e",
        "producer_updates_per_cpu_s",
        "producer_v1_updates_per_cpu_s",
    ):
        assert isinstance(figures[key], float) and figures[key] > 0, key
    assert figures["mvsink-e2e_shard_equals_desired"] is True
    # Both end-to-end columns are fed by a warmed-up upstream: every tick published in passes
    # first, each read from its Parquet file, which are deleted with the upstream.
    assert "upstream DataFrames: 4 ticks as Parquet files read by Spark" in text
    # The warm-up passes over the ticks until the JIT's share of a pass is small, at most 4.
    passes = re.findall(r"upstream warm-up pass (\d): 4 publishes to a scratch topic", text)
    assert passes == [str(n) for n in range(1, len(passes) + 1)] and 1 <= len(passes) <= 4
    run_id = re.findall(r"logs in \S*/(cmp-[0-9a-f]+)", text)[-1]
    assert (tmp_path / "bench" / run_id).is_dir()
    assert not (tmp_path / "bench" / run_id / "upstream").exists()
    assert set(figures["peer-e2e_peak_rss_mib"]) == {"peer-e2e"}
    assert set(figures["mvsink_peak_rss_mib"]) == {"mint", "write", "append"}
    assert figures["peer_batch_latency_p50_s"] > 0
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ratio mvsink/peer" in text and "updates/s (steady ticks)" in text
    # Before the first repeat the broker is warmed up by mvsink (here until the four ticks ran
    # out), on a sink of its own.
    assert "warming the broker up: mvsink, untimed, for up to 60s of ticks" in text
    assert figures["broker_warm_up_s"] > 0
    # Each column's sink is discarded once its figures are taken, and so are the plain read's
    # and the warm-ups': nothing of the run is left on the stack but its logs.
    assert len(re.findall(r"discarded cmp-\S+: 5 topics", text)) == 8 + len(passes)
    assert left_behind(kafka_bootstrap, s3_settings, text) == []


def test_bench_repeats_interleave_and_windows_end_by_time(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    """Two repeats of mvsink and the raw loop, each steady window bounded to 3 s of a workload
    longer than that and followed by a sustained window of 2 s at up to 6 ticks in flight: the
    figures are medians with a spread, each repeat's figures are kept, and each repeat's shard
    equals the view after the last tick it was fed, the sustained window's included."""
    out = tmp_path / "out"
    workload = ["--systems", "mvsink,raw", "--keys", "2000", "--ticks", "2000"]
    repeats = ["--repeats", "2", "--seconds", "3", "--out", str(out), "--keep-data"]
    deeper = ["--sustained-seconds", "2", "--sustained-in-flight", "6"]
    text = bench(
        kafka_bootstrap, s3_settings, tmp_path, *workload, *repeats, *deeper, "--warm-up", "2"
    )
    assert "discarded" not in text
    kept = left_behind(kafka_bootstrap, s3_settings, text)  # asked for: topics and shards
    assert any(k.endswith("-mvsink.desired") for k in kept), kept
    # the broker's warm-up ran its 2 s window of the workload (far from its last tick) first
    assert any(k.endswith("-warm-up-broker.desired") for k in kept), kept
    assert text.index("broker warmed up in") < text.index("repeat 1 of 2")
    assert any(k.startswith("shards/") for k in kept), kept
    figures = json.loads((out / "bench.json").read_text())
    assert figures["broker_warm_up_s"] >= 2
    assert len(figures["repeats"]) == 2
    assert "repeat 1 of 2: mvsink, raw" in text and "repeat 2 of 2: mvsink, raw" in text
    rates = [r["mvsink_updates_per_s"] for r in figures["repeats"]]
    assert figures["spread"]["mvsink_updates_per_s"] == [min(rates), max(rates)]
    assert figures["mvsink_updates_per_s"] == pytest.approx(sum(rates) / 2, rel=1e-3)
    ratios = [r["ratio_vs_raw"] for r in figures["repeats"]]
    assert min(ratios) <= figures["ratio_vs_raw"] <= max(ratios)
    for repeat in figures["repeats"]:
        # the window ended by time, not with the workload: the shard was checked against the
        # view after the last tick fed
        assert repeat["mvsink_steady_s"] >= 3.0 and repeat["mvsink_steady_ticks"] < 2000
        # then the sustained window, also ended by time; the shard was checked after its ticks
        assert repeat["mvsink_sustained_s"] >= 2.0 and repeat["mvsink_sustained_ticks"] > 0
        assert repeat["mvsink_sustained_updates_per_s"] > 0
        assert repeat["mvsink_sustained_freshness_p50_s"] > 0
        assert (
            repeat["mvsink_sustained_freshness_p50_s"] <= repeat["mvsink_sustained_freshness_p99_s"]
        )
        assert repeat["mvsink_sustained_cpu_cores_total"] > 0
        assert set(repeat["mvsink_sustained_cpu_cores"]) == {"mint", "write", "append"}
        assert repeat["workload"]["sustained_in_flight"] == 6
        assert repeat["mvsink_shard_equals_desired"] is True
        # the CPU each system's own processes used over its window (--no-stack: no stack's)
        assert set(repeat["mvsink_cpu_cores"]) == {"mint", "write", "append"}
        assert repeat["mvsink_cpu_cores"]["write"] > 0 and repeat["raw_cpu_cores"]["raw"] > 0
        assert repeat["mvsink_updates_per_cpu_s"] > 0 and repeat["ratio_vs_raw_per_cpu_s"] > 0
        # where a description's cycle went, from the services' own logs of the window
        cycle = repeat["mvsink_cycle_s"]
        assert cycle["cycle"] > 0 and cycle["job"] > 0 and "task.stage" in cycle, cycle
        assert cycle["to_job"] + cycle["append"] + cycle["to_next"] < cycle["cycle"], cycle
    assert "CPU cores mvsink " in text and "updates per CPU second mvsink/raw" in text
    assert "cycle mvsink " in text and " s a description: to_job " in text
    assert "every cell is the median [min-max] over them" in text
    assert re.search(
        r"mvsink sustained: [\d,]+ updates/s over [\d.]+s \(\d+ ticks, at most 6 in", text
    )
    assert "sustained updates/s " in text
    assert figures["ratio_sustained_vs_raw"] > 0 and figures["raw_sustained_ticks"] > 0
    assert "sustained (at most 6 ticks in flight): ratio mvsink/raw " in text
    assert figures["mvsink_shard_equals_desired"] is True
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_delta_peer_applies_ticks_read_in_any_partition_order(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    """Desired is partitioned by row, so a key's retraction and insertion are on different
    partitions. Fed one partition at a time, last partition first, each partition's tick in a
    micro-batch of its own, the Delta MERGE peer reads insertions of later ticks before
    retractions of earlier ones; its table still equals the view (a retraction read late
    deleted the key's newer value)."""
    from mvsink.bench.compare import provisioned
    from mvsink.bench.contenders import DeltaSystem, Run
    from mvsink.bench.workload import Feeder, Workload, encode_ticks
    from mvsink.io.config import load_config

    # Two partitions: enough for a key's retraction and insertion to land on different ones,
    # and each partition's tick is a Delta micro-batch of its own, so fewer are faster.
    env = {**cli_env(kafka_bootstrap, s3_settings, tmp_path), "MVSINK_PARTITIONS": "2"}
    config = provisioned(load_config(env=env), "delta-order")
    partitions = config.partitions
    workload = Workload(keys=2000, change=0.25, ticks=2, partitions=partitions)
    ticks, view = encode_ticks(config, workload, lambda _: None)
    # per tick and partition: its update records, then its progress
    fed = [
        {p: [v for q, v in tick.records if q == p] + [tick.progress] for p in range(partitions)}
        for tick in ticks
    ]
    feeder = Feeder(kafka_bootstrap)
    system = DeltaSystem(config, tmp_path / "delta")
    system.start()
    try:

        def send(partition: int, values: list[bytes]) -> None:
            """Publish `values` and wait until the peer has merged them."""
            ends: list[int] = []
            for value in values:
                feeder._produce(
                    config.topics.desired,
                    partition,
                    value,
                    lambda _, m: ends.append(m.offset() + 1),
                )
            assert feeder.producer.flush(30) == 0
            deadline = time.monotonic() + 300
            while system.offsets.get(partition, 0) < max(ends):
                system.durable(wait=0.2)
                system.check_alive()
                assert time.monotonic() < deadline, f"partition {partition} not merged"

        for partition in range(partitions):  # the initial load, whole
            send(partition, fed[0][partition])
        for partition in reversed(range(partitions)):
            for records_of in fed[1:]:
                send(partition, records_of[partition])
        run = Run("delta")
        system.finish(run, view)
    finally:
        system.stop()
    assert run.correct is True, run.detail
    # every steady tick changed a quarter of the keys: a retraction and an insertion each
    assert [tick.updates for tick in ticks[1:]] == [2 * 500, 2 * 500]


def test_bench_restart_rewrites_nothing(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    bench(
        kafka_bootstrap, s3_settings, tmp_path, "restart", "--updates", "20000", "--out", str(out)
    )
    figures = json.loads((out / "restart.json").read_text())
    assert figures["warm_bytes_rewritten"] == 0 and figures["cold_bytes_rewritten"] == 0
    assert figures["cold_resume_job_s"] > 0 and figures["shard_read_once_s"] > 0


def test_bench_readonly_samples_the_replicas_corrections(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    bench(
        kafka_bootstrap,
        s3_settings,
        tmp_path,
        *("readonly", "--minutes", "0.2", "--sample-every", "4"),  # samples at 4, 8 and 12 s
        *("--keys", "2000", "--out", str(out)),
    )
    figures = json.loads((out / "readonly.json").read_text())
    assert len(figures["samples"]) >= 3
    assert figures["samples"][-1]["upper"] > 0  # the writing replica kept appending
    last = figures["samples"][-1]
    assert last["retained_versions"] > 0 and last["leader_s3_per_hour"] > 0
    assert last["standby_s3_per_hour"] > 0  # a standby folds the shard, renews its lease


def test_bench_views_prints_hosted_and_separate_views_side_by_side(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    """A short `bench views`: two views on one hosted deployment next to one separate
    deployment, every figure measured, both shapes' shards equal to their views, the targets
    printed as met or missed, and nothing of the run left on the stack."""
    out = tmp_path / "out"
    text = bench(
        kafka_bootstrap, s3_settings, tmp_path, "views", "--views", "2", "--separate", "1",
        "--keys", "200", "--warmup", "2", "--seconds", "4", "--idle", "4", "--out", str(out),
    )  # fmt: skip
    figures = json.loads((out / "views.json").read_text())
    assert figures["correct"] is True
    assert set(figures["shapes"]) == {"hosted 2", "separate 1"}
    for label, shape in figures["shapes"].items():
        assert shape["correct"] is True, label
        assert shape["processes"] == 3 and shape["updates_per_s"] > 0, shape
        assert 0 < shape["freshness_p50_median_s"] <= shape["freshness_p99_worst_s"], shape
        assert shape["rss_mib"] > 0 and shape["s3_requests_per_sink_per_tick"] > 0, shape
        assert shape["idle_s3_requests_per_sink_per_hour"] > 0, shape  # polls, at least
    assert figures["shapes"]["hosted 2"]["sinks"] == 2
    assert "marginal memory per view: needs two hosted sizes" in text
    assert "freshness p99, worst sink (s)" in text and "state versions per sink per idle" in text
    run_id = figures["run"]
    topics = AdminClient(client_config(kafka_bootstrap)).list_topics(timeout=30).topics
    assert not [t for t in topics if t.startswith(f"{run_id}-")]
    client = s3_client(s3_settings)
    assert not [
        obj.object_name
        for top in ("shards", "sinks")
        for obj in client.list_objects(s3_settings.bucket, f"{top}/{run_id}-", recursive=True)
    ]


def test_bench_soak_keeps_the_shard_small(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    """A short soak: every figure of both windows is measured and lands in JSON and a PNG, the
    shard equals the view before and after the last cold restart, and compaction held the shard
    to a few batches and a bounded size. Timings are only checked to be measured."""
    out = tmp_path / "out"
    text = bench(
        kafka_bootstrap,
        s3_settings,
        tmp_path,
        "soak",
        "--ticks",
        "60",
        "--keys",
        "500",
        "--early",
        "20",
        "--window",
        "10",
        "--out",
        str(out),
    )
    figures = json.loads((out / "soak.json").read_text())
    assert figures["correct"] is True and figures["correct_after_restart"] is True
    assert figures["measured"] is True, figures["not_measured"]
    for window in ("early", "end"):
        assert figures[window]["samples"] > 0 and figures[window]["appends"] > 0, window
        for key in (
            "state_bytes",
            "live_batches",
            "live_parts",
            "part_bytes",
            "metadata_bytes",
            "bucket_bytes",
            "cas_p50_ms",
            "cas_p99_ms",
            "snapshot_s",
            "retained_versions",
            "s3_requests_per_hour",
            "standby_s3_requests_per_hour",
            "freshness_p50_s",
            "freshness_p99_s",
            "desired_bytes",
            "desired_records",
            "cold_restart_s",
            "repair_restart_s",
            "read_once_s",
            "cold_restart_vs_read_once",
            "repair_restart_vs_read_once",
        ):
            assert isinstance(figures[window][key], float) and figures[window][key] > 0, (
                window,
                key,
            )
    assert {t["figure"] for t in figures["targets"]} >= {"live_parts", "bucket_bytes"}
    timeline = figures["timeline"]
    assert timeline and set(timeline[-1]) >= {
        "tick",
        "state_bytes",
        "live_batches",
        "live_parts",
        "bucket_bytes",
    }
    # Compaction happened: live batches stay within the policy, and three times the ticks of the
    # early window leave each live batch about as large (with 500 keys, each Parquet part's own
    # footer is a large share of its bytes), so the live bytes are bounded whatever the ticks.
    # How many batches a window's samples catch between merges depends on the box's speed (the
    # merges run at idle priority), so the total is bounded per batch, not against the early
    # window's. The bucket's parts also hold garbage whose deletion is bounded by time, not
    # ticks (a merge's inputs `part_grace` after it, a stopped driver's unreported parts at the
    # next sweep, `min_grace` on), so how much of it a window's samples catch depends on the
    # box's speed too: the bucket is only bounded loosely.
    assert figures["end"]["live_batches_max"] <= CompactionPolicy().max_batches
    per_batch = {
        window: figures[window]["live_bytes"] / figures[window]["live_batches"]
        for window in ("early", "end")
    }
    assert per_batch["end"] < 2 * per_batch["early"], per_batch
    assert figures["end"]["bucket_bytes"] < 5 * figures["early"]["bucket_bytes"]
    assert figures["view_updates"] == 500  # one row per key after the final full merge
    assert (out / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "end/early" in text and "shard equals desired: True" in text
    assert "checkpoints deleted and repaired from the shard" in text


#: The faults of the matrix no other test of the suite injects: a stalled (SIGSTOP) Kafka and
#: MinIO, a slow MinIO, and mint and write paused past the longest shard bound. The kills are
#: `test_outages.py` (Kafka, MinIO) and `test_pipeline.py` (each service); append paused inside
#: its commit is `test_pipeline.py` too. `mvsink bench faults` runs all of them.
SUITE_FAULTS = ("kafka-stop", "minio-stop", "minio-slow", "mint-pause", "write-pause")


def test_bench_faults_survives_every_fault(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    """The fault matrix on a stack of its own (the session's is never killed), short outages,
    the faults no other test injects: every fault survived with no service exit, the shard equal
    to the view at every upper checked, readiness lost during each dependency's outage, nothing
    left after the sweep; a service paused (SIGSTOP) past the longest shard bound loses nothing
    and leaves nothing dangling."""
    from mvsink.bench import FAULTS

    assert set(SUITE_FAULTS) <= set(FAULTS)
    out = tmp_path / "out"
    env = cli_env(kafka_bootstrap, s3_settings, tmp_path)  # its stack from the session's cache
    faults = ["--faults", ",".join(SUITE_FAULTS), "--outage", "6", "--min-grace", "16"]
    faults += ["--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "mvsink.cli", "bench", "faults", *faults],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads((out / "faults.json").read_text())
    assert figures["passed"] is True
    assert [row["fault"] for row in figures["faults"]] == list(SUITE_FAULTS)
    assert figures["uppers_checked"] > len(SUITE_FAULTS) and figures["mismatches"] == []
    assert figures["duplicates"] == 0 and figures["unreferenced_after_sweep"] == 0
    for row in figures["faults"]:
        assert row["exited"] == {}, row
        assert row["lost"] == 0 and row["dangling"] == 0, row
        assert row["first_append_s"] >= 0 and row["converged_s"] >= row["first_append_s"]
        if row["fault"].split("-")[0] in ("kafka", "minio"):
            assert set(row["unready_after_s"]) == {"mint", "write", "append"}, row
    assert "fault matrix PASSED" in done.stderr

"""The write service on a real Spark standalone cluster (master + workers from the installed
PySpark, `mvsink.stack.spark`): code shipped to the executors, partitions pinned to the
executor holding their warm state, `kill -9` of a worker and scaling the workers mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from sinkkit import (
    BENCH,
    Service,
    Sink,
    Upstream,
    cli_env,
    compose_check,
    contents,
    converged,
    run_check,
    start,
    wait_until,
)

from mvsink.io.config import S3Settings, cache_dir
from mvsink.stack.manager import Stack
from mvsink.stack.spark import cluster_status
from mvsink.stack.state import load_records

# One cluster serves the module (`cluster`), and one of its tests runs a benchmark command.
pytestmark = [pytest.mark.integration, BENCH]


class Cluster:
    """A Spark standalone cluster of this module's own (own home, own ports)."""

    def __init__(self, home: Path) -> None:
        self.stack = Stack(home, cache_dir(), lambda m: print(f"[cluster] {m}", flush=True))
        self.home = home
        self.url = ""

    def scale(self, workers: int) -> None:
        self.url = self.stack.spark_up(workers) or ""

    def kill_9(self, index: int) -> None:
        """`kill -9` of worker `index` with its executor and Python workers (its group)."""
        record = load_records(self.home)[f"spark-worker-{index}"]
        os.killpg(record.pid, signal.SIGKILL)
        while record.alive:
            time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        cluster.scale(2)
        yield cluster
    finally:
        cluster.stack.down()


def _start_sink(procs: list[Service], sink: Sink, cluster: Cluster) -> Service:
    start(procs, sink, "mint")
    start(procs, sink, "append")
    return start(procs, sink, "write", MVSINK_SPARK_MASTER=cluster.url)


@pytest.fixture
def cluster_sink(sink: Sink, cluster: Cluster) -> Sink:
    cluster.scale(2)
    return sink


def _moves(write: Service) -> list[str]:
    return [line for line in write.text().splitlines() if "moved between executors" in line]


def _tick_until(sink: Sink, upstream: Upstream, done: Callable[[], bool], what: str) -> None:
    """Ticks every half second until `done`, then until the shard equals the view."""

    def tick() -> None:
        upstream.tick()
        time.sleep(0.5)

    wait_until(done, 240, what, step=tick)
    wait_until(lambda: converged(sink, upstream), 240, f"convergence: {what}")
    assert all(d == 1 for d in contents(sink, upstream.frontier).values())


def test_the_pipeline_converges_on_a_two_worker_cluster_and_through_a_worker_kill_9(
    cluster_sink: Sink, cluster: Cluster, procs: list[Service]
) -> None:
    """One pipeline, two checks in turn. On two workers: both executors run partitions,
    importing the code the driver shipped (they could not import it otherwise on another
    machine), and the shard equals the view. Then a worker dies with its executor mid-run:
    Spark reschedules its tasks on the other, the partitions' home follows them there, and the
    shard converges with every diff 1; with the worker back, partitions move to its new
    executor, and it still converges."""
    sink = cluster_sink
    write = _start_sink(procs, sink, cluster)
    upstream = Upstream(sink)
    for _ in range(4):
        upstream.tick()
        time.sleep(0.5)
    wait_until(lambda: converged(sink, upstream), 240, "convergence on the cluster")
    assert all(d == 1 for d in contents(sink, upstream.frontier).values())
    text = write.text()
    assert f"Spark {cluster.url}: executors ['0', '1']" in text, text[-3000:]
    warmed = text.split(" warmed up in ")[1].splitlines()[0]
    assert "mvsink-code-" in warmed
    assert warmed.endswith(", 2 task slots"), warmed  # one core per worker: one wave of 2 tasks

    for _ in range(3):
        upstream.tick()
    time.sleep(0.3)  # lands mid-job
    cluster.kill_9(2)
    _tick_until(sink, upstream, lambda: len(_moves(write)) >= 1, "partitions off the dead executor")
    cluster.scale(2)
    # Moves before the scale may still arrive (a killed executor's orphaned Python worker
    # finishing a step reports itself as the driver): wait for one onto executor 2, the
    # restarted worker's.
    before = len(_moves(write))
    _tick_until(
        sink,
        upstream,
        lambda: any("-> 2" in move for move in _moves(write)[before:]),
        "partitions onto the new executor",
    )


def test_scaling_workers_1_2_1_loses_and_double_covers_no_partition(
    cluster_sink: Sink, cluster: Cluster, procs: list[Service]
) -> None:
    """Workers scaled 1 -> 2 -> 1 while ticks flow: partitions move to the new executor and
    back, and every update lands exactly once."""
    sink = cluster_sink
    cluster.scale(1)
    write = _start_sink(procs, sink, cluster)
    upstream = Upstream(sink)
    for _ in range(3):
        upstream.tick()
    wait_until(lambda: converged(sink, upstream), 240, "convergence on 1 worker")
    cluster.scale(2)
    _tick_until(sink, upstream, lambda: len(_moves(write)) >= 1, "partitions onto worker 2")
    cluster.scale(1)
    _tick_until(sink, upstream, lambda: len(_moves(write)) >= 2, "partitions back onto worker 1")


def test_the_compose_healthchecks_pass_on_the_daemons(cluster: Cluster) -> None:
    """The compose file's checks of the Spark master (`/json/` says ALIVE) and of a worker (its
    `/json/` names the master's UI once registered), run against this cluster's daemons; the
    master's check refuses a worker's page, which has no status."""
    cluster.scale(2)
    ui_port = load_records(cluster.home)["spark-master"].ports["ui_port"]
    master_check = compose_check("spark-master")
    worker_check = compose_check("spark-worker")
    assert run_check(master_check, ui_port).returncode == 0
    listed = cluster_status(ui_port)["workers"]
    assert isinstance(listed, list)
    # The master lists workers killed or scaled away by earlier tests too, as DEAD.
    workers = [worker for worker in listed if worker["state"] == "ALIVE"]
    assert len(workers) == 2, listed
    for worker in workers:
        port = urlsplit(worker["webuiaddress"]).port
        assert port is not None, worker
        registered = run_check(worker_check, port)
        assert registered.returncode == 0, registered.stderr
        assert run_check(master_check, port).returncode == 1


def test_bench_runs_mvsink_on_the_cluster(
    cluster: Cluster, kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path
) -> None:
    """`mvsink bench --spark-master` runs mvsink's write service on the cluster and prints the
    same table; the shard equals the view."""
    cluster.scale(2)
    out = tmp_path / "out"
    env = cli_env(kafka_bootstrap, s3_settings, tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mvsink.cli",
            "bench",
            "--no-stack",
            "--systems",
            "mvsink",
            "--spark-master",
            cluster.url,
            "--keys",
            "2000",
            "--ticks",
            "3",
            "--repeats",
            "1",
            "--seconds",
            "0",
            # no broker warm-up (a whole mvsink column more): `test_bench.py` checks it
            "--warm-up",
            "0",
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    figures = json.loads((out / "bench.json").read_text())
    assert figures["systems"] == ["mvsink"] and figures["mvsink_spark_master"] == cluster.url
    assert figures["mvsink_shard_equals_desired"] is True
    assert figures["mvsink_updates_per_s"] > 0
    assert "updates/s (steady ticks)" in done.stderr and "bytes read back" in done.stderr

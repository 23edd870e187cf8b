"""The systems under benchmark as `mvsink bench` drives them (`mvsink.bench.compare`): each is
started, asked how many ticks are durable, finished (correctness, bytes, table size) and
stopped. mvsink runs as its three services; the others as `mvsink.bench.systems` processes.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mvsink.bench.cycle import cycle_phases
from mvsink.bench.workload import BenchError
from mvsink.core.messages import ShardUpper
from mvsink.io.config import Config
from mvsink.io.kafka import drain, tail_consumer
from mvsink.io.s3 import prefix_bytes, s3_client
from mvsink.shard import open_shard
from mvsink.shard.compact import shard_table_bytes
from mvsink.tools.demo import service_env, start_services, stop_services


@dataclass
class Run:
    """What one system did with the workload."""

    name: str
    #: Ticks published, the initial load's and the sustained window's included (fewer than
    #: the workload's when the windows were bounded by time).
    ticks: int = 0
    #: Ticks of the steady window (after the initial load, before the sustained window).
    steady_ticks: int = 0
    #: From starting the system's processes to the system able to take input (`System.ready`).
    start_s: float = 0.0
    #: From starting to publish the initial load (after `start_s`) to the load durable: the
    #: hydration, publishing included (the systems read while it is published).
    initial_load_s: float = 0.0
    #: Of which publishing the load took (until the broker had all of it).
    load_publish_s: float = 0.0
    steady_s: float = 0.0
    steady_updates: int = 0
    freshness: list[float] = field(default_factory=list)
    #: Each tick's (published, durable) times (`time.monotonic`), in tick order.
    tick_times: list[tuple[float, float]] = field(default_factory=list)
    batch_seconds: list[float] = field(default_factory=list)
    peak_rss_mib: dict[str, float] = field(default_factory=dict)
    #: CPU seconds per second of the steady window: the system's process trees by label, and
    #: the embedded stack's components (`stack:<name>`) it ran on.
    cpu_cores: dict[str, float] = field(default_factory=dict)
    bytes_written: int = 0
    bytes_read_back: int = 0
    correct: bool | None = None
    #: What the system's table takes in the bucket at the end (mvsink: the shard, with
    #: retained and garbage objects), for the systems that maintain the view.
    table_bytes: int | None = None
    detail: str = ""
    spark_master: str | None = None
    #: The steady window in seconds since the epoch (the services' logs are stamped so).
    steady_wall: tuple[float, float] | None = None
    #: mvsink: where a description's cycle went in the steady window (`mvsink.bench.cycle`).
    cycle: dict[str, float] = field(default_factory=dict)
    #: The sustained window after the steady one, fed at a deeper closed loop
    #: (`mvsink.bench.compare.drive`): its length, ticks, updates, freshness and CPU cores.
    sustained_s: float = 0.0
    sustained_ticks: int = 0
    sustained_updates: int = 0
    sustained_freshness: list[float] = field(default_factory=list)
    sustained_cpu_cores: dict[str, float] = field(default_factory=dict)

    @property
    def updates_per_s(self) -> float:
        return self.steady_updates / self.steady_s if self.steady_s else 0.0

    @property
    def sustained_updates_per_s(self) -> float:
        return self.sustained_updates / self.sustained_s if self.sustained_s else 0.0


class System(ABC):
    """A system under benchmark: started, fed, asked how many ticks are durable, stopped."""

    name = ""

    def __init__(self, config: Config, logs: Path) -> None:
        self.config = config
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ends: dict[int, dict[int, int]] = {}

    @abstractmethod
    def start(self) -> None:
        """Start the system's processes."""

    @abstractmethod
    def ready(self, timeout: float = 600.0) -> None:
        """Wait until the system's processes are up and able to take input (a JVM started, a
        session made, a query or a consumer running), so the initial load times the hydration
        and not the start."""

    @abstractmethod
    def durable(self, wait: float = 0.0) -> int:
        """How many ticks (0..n-1) are durable, waiting up to `wait` seconds for the system's
        next report (a frontier, a progress line) when it has none new: how the bench blocks
        between checks instead of polling."""

    def check_alive(self) -> None:
        for label, proc in self.procs.items():
            if proc.poll() is not None:
                raise BenchError(
                    f"{self.name} process {label} exited with {proc.returncode}; "
                    f"log {self.logs / (label + '.log')}"
                )

    def stop(self) -> None:
        stop_services(self.procs.values())

    @abstractmethod
    def finish(self, run: Run, final: pa.Table) -> None:
        """Fill in what is only known at the end (correctness, bytes)."""


class MvsinkSystem(System):
    name = "mvsink"

    def start(self) -> None:
        for proc, label in zip(
            start_services(self.config, self.logs), ("mint", "write", "append"), strict=True
        ):
            self.procs[label] = proc
        self.upper = 0
        self._frontiers = tail_consumer(self.config.kafka_bootstrap, self.config.topics.frontiers)
        self.framing = self.config.framing()

    def ready(self, timeout: float = 600.0) -> None:
        """The write service logged that it started (its Spark session is up); mint and
        append start in a fraction of that."""
        log, deadline = self.logs / "write.log", time.monotonic() + timeout
        while " started as " not in log.read_text(errors="replace"):
            self.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: the write service did not start in {timeout:.0f}s")
            time.sleep(0.1)

    def durable(self, wait: float = 0.0) -> int:
        for _, record in drain(self._frontiers, first_timeout=wait, framing=self.framing):
            if isinstance(record, ShardUpper) and record.shard_id == self.config.shard_id:
                self.upper = max(self.upper, record.upper.time or 0)
        return self.upper

    def stop(self) -> None:
        self._frontiers.close()
        super().stop()

    def finish(self, run: Run, final: pa.Table) -> None:
        shard = open_shard(self.config.shard_id, None, self.config.s3)
        snapshot = shard.snapshot(self.upper)
        expected = {
            (k, v)
            for k, v in zip(
                final.column("key").to_pylist(), final.column("value").to_pylist(), strict=True
            )
        }
        got = snapshot.select(["key", "value", "_diff"]).to_pylist()
        run.correct = (
            all(r["_diff"] == 1 for r in got) and {(r["key"], r["value"]) for r in got} == expected
        )
        metrics = scrape(self.logs / "write.log")
        run.bytes_written = int(metrics.get("mvsink_write_written_bytes_total", 0))
        run.bytes_read_back = int(metrics.get("mvsink_write_read_back_bytes_total", 0))
        run.table_bytes = shard_table_bytes(shard)[1]
        run.detail = f"shard {len(got):,} rows at upper {{{self.upper}}}"
        if run.steady_wall is not None:
            mint, write, append = (
                (self.logs / f"{label}.log").read_text(errors="replace")
                for label in ("mint", "write", "append")
            )
            run.cycle = cycle_phases(mint, write, append, run.steady_wall)


def scrape(log: Path) -> dict[str, float]:
    """The write service's Prometheus metrics (its port is in its log), summed over labels."""
    # The last address: a restarted service logs a new one after the dead process's.
    found = re.findall(r"metrics on (http://\S+/metrics)", log.read_text(errors="replace"))
    if not found:
        return {}
    text = urllib.request.urlopen(found[-1], timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.split("{")[0].split(" ")[0], float(line.rsplit(" ", 1)[1])
            out[name] = out.get(name, 0.0) + value
    return out


class OffsetSystem(System):
    """A `mvsink.bench.systems` process reporting durable offsets as JSON lines."""

    #: Which `mvsink.bench.systems` loop runs (`name` is the column's, e.g. `peer-e2e`).
    kind = ""

    def __init__(self, config: Config, logs: Path) -> None:
        super().__init__(config, logs)
        #: Lines read from the process, and how many `durable` has counted; `news` is notified
        #: with each line.
        self.lines = self.counted = 0
        self.news = threading.Condition()
        #: Per partition, the offset the process reported durable; its batches' seconds.
        self.offsets: dict[int, int] = {}
        self.batch_seconds: list[float] = []
        self.rows = 0
        self.started = threading.Event()

    def ready(self, timeout: float = 600.0) -> None:
        """The process printed its `{"ready": true}` line."""
        deadline = time.monotonic() + timeout
        while not self.started.wait(0.5):
            self.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name} did not start in {timeout:.0f}s; log {self.logs}")

    def start(self) -> None:
        prefix = f"bench/{self.config.sink_id}"
        cmd = [
            sys.executable,
            "-m",
            "mvsink.bench.systems",
            self.kind,
            self.config.topics.desired,
            str(self.config.partitions),
            prefix,
            str(self.logs / "work"),
        ]
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{self.name}.log").open("ab") as err:
            self.procs[self.name] = subprocess.Popen(
                cmd, env=service_env(self.config), stdout=subprocess.PIPE, stderr=err
            )
        self._lines = threading.Thread(target=self._read, daemon=True)
        self._lines.start()

    def _read(self) -> None:
        stdout = self.procs[self.name].stdout
        assert stdout is not None
        for raw in stdout:
            if not raw.startswith(b"{"):
                # Not the peer's: the JVM's own warnings (a full code cache, say) go to stdout.
                with (self.logs / f"{self.name}.log").open("ab") as log:
                    log.write(b"stdout: " + raw)
                continue
            line = json.loads(raw)
            if "ready" in line:
                self.started.set()
                continue
            if self._line(line):
                continue
            if "batch" in line:
                for partition, offset in line["offsets"].items():
                    self.offsets[int(partition)] = max(self.offsets.get(int(partition), 0), offset)
                self.batch_seconds.append(line["seconds"])
            else:
                self.offsets[line["partition"]] = max(
                    self.offsets.get(line["partition"], 0), line["offset"]
                )
            self.rows += line["rows"]
            self._heard()

    def _heard(self) -> None:
        """Count a line read and wake `durable`."""
        with self.news:
            self.lines += 1
            self.news.notify_all()

    def _line(self, line: dict[str, Any]) -> bool:
        """A line only this kind prints (taken, True) or a progress line (False)."""
        return False

    def durable(self, wait: float = 0.0) -> int:
        with self.news:
            self.news.wait_for(lambda: self.lines != self.counted, wait)
            self.counted = self.lines
        done = 0
        while done in self.ends and all(
            self.offsets.get(p, 0) >= o for p, o in self.ends[done].items()
        ):
            done += 1
        return done

    def finish(self, run: Run, final: pa.Table) -> None:
        run.batch_seconds = list(self.batch_seconds)
        run.correct = None  # neither corrects anything; what they wrote is counted instead
        run.detail = f"{self.rows:,} updates written as Parquet, nothing read back"


class PeerSystem(OffsetSystem):
    name = kind = "peer"


class DeltaSystem(OffsetSystem):
    """Structured Streaming maintaining the view as a Delta table with MERGE
    (`mvsink.bench.systems.run_delta`): its table is read at the end and compared with the
    view, and MERGE's reads (it rewrites the files holding matched rows) are counted."""

    name = kind = "delta"

    def start(self) -> None:
        self.read = self.written = 0
        self.final: dict[str, Any] = {}
        super().start()

    def _line(self, line: dict[str, Any]) -> bool:
        if "final" in line:
            self.final = line
            return True
        self.read += line.get("read", 0)
        self.written += line.get("written", 0)
        return False

    def finish(self, run: Run, final: pa.Table) -> None:
        proc = self.procs[self.name]
        proc.send_signal(signal.SIGTERM)  # it writes its table's rows, then exits
        proc.wait(180)
        self._lines.join(30)
        if not self.final:
            raise BenchError(f"{self.name} ended without its table; log {self.logs}")
        table = pq.read_table(self.final["final"])
        expected = set(
            zip(final.column("key").to_pylist(), final.column("value").to_pylist(), strict=True)
        )
        got = list(
            zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)
        )
        run.correct = len(got) == len(set(got)) and set(got) == expected
        run.batch_seconds = list(self.batch_seconds)
        run.bytes_written, run.bytes_read_back = self.written, self.read
        objects, size = prefix_bytes(
            s3_client(self.config.s3), self.config.s3.bucket, f"bench/{self.config.sink_id}/table/"
        )
        run.table_bytes = size
        run.detail = (
            f"Delta table {len(got):,} rows, {objects:,} objects, {size / 2**20:,.1f} MiB "
            f"in the bucket"
        )


class RawSystem(OffsetSystem):
    name = kind = "raw"

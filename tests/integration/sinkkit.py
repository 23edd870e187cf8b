"""Test kit for running sink services as real processes against the session's Kafka and S3:
a provisioned sink, service processes (start, SIGTERM, `kill -9`), the upstream's desired
progress, and the write stage's role (stage parts in the shard, report `StagedBatch`es) played
by the test until the write service exists."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
import yaml
from confluent_kafka import Producer

from mvsink.core.codec import decode_message
from mvsink.core.errors import DecodeError
from mvsink.core.frontier import Frontier
from mvsink.core.messages import BatchDescription, BatchId, DesiredProgress, StagedBatch
from mvsink.core.rows import parse_row_schema
from mvsink.io.config import Config, S3Settings, Topics, cache_dir
from mvsink.io.kafka import (
    Reader,
    client_config,
    poll_message,
    produce,
    tail_consumer,
    watermarks,
)
from mvsink.io.registry import OWN
from mvsink.shard import Shard, open_shard
from mvsink.tools.demo import SERVICES
from mvsink.tools.provision import provision
from mvsink.upstream.producer import DesiredProducer

#: On tests that run a benchmark command: each takes the machine's benchmark lock
#: (`mvsink.cli.bench.alone`), so the suite's workers (`./run test`: pytest-xdist,
#: `--dist loadgroup`) run them on one worker, one after another.
BENCH = pytest.mark.xdist_group("bench")

if TYPE_CHECKING:
    from services.write.task import StepSpec

ROW_SCHEMA = "k string, v long"
REPO_ROOT = Path(__file__).resolve().parents[2]
#: The compose deployment's healthcheck scripts, by the name its checks run them.
SCRIPTS = {
    "kafka-ready": REPO_ROOT / "docker/kafka/kafka-ready",
    "http-ready": REPO_ROOT / "docker/http-ready",
}


#: Shard bounds of seconds, short enough to pause past or to see many of pass in a test, in
#: the order `mvsink.core.settings.Timing` checks.
SHORT_BOUNDS = {
    "MVSINK_SHARD_MAX_ATTEMPT_AGE": "2",
    "MVSINK_SHARD_MAX_PART_AGE": "4",
    "MVSINK_SHARD_MIN_GRACE": "8",
    "MVSINK_SHARD_PART_GRACE": "2",
    "MVSINK_SHARD_VERSION_GRACE": "6",
    "MVSINK_SHARD_REQUEST_TIMEOUT": "2",
}


def compose_check(service: str) -> list[str]:
    """The healthcheck command of `service` in the compose file, without its `CMD`."""
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yaml").read_text())
    test: list[str] = compose["services"][service]["healthcheck"]["test"]
    assert test[0] == "CMD", test
    return test[1:]


def run_check(command: list[str], port: int) -> subprocess.CompletedProcess[str]:
    """`command` (a compose check: script, port, arguments) run here against `port`."""
    script, _, *args = command
    return subprocess.run(
        [str(SCRIPTS[script]), str(port), *args], capture_output=True, text=True, timeout=30
    )


def mvsink_cli(
    args: list[str], env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`mvsink ARGS` run by this interpreter in environment `env`, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "mvsink.cli", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def wait_until(
    predicate: Callable[[], bool], timeout: float, what: str, step: Callable[[], None] | None = None
) -> None:
    """Poll `predicate` (running `step` between polls) until true or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        if step is not None:
            step()
        else:
            time.sleep(0.1)


def probe(port: int, path: str) -> tuple[int, str]:
    """The status and body of `GET http://127.0.0.1:port/path` (0 if nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()
    except OSError as error:
        return 0, repr(error)


def wait_status(port: int, status: int, timeout: float, what: str) -> str:
    """Wait until `/readyz` answers `status`; its body. Fails with the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        got, body = probe(port, "/readyz")
        if got == status:
            return body.strip()
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: /readyz still {got} after {timeout}s: {body.strip()}")
        time.sleep(0.5)


@dataclass
class Sink:
    """A provisioned sink replica (topics + shard) with a unique id."""

    config: Config
    shard: Shard
    logs: Path

    @classmethod
    def create(
        cls,
        bootstrap: str,
        s3: S3Settings,
        logs: Path,
        partitions: int = 2,
        workers: int = 2,
        shard_id: str | None = None,
        frontiers: str | None = None,
        partitioning: int = 2,
        as_of: int = 0,
        sinks: str = "sinks",
    ) -> Sink:
        """A new sink; `shard_id`/`frontiers` to share them with another replica, `sinks`: the
        sinks topic it is defined on."""
        sink_id = f"sink-{uuid.uuid4().hex[:8]}"
        frontiers = frontiers or f"{sink_id}.frontiers"
        config = Config(
            sink_id=sink_id,
            shard_id=shard_id or sink_id,
            partitions=partitions,
            append_workers=workers,
            partitioning=partitioning,
            as_of=as_of,
            read_only=False,
            topics=Topics.for_sink(sink_id, frontiers, sinks),
            kafka_bootstrap=bootstrap,
            s3=s3,
            spark_master="local[*]",
            row_schema=ROW_SCHEMA,
        )
        provision(config)
        return cls(config, open_shard(config.shard_id, None, s3), logs)

    def replica(self, logs: Path) -> Sink:
        """Another replica of this sink: its own topics, on this one's shard and `frontiers`."""
        c = self.config
        return Sink.create(
            c.kafka_bootstrap, c.s3, logs, shard_id=c.shard_id, frontiers=c.topics.frontiers
        )

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a service process of this sink."""
        c = self.config
        settings = {
            "MVSINK_SINK_ID": c.sink_id,
            "MVSINK_SHARD_ID": c.shard_id,
            "MVSINK_PARTITIONS": str(c.partitions),
            "MVSINK_APPEND_WORKERS": str(c.append_workers),
            "MVSINK_PARTITIONING": str(c.partitioning),
            "MVSINK_AS_OF": str(c.as_of),
            "MVSINK_FRONTIERS_TOPIC": c.topics.frontiers,
            "MVSINK_KAFKA_BOOTSTRAP": c.kafka_bootstrap,
            "MVSINK_S3_ENDPOINT": c.s3.endpoint,
            "MVSINK_S3_BUCKET": c.s3.bucket,
            "MVSINK_S3_ACCESS_KEY": c.s3.access_key.reveal(),
            "MVSINK_S3_SECRET_KEY": c.s3.secret_key.reveal(),
            "MVSINK_LOG_LEVEL": "DEBUG",
        }
        return clean_env(self.logs / "state", **{**settings, **extra})

    def advance_desired(self, frontier: Frontier) -> None:
        """The upstream's progress: every desired partition reaches `frontier`."""
        producer = Producer(client_config(self.config.kafka_bootstrap))
        for partition in range(self.config.partitions):
            record = DesiredProgress(self.config.sink_id, partition, frontier)
            produce(producer, self.config.topics.frontiers, record.key, record, framing=OWN)
        assert producer.flush(30) == 0

    def descs(self, strict: bool = True) -> list[BatchDescription]:
        """Every committed description so far (not `strict`: skipping records that are none,
        for a test that wrote such records there)."""
        consumer = tail_consumer(self.config.kafka_bootstrap, self.config.topics.descs, [0])
        found: list[BatchDescription] = []
        idle = time.monotonic()
        try:
            while time.monotonic() - idle < 1.5:
                message = poll_message(consumer, 0.2)
                if message is not None:
                    idle = time.monotonic()
                    try:
                        record = decode_message(message, BatchDescription)
                    except DecodeError:
                        assert not strict, f"offset {message.offset()} is no record"
                        continue
                    assert isinstance(record, BatchDescription) or not strict, record
                    if isinstance(record, BatchDescription):
                        found.append(record)
        finally:
            consumer.close()
        return found


@dataclass
class Service:
    """One service process (`python -m services.<name>`), logging to a file."""

    name: str
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"services.{self.name}"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def kill(self) -> None:
        """`kill -9`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> int | None:
        """SIGTERM, then wait; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        return self.proc.returncode

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start(procs: list[Service], sink: Sink, name: str, label: str = "", **env: str) -> Service:
    """Start `services.<name>` for `sink` (log `<name><label>.log`), recorded in `procs`."""
    service = Service(name, sink.env(**env), sink.logs / f"{name}{label}.log").start()
    procs.append(service)
    return service


@dataclass
class Hosted:
    """One deployment of mint, write and append started with `[service] sinks = all`, serving
    every sink defined on its own sinks topic (`mvsink.io.host`). The suite's tests whose sink
    needs no service setting of its own share its three processes and its one Spark application
    instead of starting three of their own; each test's sink is dropped at its end, which stops
    the sink's units."""

    bootstrap: str
    s3: S3Settings
    sinks: str
    frontiers: str
    services: dict[str, Service] = field(default_factory=dict)

    def start(self, state: Path) -> Hosted:
        env = host_env(self.bootstrap, self.s3, state / "state", self.sinks, self.frontiers)
        for name in SERVICES:
            self.services[name] = Service(name, env, state / f"{name}.log").start()
        return self

    def sink(self, logs: Path, **settings: int) -> Sink:
        """A new sink defined on this deployment's sinks topic (`settings`: `Sink.create`'s
        partitions, workers, partitioning, as_of): the services pick it up."""
        return Sink.create(
            self.bootstrap, self.s3, logs, frontiers=self.frontiers, sinks=self.sinks, **settings
        )

    def text(self, name: str, sink: Sink) -> str:
        """What service `name` logged of `sink`: its lines naming the sink (a unit's lines are
        tagged `[<sink id>]`)."""
        sink_id = sink.config.sink_id
        return "\n".join(li for li in self.services[name].text().splitlines() if sink_id in li)

    def exited(self) -> dict[str, int]:
        """The services that exited, with their codes: none should, whatever a sink does."""
        return {
            name: code
            for name, service in self.services.items()
            if service.proc is not None and (code := service.proc.poll()) is not None
        }

    def stop(self) -> None:
        for service in self.services.values():
            service.stop()


def checkpoint_offsets(sink: Sink) -> dict[int, int]:
    """Each desired partition's `folded_offset` in its newest checkpoint."""
    from services.write import checkpoint

    c, found = sink.config, {}
    store = checkpoint.Checkpoints.of(c.s3)
    for p in range(c.partitions):
        meta = store.read_meta(c.sink_id, p, store.latest(c.sink_id, p))
        assert meta is not None, f"partition {p} has no checkpoint"
        found[p] = meta["folded_offset"]
    return found


def log_starts(sink: Sink) -> dict[int, int]:
    """Each desired partition's log start offset."""
    c = sink.config
    marks = watermarks(c.kafka_bootstrap, c.topics.desired, range(c.partitions))
    return {p: low for p, (low, _) in marks.items()}


#: What the suite's processes take from its own environment among the `MVSINK_*` settings: the
#: JVM options of the Spark drivers they start (set by tests/conftest.py).
SUITE_SETTINGS = ("MVSINK_SPARK_DRIVER_JAVA_OPTIONS",)


def clean_env(state_dir: Path, **settings: str) -> dict[str, str]:
    """The environment of a process the suite starts, as a user's shell would give it: no
    `MVSINK_*` setting of the suite's own environment but `SUITE_SETTINGS`, a state directory
    of its own, the session's cache of downloads and builds (jars, MinIO, Spark's class
    archive), then `settings`."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("MVSINK_") or k in SUITE_SETTINGS
    }
    env.update({"MVSINK_STATE_DIR": str(state_dir), "MVSINK_CACHE_DIR": str(cache_dir())})
    env.update(settings)
    return env


def cli_env(bootstrap: str, s3: S3Settings, state_dir: Path) -> dict[str, str]:
    """The environment of an `mvsink` command pointed at the session's services (`clean_env`:
    the peers' jars are resolved once, not by every command)."""
    return clean_env(
        state_dir,
        MVSINK_KAFKA_BOOTSTRAP=bootstrap,
        MVSINK_S3_ENDPOINT=s3.endpoint,
        MVSINK_S3_BUCKET=s3.bucket,
        MVSINK_S3_ACCESS_KEY=s3.access_key.reveal(),
        MVSINK_S3_SECRET_KEY=s3.secret_key.reveal(),
    )


def host_env(
    bootstrap: str, s3: S3Settings, state: Path, sinks: str, frontiers: str
) -> dict[str, str]:
    """A hosting service's environment (`[service] sinks = all`): no `[sink] id` of its own,
    the sinks and frontiers topics its sinks are defined on."""
    return {
        **cli_env(bootstrap, s3, state),
        "MVSINK_SERVICE_SINKS": "all",
        "MVSINK_SINKS_TOPIC": sinks,
        "MVSINK_FRONTIERS_TOPIC": frontiers,
        "MVSINK_READY_BOUND": "5",
        "MVSINK_METRICS_PORT": "0",
    }


@dataclass
class WriteRole:
    """Plays the write stage for the tests: for every new description, stage one part per
    desired partition (row `(p<partition>, lower)` at time `lower`) and report it, split over
    two writers to exercise coverage."""

    sink: Sink
    consumer: Reader = field(init=False)
    producer: Producer = field(init=False)
    last_lower: Frontier | None = None
    staged: list[BatchDescription] = field(default_factory=list)

    def __post_init__(self) -> None:
        c = self.sink.config
        self.consumer = tail_consumer(c.kafka_bootstrap, c.topics.descs, [0])
        self.producer = Producer(client_config(c.kafka_bootstrap))

    def pump(self, seconds: float = 0.2) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            message = poll_message(self.consumer, 0.05)
            if message is None:
                continue
            desc = decode_message(message, BatchDescription)
            assert isinstance(desc, BatchDescription)
            if self.last_lower is not None and not self.last_lower.less_than(desc.lower):
                continue
            self.last_lower = desc.lower
            self._stage(desc)

    def _stage(self, desc: BatchDescription) -> None:
        c, shard = self.sink.config, self.sink.shard
        t = desc.lower.time
        assert t is not None
        halves = [list(range(c.partitions))[::2], list(range(c.partitions))[1::2]]
        for writer, covers in zip(("wa", "wb"), halves, strict=True):
            if not covers:
                continue
            parts = []
            for p in covers:
                table = pa.table({"k": [f"p{p}"], "v": [t], "_time": [t], "_diff": [1]})
                parts.append(shard.stage(table, desc.lower, desc.upper, writer, p, c.partitions))
            batch = StagedBatch(
                desc.id,
                desc.lower,
                desc.upper,
                tuple(covers),
                tuple(p.to_message() for p in parts),
                writer,
            )
            produce(
                self.producer,
                c.topics.batches,
                str(desc.append_worker),
                batch,
                partition=desc.append_worker,
                framing=OWN,
            )
        assert self.producer.flush(30) == 0
        self.staged.append(desc)

    def close(self) -> None:
        self.consumer.close()


# -- an upstream and its view ------------------------------------------------------------------


def updates(rows: list[tuple[str, int, int, int]]) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([r[0] for r in rows], pa.string()),
            "v": pa.array([r[1] for r in rows], pa.int64()),
            "_time": pa.array([r[2] for r in rows], pa.int64()),
            "_diff": pa.array([r[3] for r in rows], pa.int64()),
        }
    )


def contents(sink: Sink, as_of: int) -> dict[tuple[str, int], int]:
    return {(r["k"], r["v"]): r["_diff"] for r in sink.shard.snapshot(as_of).to_pylist()}


class Upstream:
    """A view's changelog: per tick, half the keys change value (retraction + insertion)."""

    def __init__(self, sink: Sink, keys: int = 6, wire: str = "arrow") -> None:
        self.producer = DesiredProducer(
            sink.config,
            parse_row_schema(sink.config.row_schema),
            f"test-{uuid.uuid4().hex[:6]}",
            wire=wire,
        )
        self.frontier = self.producer.start().time or 0
        self.model: Counter[tuple[str, int]] = Counter()
        self.values = {f"c{i}": 0 for i in range(keys)}
        #: Updates published so far.
        self.sent = 0

    def tick(self) -> int:
        """Publish one tick's changes and advance; the new frontier."""
        tick = self.frontier
        changes = []
        for i, key in enumerate(self.values):
            if (i + tick) % 2:
                if self.values[key]:
                    changes.append((key, self.values[key], tick, -1))  # retraction
                self.values[key] += tick + 1
                changes.append((key, self.values[key], tick, 1))  # insertion
        self.producer.send(updates(changes))
        self.sent += len(changes)
        self.frontier = tick + 1
        self.producer.advance_to(Frontier.at(self.frontier))
        for k, v, _, d in changes:
            self.model[(k, v)] += d
        return self.frontier

    def expected(self) -> dict[tuple[str, int], int]:
        return {key: d for key, d in self.model.items() if d}


def converged(sink: Sink, upstream: Upstream) -> bool:
    upper = sink.shard.upper()
    return (
        upper == Frontier.at(upstream.frontier)
        and contents(sink, upstream.frontier) == upstream.expected()
    )


def step_specs(
    sink: Sink, versions: dict[int, int], stage: tuple[int, int] | None = None
) -> list[StepSpec]:
    """Specs as the write driver makes them, for every partition of `sink`, staging
    `[lower, upper)` or only folding."""
    from services.write.task import SinkSpec, StepSpec

    c = sink.config
    desc = None
    if stage:
        desc = BatchDescription(
            c.sink_id, BatchId(0, 0), Frontier.at(stage[0]), Frontier.at(stage[1]), 0
        )
    of = SinkSpec(
        sink_id=c.sink_id,
        shard_id=c.shard_id,
        partitions=c.partitions,
        partitioning=c.partitioning,
        bootstrap=c.kafka_bootstrap,
        desired_topic=c.topics.desired,
        dead_letter_topic=c.topics.dead_letter,
        s3=c.s3,
        row_schema=parse_row_schema(ROW_SCHEMA),
        as_of=c.as_of,
        writer_id="test-writer",
    )
    return [StepSpec(of, p, versions.get(p, -1), desc) for p in range(c.partitions)]

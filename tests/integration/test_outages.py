"""Riding through Kafka and S3 outages: mint, write and append run as processes against an
embedded stack of this module's own; MinIO and then Kafka are `kill -9`ed, stay away for a while
and are started again by `Stack.up` on the addresses they had. No service exits, each one's
`/readyz` goes unready within its bound during the outage and ready after, and the shard
converges to the view."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sinkkit import (
    Service,
    Sink,
    Upstream,
    clean_env,
    converged,
    probe,
    start,
    wait_status,
    wait_until,
)

from mvsink.core.codec import decode_message
from mvsink.core.messages import UpdatesArrow
from mvsink.core.rows import parse_row_schema
from mvsink.core.updates import updates_from_ipc
from mvsink.io.config import S3Settings, Secret, cache_dir, load_config
from mvsink.io.kafka import poll_message, tail_consumer
from mvsink.io.s3 import ensure_bucket, s3_client
from mvsink.stack.manager import Stack
from mvsink.stack.procs import free_ports
from mvsink.stack.state import load_records
from mvsink.tools.demo import ROW_SCHEMA, ViewJob
from mvsink.tools.provision import provision

pytestmark = pytest.mark.integration

READY_BOUND = 5.0
#: Past READY_BOUND, so every service goes unready inside the outage.
OUTAGE = 12.0
SERVICES = ("mint", "write", "append")
#: The view's wait on each Kafka call (`kafka_call_timeout`: its events' flush and read, the
#: desired transactions' start and commit, in the driver and in the publishing tasks).
VIEW_CALL_TIMEOUT = 6.0
#: Longer than every such wait, so the tick in flight fails and is retried by a job rebuilt from
#: Kafka; a shorter outage may be ridden through by the client alone.
VIEW_OUTAGE = 2.5 * VIEW_CALL_TIMEOUT


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """An embedded stack of this module's own, never the session's (its components get killed;
    each test starts whatever is down with `Stack.up`)."""
    own = Stack(tmp_path_factory.mktemp("stack"), cache_dir(), print)
    try:
        yield own
    finally:
        own.down()


def kill_component(stack: Stack, name: str) -> str:
    """`kill -9` a stack component; the address it served."""
    record = load_records(stack.home)[name]
    assert record.pid is not None
    os.kill(record.pid, signal.SIGKILL)
    wait_until(lambda: not load_records(stack.home)[name].alive, 30, f"{name} to die")
    return record.address


def test_services_ride_through_minio_and_kafka_outages(stack: Stack, tmp_path: Path) -> None:
    endpoints = stack.up(timeout=180)
    s3 = S3Settings(
        endpoints.s3_endpoint,
        "outages",
        "us-east-1",
        Secret(endpoints.s3_access_key),
        Secret(endpoints.s3_secret_key),
        False,
    )
    ensure_bucket(s3_client(s3), s3.bucket)
    sink = Sink.create(endpoints.kafka_bootstrap, s3, tmp_path / "logs")
    ports = dict(zip(SERVICES, free_ports(len(SERVICES)), strict=True))
    procs: list[Service] = []
    running = {
        name: start(
            procs,
            sink,
            name,
            MVSINK_METRICS_PORT=str(ports[name]),
            MVSINK_READY_BOUND=str(READY_BOUND),
            MVSINK_LOG_LEVEL="INFO",
        )
        for name in SERVICES
    }
    try:
        upstream = Upstream(sink)
        upstream.tick()
        wait_until(lambda: converged(sink, upstream), 180, "first convergence")
        for name in SERVICES:
            wait_status(ports[name], 200, 60, f"{name} ready")
            assert probe(ports[name], "/healthz")[0] == 200

        for component in ("minio", "kafka"):
            address = kill_component(stack, component)
            went = time.monotonic()
            if component == "minio":
                upstream.tick()  # the upstream needs only Kafka
            for name in SERVICES:
                why = wait_status(ports[name], 503, READY_BOUND + 10, f"{name} without {component}")
                print(f"{component} down: {name} /readyz 503: {why}")
                assert probe(ports[name], "/healthz")[0] == 200, f"{name} not live"
            time.sleep(max(0.0, OUTAGE - (time.monotonic() - went)))
            for name, service in running.items():
                assert service.proc is not None and service.proc.poll() is None, (
                    f"{name} exited ({service.proc and service.proc.returncode}) while "
                    f"{component} was down:\n{service.text()[-3000:]}"
                )
            back = stack.up(timeout=180)
            assert address in (back.kafka_bootstrap, back.s3_endpoint), "a new address"
            recovered = time.monotonic()
            upstream.tick()
            wait_until(lambda: converged(sink, upstream), 180, f"convergence after {component}")
            converged_s = time.monotonic() - recovered
            for name in SERVICES:
                wait_status(ports[name], 200, 60, f"{name} after {component}")
            print(
                f"{component}: down {recovered - went:.0f}s; converged {converged_s:.1f}s after "
                f"it was back"
            )
        for name, service in running.items():
            assert service.proc is not None and service.proc.poll() is None, f"{name} exited"
        assert all(
            d == 1 for d in sink.shard.snapshot(upstream.frontier).column("_diff").to_pylist()
        )
        for name, service in running.items():  # an outage is logged when it starts and ends
            text = service.text()
            assert text.count("kafka unreachable") == 1 and text.count("s3 unreachable") == 1, name
            assert "kafka reachable again" in text and "s3 reachable again" in text, name
            assert "Retrying (Retry" not in text and "FAIL [" not in text, (
                f"{name}: per-retry lines"
            )
    finally:
        for service in procs:
            service.stop()


def test_the_view_tool_rides_through_a_kafka_outage(
    stack: Stack, tmp_path: Path, spark: Any
) -> None:
    """`mvsink view` (the demo's upstream) with Kafka `kill -9`ed under it: it does not exit,
    says once that Kafka is away and once that it is back, goes on ticking, and what it
    published is exactly the view over the order events of the published ticks (no tick lost
    or applied twice by a retried attempt)."""
    endpoints = stack.up(timeout=180)
    sink_id = f"view-{uuid.uuid4().hex[:6]}"
    env = clean_env(
        tmp_path / "state",
        MVSINK_SINK_ID=sink_id,
        MVSINK_SHARD_ID=sink_id,
        MVSINK_ROW_SCHEMA=ROW_SCHEMA,
        MVSINK_KAFKA_BOOTSTRAP=endpoints.kafka_bootstrap,
        MVSINK_S3_ENDPOINT=endpoints.s3_endpoint,
        MVSINK_S3_BUCKET="outages",
        MVSINK_S3_ACCESS_KEY=endpoints.s3_access_key,
        MVSINK_S3_SECRET_KEY=endpoints.s3_secret_key,
        MVSINK_KAFKA_CALL_TIMEOUT=str(VIEW_CALL_TIMEOUT),
    )
    config = load_config(env=env)
    provision(config)
    log = tmp_path / "view.log"

    def text() -> str:
        return log.read_text(errors="replace")

    with log.open("wb") as out:
        view = subprocess.Popen(
            [sys.executable, "-m", "mvsink.cli", "view", "--orders", "20", "--interval", "0.5"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "tick 2:" in text(), 180, "three ticks")
        kill_component(stack, "kafka")
        time.sleep(VIEW_OUTAGE)
        assert view.poll() is None, text()[-3000:]
        stack.up(timeout=180)
        wait_until(lambda: "Kafka is back" in text(), 180, "the view to see Kafka back")
        last = max(int(t) for t in re.findall(r"tick (\d+):", text()))
        wait_until(lambda: f"tick {last + 2}:" in text(), 60, "two more ticks")
    finally:
        view.send_signal(signal.SIGTERM)
        assert view.wait(60) == 0, text()[-3000:]
    assert text().count("Kafka unavailable") == 1 and text().count("Kafka is back") == 1
    assert "FAIL [" not in text(), "a line per reconnect attempt"

    job = ViewJob(config, spark, print)  # rebuilt from the order events of the published ticks
    expected = {(c, n, cents / 100): 1 for c, (n, cents) in job.state.items()}
    job.close()
    published: Counter[tuple[str, int, float]] = Counter()
    consumer = tail_consumer(config.kafka_bootstrap, config.topics.desired)
    try:
        idle = time.monotonic()
        while time.monotonic() - idle < 3:
            message = poll_message(consumer, 0.2)
            if message is None:
                continue
            idle = time.monotonic()
            record = decode_message(message)
            if isinstance(record, UpdatesArrow):
                for row in updates_from_ipc(record.ipc, parse_row_schema(ROW_SCHEMA)).to_pylist():
                    if row["_time"] < job.frontier:
                        published[(row["customer"], row["orders"], row["total"])] += row["_diff"]
    finally:
        consumer.close()
    assert job.frontier > last + 2
    assert {k: d for k, d in published.items() if d} == expected

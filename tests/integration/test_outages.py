"""Riding through Kafka and S3 outages: mint, write and append run as processes against an
embedded stack of this test's own; MinIO and then Kafka are `kill -9`ed, stay away for a while
and are started again by `Stack.up` on the addresses they had. No service exits, each one's
`/readyz` goes unready within its bound during the outage and ready after, and the shard
converges to the view."""

from __future__ import annotations

import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sinkkit import Service, Sink, Upstream, converged, start, wait_until

from mvsink.config import S3Settings, Secret, cache_dir
from mvsink.s3 import ensure_bucket, s3_client
from mvsink.stack.manager import Stack
from mvsink.stack.procs import free_ports
from mvsink.stack.state import load_records

pytestmark = pytest.mark.integration

READY_BOUND = 10.0
OUTAGE = 20.0
SERVICES = ("mint", "write", "append")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """An embedded stack of this test alone (its components get killed)."""
    own = Stack(tmp_path / "stack", cache_dir(), print)
    try:
        yield own
    finally:
        own.down()


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


def kill_component(stack: Stack, name: str) -> str:
    """`kill -9` a stack component; the address it served."""
    record = load_records(stack.home)[name]
    assert record.pid is not None
    os.kill(record.pid, signal.SIGKILL)
    wait_until(lambda: not load_records(stack.home)[name].alive, 30, f"{name} to die")
    return record.address


def test_services_ride_through_minio_and_kafka_outages(stack: Stack, tmp_path: Path) -> None:
    endpoints = stack.up(timeout=180)
    s3 = S3Settings(endpoints.s3_endpoint, "outages", "us-east-1",
                    Secret(endpoints.s3_access_key), Secret(endpoints.s3_secret_key), False)  # fmt: skip
    ensure_bucket(s3_client(s3), s3.bucket)
    sink = Sink.create(endpoints.kafka_bootstrap, s3, tmp_path / "logs")
    ports = dict(zip(SERVICES, free_ports(len(SERVICES)), strict=True))
    procs: list[Service] = []
    running = {name: start(procs, sink, name, MVSINK_METRICS_PORT=str(ports[name]),
                           MVSINK_READY_BOUND=str(READY_BOUND), MVSINK_LOG_LEVEL="INFO")
               for name in SERVICES}  # fmt: skip
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
            print(f"{component}: down {recovered - went:.0f}s; converged {converged_s:.1f}s after "
                  f"it was back")  # fmt: skip
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

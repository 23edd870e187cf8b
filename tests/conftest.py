"""Session fixtures for the real services: Kafka, S3 (MinIO) and Spark.

Where they come from, first match wins:

1. environment: `MVSINK_TEST_KAFKA_BOOTSTRAP` and `MVSINK_TEST_S3_ENDPOINT` (+
   `MVSINK_TEST_S3_ACCESS_KEY`, `MVSINK_TEST_S3_SECRET_KEY`) point at running services;
2. testcontainers, when a Docker engine answers: the project's own Kafka and MinIO images, the
   ones `docker-compose.yaml` builds (built first if missing; nothing is pulled), configured
   with that file's Kafka settings and published on free loopback ports;
3. the embedded stack (`mvsink.stack`), started in a fresh temporary home with its own free
   ports, using the shared download/build cache.

`MVSINK_TEST_SERVICES=containers` (or `embedded`) insists on one of the last two: with
`containers` and no Docker engine the session fails rather than fall back.

A component that cannot start fails the session with its log tail. Nothing is ever skipped.
Pure tests request none of these fixtures and start nothing.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import settings

from mvsink.io.config import REPO_ROOT, S3Settings, Secret, cache_dir, state_dir
from mvsink.io.s3 import ensure_bucket, s3_client

#: Hypothesis' per-example deadline is a timed assertion, and the suite's processes share two
#: cores with the examples: a slow example is a slow machine, not a defect.
settings.register_profile("mvsink", deadline=None)
settings.load_profile("mvsink")

#: The suite's Spark drivers live seconds to minutes: C1 only (`[spark] driver_java_options`),
#: about half the JVM's CPU of each start on a box whose two cores the suite keeps busy. The
#: processes the suite starts inherit it (`sinkkit.clean_env`); set the variable to run with C2.
#: C1 alone reserves a 48 MiB code cache, which a driver running Delta's MERGE fills: the JVM then
#: stops compiling (and says so on stdout), so the tiered default's 240 MiB is kept.
os.environ.setdefault(
    "MVSINK_SPARK_DRIVER_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
)

COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yaml").read_text())["services"]
#: The images `docker-compose.yaml` builds for Kafka and MinIO (`docker/kafka`, `docker/minio`).
KAFKA_IMAGE, MINIO_IMAGE = COMPOSE["kafka"]["image"], COMPOSE["minio"]["image"]
#: Label of the test containers: the pid of the session that started them.
ORPHAN_LABEL = "mvsink.test.session-pid"


@dataclass(frozen=True)
class Services:
    """Addresses of the real services under test."""

    kafka_bootstrap: str
    s3: S3Settings
    origin: str


def _say(message: str) -> None:
    print(f"[fixtures] {message}", file=sys.stderr, flush=True)


def _s3_settings(endpoint: str, access_key: str, secret_key: str) -> S3Settings:
    endpoint = endpoint.replace("localhost", "127.0.0.1")
    return S3Settings(
        endpoint,
        f"test-{uuid.uuid4().hex[:10]}",
        "us-east-1",
        Secret(access_key),
        Secret(secret_key),
        secure=False,
    )


def _from_env() -> Services | None:
    bootstrap = os.environ.get("MVSINK_TEST_KAFKA_BOOTSTRAP")
    endpoint = os.environ.get("MVSINK_TEST_S3_ENDPOINT")
    if not (bootstrap and endpoint):
        return None
    s3 = _s3_settings(
        endpoint, os.environ["MVSINK_TEST_S3_ACCESS_KEY"], os.environ["MVSINK_TEST_S3_SECRET_KEY"]
    )
    return Services(bootstrap, s3, "environment")


def _kafka_environment(host_port: int) -> dict[str, str]:
    """The compose file's Kafka settings, its host listener advertised on `host_port` and its
    own listener on `localhost` (a lone container has no `kafka` host name: the broker's
    transaction manager talks to itself through that listener)."""
    return {
        k: str(v)
        .replace("${MVSINK_KAFKA_HOST_PORT:-19092}", str(host_port))
        .replace("PLAINTEXT://kafka:9092", "PLAINTEXT://localhost:9092")
        for k, v in COMPOSE["kafka"]["environment"].items()
    }


def _from_containers(stack: list[Any]) -> Services:
    # No Ryuk: the reaper is an image from a registry (nothing is pulled here); the fixture
    # stops its containers itself.
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    from testcontainers.core.container import DockerContainer

    from mvsink.stack.kafka import kafka_ready
    from mvsink.stack.minio import minio_ready
    from mvsink.stack.procs import filling, free_ports
    from mvsink.tools.compose.engine import ensure_images, image_exists

    with filling(state_dir() / "compose" / "test-images"):  # the suite's workers build once
        missing = [s for s in ("kafka", "minio") if not image_exists(COMPOSE[s]["image"])]
        if missing:
            ensure_images(missing, state_dir() / "compose", cache_dir(), _say)
    _remove_orphans()
    labels = {ORPHAN_LABEL: str(os.getpid())}
    kafka_port, minio_port = free_ports(2)
    access_key, secret_key = f"test{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    kafka = _on_loopback(DockerContainer(KAFKA_IMAGE, labels=labels), 19092, kafka_port)
    for name, value in _kafka_environment(kafka_port).items():
        kafka = kafka.with_env(name, value)
    minio = (
        _on_loopback(DockerContainer(MINIO_IMAGE, labels=labels), 9000, minio_port)
        .with_env("MINIO_ROOT_USER", access_key)
        .with_env("MINIO_ROOT_PASSWORD", secret_key)
    )
    for container in (kafka, minio):
        stack.append(container)  # stopped by the fixture even if its start fails half-way
        container.start()
    bootstrap, endpoint = f"127.0.0.1:{kafka_port}", f"127.0.0.1:{minio_port}"
    for what, ready, container in (
        ("Kafka", lambda: kafka_ready(bootstrap), kafka),
        ("MinIO", lambda: minio_ready(endpoint), minio),
    ):
        deadline = time.monotonic() + 120
        while not _answers(ready):
            if time.monotonic() > deadline:
                logs = b"".join(container.get_logs()).decode(errors="replace")[-3000:]
                raise RuntimeError(f"{what} container not ready after 120s:\n{logs}")
            time.sleep(0.5)
    return Services(bootstrap, _s3_settings(endpoint, access_key, secret_key), "testcontainers")


def _remove_orphans() -> None:
    """Remove the containers of test sessions that died without stopping theirs (no Ryuk)."""
    import docker
    from mvsink.stack.procs import pid_alive

    client = docker.from_env()
    for container in client.containers.list(all=True, filters={"label": ORPHAN_LABEL}):
        if not pid_alive(int(container.labels.get(ORPHAN_LABEL, "0"))):
            _say(f"removing {container.name}, left by a test session that died")
            container.remove(force=True, v=True)


def _on_loopback(container: Any, port: int, host_port: int) -> Any:
    """`container` with `port` published on 127.0.0.1:`host_port` only (`with_bind_ports`
    would publish on every interface)."""
    container.ports[f"{port}/tcp"] = ("127.0.0.1", host_port)  # docker-py's (ip, port) form
    return container


def _answers(ready: Any) -> bool:
    try:
        return bool(ready())
    except Exception:
        return False


def _from_embedded(home: Path, stack: list[Any]) -> Services:
    from mvsink.stack.manager import Stack

    embedded = Stack(home, cache_dir(), _say)
    stack.append(embedded)
    endpoints = embedded.up(timeout=180)
    s3 = _s3_settings(endpoints.s3_endpoint, endpoints.s3_access_key, endpoints.s3_secret_key)
    return Services(endpoints.kafka_bootstrap, s3, "embedded")


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """Real Kafka and S3 for the whole session (see module docs for where they come from)."""
    started: list[Any] = []
    try:
        from mvsink.tools.compose.engine import docker_answers

        choice = os.environ.get("MVSINK_TEST_SERVICES", "auto")
        if choice not in ("auto", "containers", "embedded"):
            raise ValueError(f"MVSINK_TEST_SERVICES={choice!r}: auto, containers or embedded")
        found = _from_env()
        if found is None and choice == "containers" and not docker_answers():
            raise RuntimeError(
                "MVSINK_TEST_SERVICES=containers but no Docker engine answers "
                "(`./run compose-test` provides one)"
            )
        if found is None and choice != "embedded" and docker_answers():
            found = _from_containers(started)
        if found is None:
            found = _from_embedded(tmp_path_factory.mktemp("stack"), started)
        _say(f"services from {found.origin}: kafka {found.kafka_bootstrap}, s3 {found.s3.endpoint}")
        ensure_bucket(s3_client(found.s3), found.s3.bucket)
        yield found
    finally:
        for thing in reversed(started):  # an embedded Stack has down(), a container stop()
            stop = getattr(thing, "down", None) or thing.stop
            stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(services: Services) -> str:
    """`bootstrap.servers` of a real Kafka broker."""
    return services.kafka_bootstrap


@pytest.fixture(scope="session")
def s3_settings(services: Services) -> S3Settings:
    """A real S3 endpoint with credentials and a bucket of this session."""
    return services.s3


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession on 2 threads that retries a failed task up to 4 times, as a
    cluster does (`local[*]` would fail the job at the first task failure), UI off. Spark's
    class archive is built first where `./run setup` has not (`mvsink.io.spark_classes`):
    every driver the suite starts after it maps it."""
    from mvsink.io import spark_classes
    from mvsink.io.spark import spark_session

    spark_classes.build(cache_dir(), _say)

    session = spark_session("mvsink-tests", "local[2,4]", shuffle_partitions=4)
    yield session
    session.stop()


@pytest.fixture
def unique() -> str:
    """A short unique id for names (topics, sinks, keys) of one test."""
    return uuid.uuid4().hex[:10]

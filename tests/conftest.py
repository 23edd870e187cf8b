"""Session fixtures for the real services: Kafka, S3 (MinIO) and Spark.

Where they come from, first match wins:

1. environment: `MVSINK_TEST_KAFKA_BOOTSTRAP` and `MVSINK_TEST_S3_ENDPOINT` (+
   `MVSINK_TEST_S3_ACCESS_KEY`, `MVSINK_TEST_S3_SECRET_KEY`) point at running services;
2. testcontainers, when a Docker engine answers;
3. the embedded stack (`mvsink.stack`), started in a fresh temporary home with its own free
   ports, using the shared download/build cache.

A component that cannot start fails the session with its log tail. Nothing is ever skipped.
Pure tests request none of these fixtures and start nothing.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mvsink.config import S3Settings, Secret, cache_dir
from mvsink.s3 import ensure_bucket, s3_client

MINIO_IMAGE = "minio/minio:RELEASE.2025-10-15T17-29-55Z"
KAFKA_IMAGE = "apache/kafka:4.1.1"


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
    return S3Settings(endpoint, f"test-{uuid.uuid4().hex[:10]}", "us-east-1",
                      Secret(access_key), Secret(secret_key), secure=False)  # fmt: skip


def _docker_engine_reachable() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:
        return False
    return True


def _from_env() -> Services | None:
    bootstrap = os.environ.get("MVSINK_TEST_KAFKA_BOOTSTRAP")
    endpoint = os.environ.get("MVSINK_TEST_S3_ENDPOINT")
    if not (bootstrap and endpoint):
        return None
    s3 = _s3_settings(endpoint, os.environ["MVSINK_TEST_S3_ACCESS_KEY"],
                      os.environ["MVSINK_TEST_S3_SECRET_KEY"])  # fmt: skip
    return Services(bootstrap, s3, "environment")


def _from_containers(stack: list[Any]) -> Services:
    from testcontainers.kafka import KafkaContainer
    from testcontainers.minio import MinioContainer

    kafka = KafkaContainer(KAFKA_IMAGE).with_env("KAFKA_LOG_CLEANER_BACKOFF_MS", "1000")
    minio = MinioContainer(MINIO_IMAGE)
    for container in (kafka, minio):
        container.start()
        stack.append(container)
    config = minio.get_config()
    s3 = _s3_settings(config["endpoint"], config["access_key"], config["secret_key"])
    bootstrap = kafka.get_bootstrap_server().replace("localhost", "127.0.0.1")
    return Services(bootstrap, s3, "testcontainers")


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
        found = _from_env()
        if found is None and _docker_engine_reachable():
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
    """A `local[*]` SparkSession, UI off."""
    from mvsink.spark import spark_session

    session = spark_session("mvsink-tests", shuffle_partitions=4)
    yield session
    session.stop()


@pytest.fixture
def unique() -> str:
    """A short unique id for names (topics, sinks, keys) of one test."""
    return uuid.uuid4().hex[:10]

"""Fixtures shared by the integration tests that run sink services as processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sinkkit import Service, Sink

from mvsink.io.config import S3Settings


@pytest.fixture
def sink(kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path) -> Sink:
    """A freshly provisioned sink (topics + shard) with a unique id."""
    return Sink.create(kafka_bootstrap, s3_settings, tmp_path)


@pytest.fixture
def procs() -> Iterator[list[Service]]:
    """Processes started by a test; stopped afterwards, with the tail of each log printed (shown
    by pytest when the test fails)."""
    started: list[Service] = []
    yield started
    for service in started:
        service.stop()
        print(f"--- {service.log.name} ---\n{service.text()[-4000:]}")

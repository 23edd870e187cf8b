"""Fixtures shared by the integration tests that run sink services as processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sinkkit import Hosted, Service, Sink

from mvsink.io.config import S3Settings


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("bounds", "the state-log bounds soak (test_state_bounds)")
    group.addoption(
        "--bounds-seconds",
        type=float,
        default=None,
        help="seconds of ticks, one a second (default: a fixed budget for ./run test)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A bounds soak longer than the budget gets its length and 10 minutes as its timeout."""
    seconds = config.getoption("--bounds-seconds", default=None)
    if seconds:
        for item in items:
            if item.name.startswith("test_a_standby_and_a_sink_without_compaction"):
                item.add_marker(pytest.mark.timeout(max(600, seconds + 600)))


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


@pytest.fixture(scope="session")
def hosted(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hosted]:
    """The session's shared deployment (`Hosted`), started on first use."""
    import uuid

    tag = uuid.uuid4().hex[:6]
    deployment = Hosted(
        kafka_bootstrap, s3_settings, f"hosted-{tag}.sinks", f"hosted-{tag}.frontiers"
    )
    deployment.start(tmp_path_factory.mktemp("hosted"))
    try:
        yield deployment
    finally:
        deployment.stop()


@pytest.fixture
def hosted_sinks(hosted: Hosted, tmp_path: Path) -> Iterator[Callable[..., Sink]]:
    """Makes sinks served by the session's shared deployment (`Hosted.sink`'s settings); each is
    dropped at the test's end (its units stop) and the deployment's lines of it printed (shown
    when the test fails). No sink's test may make a shared service exit."""
    from mvsink.io.sinks import drop

    made: list[Sink] = []

    def make(**settings: int) -> Sink:
        made.append(hosted.sink(tmp_path / f"s{len(made)}", **settings))
        return made[-1]

    yield make
    for sink in made:
        drop(sink.config)
        for name in hosted.services:
            lines = hosted.text(name, sink)[-4000:]
            print(f"--- hosted {name} [{sink.config.sink_id}] ---\n{lines}")
    assert hosted.exited() == {}, hosted.exited()


@pytest.fixture(scope="session")
def schema_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Confluent-compatible API of a real Schema Registry for the whole session:
    `MVSINK_TEST_SCHEMA_REGISTRY_URL` if set, else the embedded stack's (Apicurio,
    `mvsink.stack.registry`) alone in a fresh home, fetched into the shared cache on first use.
    Its storage is in memory and shared by the session's tests: each uses subjects of its own."""
    import os
    import sys

    from mvsink.io.config import cache_dir
    from mvsink.stack.manager import Stack

    url = os.environ.get("MVSINK_TEST_SCHEMA_REGISTRY_URL")
    if url:
        yield url
        return

    def say(message: str) -> None:
        print(f"[fixtures] {message}", file=sys.stderr, flush=True)

    stack = Stack(tmp_path_factory.mktemp("registry"), cache_dir(), say)
    try:
        yield stack.registry_up(timeout=180)
    finally:
        stack.down()

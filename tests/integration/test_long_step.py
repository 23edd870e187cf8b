"""A write step longer than the replica's poll bound (`[kafka] max_poll_interval`). The driver
polls its group between steps, so a step that outlasts the bound loses the replica's partitions
(librdkafka's 300 s default would do that to every large hydration or repair, again and again;
the setting's default is librdkafka's most, 24 h). The step is held by stopping the driver's
Spark Python workers (SIGSTOP): the driver, its Kafka heartbeat and its lease keeper run on,
only the step waits. The bound is 12 s here: a step held 5 s keeps its partitions, one held
20 s loses them, the next poll takes them back, and the sink converges either way."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest
from sinkkit import Service, Sink, Upstream, converged, start, wait_until

from mvsink.bench.rss import tree
from mvsink.core.settings import S3Settings

pytestmark = pytest.mark.integration
BOUND = 12.0
REVOKED = "desired partitions revoked"


def spark_workers(service: Service) -> list[int]:
    """The service's Spark Python workers: every process under its driver JVM."""
    assert service.proc is not None
    jvms = [
        pid
        for pid in tree(service.proc.pid)
        if b"java" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    ]
    assert len(jvms) == 1, jvms
    workers = [pid for pid in tree(jvms[0]) if pid != jvms[0]]
    assert workers, "the driver JVM has no Python workers"
    return workers


def revocations_past(write: Service, count: int) -> bool:
    """Whether the write service logged more revocations than `count`."""
    return write.text().count(REVOKED) > count


@contextmanager
def held(service: Service) -> Iterator[None]:
    """The service's Spark Python workers stopped (SIGSTOP) for the block, then resumed."""
    workers = spark_workers(service)
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)


def test_a_step_keeps_its_partitions_within_the_poll_bound_and_loses_them_past_it(
    kafka_bootstrap: str, s3_settings: S3Settings, tmp_path: Path, procs: list[Service]
) -> None:
    sink = Sink.create(kafka_bootstrap, s3_settings, tmp_path)
    bound = {"MVSINK_KAFKA_MAX_POLL_INTERVAL": str(BOUND)}
    services = [start(procs, sink, name, **bound) for name in ("mint", "write", "append")]
    write, upstream = services[1], Upstream(sink)
    upstream.tick()
    wait_until(lambda: converged(sink, upstream), 180, "the first tick")
    for pause, lost in ((5.0, False), (20.0, True)):
        revoked = write.text().count(REVOKED)
        upper = sink.shard.upper()
        with held(write):
            upstream.tick()  # its step starts and waits on the stopped workers
            time.sleep(pause)
            assert sink.shard.upper() == upper, "the step did not wait on the workers"
        wait_until(lambda: converged(sink, upstream), 120, f"convergence after {pause:g}s")
        if lost:  # the rejoin is a poll after the step: give it the loop's next turns
            wait_until(partial(revocations_past, write, revoked), 30, "the partitions lost")
        else:
            assert not revocations_past(write, revoked), f"a {pause:g}s step lost them"
    assert "max.poll.interval.ms" in write.text() or "maximum poll interval" in write.text()
    upstream.tick()
    wait_until(lambda: converged(sink, upstream), 120, "convergence after both")
    for service in services:
        assert service.stop() == 0

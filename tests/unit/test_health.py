"""`mvsink.io.health`: which errors are transient, the backoff's bounds, and liveness/readiness
verdicts as dependencies go away and come back and the frontier stalls."""

from __future__ import annotations

import errno
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from minio.error import S3Error
from urllib3.exceptions import MaxRetryError, NewConnectionError

from mvsink.core.errors import ConfigError, ContractError, MvsinkError
from mvsink.io import health
from mvsink.io.health import Backoff, Health, StartAgain, transient
from mvsink.io.s3 import IndefiniteWrite, S3RequestError
from mvsink.io.service import Stopping


class Py4JJavaError(Exception):
    """Stands in for py4j's error of a failed Spark job (judged by its name and text)."""


def _s3_error(code: str) -> S3Error:
    return S3Error(None, code, "message", "resource", "request", "host")  # type: ignore[arg-type]


def _wrapped(cause: BaseException) -> MvsinkError:
    try:
        raise cause
    except BaseException as error:
        try:
            raise MvsinkError("listing checkpoints") from error
        except MvsinkError as outer:
            return outer


def _caused(error: BaseException, code: int) -> BaseException:
    """`error` raised from a fatal `KafkaException` of `code`."""
    error.__cause__ = KafkaException(KafkaError(code, fatal=True))
    return error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (MaxRetryError(None, "/b", NewConnectionError(None, "refused")), True),  # type: ignore[arg-type]
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), True),
        (OSError(errno.ECONNRESET, "reset"), True),
        (TimeoutError("timed out"), True),
        (IndefiniteWrite("PUT timed out"), True),
        (S3RequestError("PUT answered 503", 503), True),
        (S3RequestError("PUT answered 403", 403), False),
        (_s3_error("ServiceUnavailable"), True),
        (_s3_error("XMinioServerNotInitialized"), True),
        (_s3_error("NoSuchBucket"), False),
        (_s3_error("AccessDenied"), False),
        (KafkaException(KafkaError(KafkaError._TRANSPORT)), True),
        (KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN)), True),
        (KafkaException(KafkaError(KafkaError._TIMED_OUT)), True),
        (KafkaException(KafkaError(KafkaError._DESTROY_BROKER)), True),
        (KafkaException(KafkaError(KafkaError._FENCED, fatal=True)), False),
        # a producer lost for good but not fenced: the body starts again with a new one
        (_caused(StartAgain("new producer"), KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER), True),
        (KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)), False),
        (_wrapped(ConnectionRefusedError(errno.ECONNREFUSED, "refused")), True),
        (_wrapped(ValueError("bad")), False),
        (ConfigError("kafka bootstrap servers not set"), False),
        (ContractError("descs has 2 partitions"), False),
        (MvsinkError("an invariant broke"), False),
        (ValueError("a bug"), False),
        (Py4JJavaError("Job aborted ... urllib3.exceptions.MaxRetryError: ... refused"), True),
        (
            Py4JJavaError(
                "Job aborted ... mvsink.core.errors.ContractError: MaxRetryError in text"
            ),
            False,
        ),
        (Py4JJavaError("Job aborted ... ZeroDivisionError"), False),
    ],
)
def test_transient(error: BaseException, expected: bool) -> None:
    assert transient(error) is expected


def test_backoff_grows_to_its_cap_with_jitter_and_resets() -> None:
    backoff = Backoff(base=0.5, cap=8.0)
    waits = [backoff.next() for _ in range(12)]
    for n, wait in enumerate(waits):
        assert 0 <= wait <= min(8.0, 0.5 * 2**n)
    assert max(waits[6:]) <= 8.0 and len(set(waits)) > 1
    backoff.reset()
    assert backoff.next() <= 0.5


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(health.time, "monotonic", fake)
    return fake


def test_readiness_follows_the_dependencies(clock: Clock) -> None:
    up = {"kafka": True, "s3": True}

    def probe(name: str) -> Any:
        def call() -> None:
            if not up[name]:
                raise ConnectionRefusedError(errno.ECONNREFUSED, f"{name} refused")

        return call

    h = Health("mint", live_bound=60, ready_bound=10, probes={n: probe(n) for n in up})
    h.probe_once()
    assert h.readiness()[0]
    up["s3"] = False
    clock.now += 2
    h.probe_once()
    ready, why = h.readiness()
    assert not ready and "s3 unreachable" in why and "refused" in why
    up["s3"] = True
    clock.now += 2
    h.probe_once()
    assert h.readiness() == (True, "ready: Kafka and S3 answer; frontier None")


def test_an_outage_lasts_until_the_probes_answer_and_the_loop_runs(clock: Clock) -> None:
    up = {"on": False}

    def kafka() -> None:
        if not up["on"]:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    h = Health("write", live_bound=60, ready_bound=10, probes={"kafka": kafka})
    h.failed(KafkaException(KafkaError(KafkaError._TRANSPORT)))
    h.probe_once()
    assert "riding through an outage" in h.readiness()[1]
    up["on"] = True
    clock.now += 2
    h.beat()
    h.probe_once()
    assert h.readiness()[0], h.readiness()[1]


def test_a_frontier_behind_its_target_and_unmoved_makes_it_unready(clock: Clock) -> None:
    h = Health("append", live_bound=60, ready_bound=10)
    h.report(5, 5)  # caught up: no work
    clock.now += 100
    h.beat()
    assert h.readiness()[0]
    h.report(5, 7)  # work arrives
    clock.now += 9
    h.beat()
    assert h.readiness()[0]
    clock.now += 2
    h.beat()
    ready, why = h.readiness()
    assert not ready and "frontier 5 behind its target 7" in why
    h.report(6, 7)  # it moved
    assert h.readiness()[0]


def test_liveness_fails_when_the_loop_is_silent(clock: Clock) -> None:
    h = Health("mint", live_bound=30, ready_bound=10)
    h.beat()
    clock.now += 29
    assert h.liveness()[0]
    clock.now += 2
    live, why = h.liveness()
    assert not live and "not checked in for 31s" in why
    assert not h.readiness()[0]


def test_a_blocked_service_is_unready_with_the_reason_until_unblocked(clock: Clock) -> None:
    """A condition only an operator can clear (desired records a write task needs were
    deleted) keeps the service unready, saying why, however well the rest goes."""
    h = Health("write", live_bound=60, ready_bound=10)
    h.report(5, 5)
    h.blocked("desired partition 0: records from offset 0 are needed but deleted below 13")
    clock.now += 1
    h.beat()
    ready, why = h.readiness()
    assert not ready and "deleted below 13" in why
    assert h.liveness()[0]  # blocked is not dead: a restart would not help
    h.blocked(None)
    assert h.readiness()[0]


def test_a_hosted_sink_stuck_or_silent_is_named_and_the_service_stays_ready(clock: Clock) -> None:
    """A host's units report as their sinks: a stuck one, a blocked one and one whose loop went
    silent are each named by `/readyz`, which stays 200 for the others; a sink let go is
    forgotten."""
    h = Health("mint", live_bound=60, ready_bound=10)
    service, units = Stopping(h), {}
    for sink in ("a", "b", "c", "d"):
        units[sink] = service.unit(sink)
        units[sink].report(5, 7)
    clock.now += 11
    units["a"].report(6, 7)  # moved
    assert not units["b"].stopped  # beats, unmoved
    units["c"].blocked("its topics disagree")
    units["c"].report(6, 6)
    clock.now += 50  # d's loop is now silent for 61 s
    for sink in ("a", "b", "c"):
        units[sink].report(*((6, 6) if sink != "b" else (5, 7)))
    ready, why = h.readiness()
    assert ready, why
    assert "a:" not in why
    assert "b: frontier 5 behind its target 7" in why
    assert "c: its topics disagree" in why
    assert "its loop has not checked in for 61s" in why.split("d: ")[1]
    assert h.sinks_ready() == {"a": True, "b": False, "c": False, "d": False}
    service.release(units["d"])
    assert "d:" not in h.readiness()[1]
    service.set()
    assert all(units[sink].stopped for sink in "abc")  # a service's stop stops its units

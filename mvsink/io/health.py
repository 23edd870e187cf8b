"""Riding through outages, and health that tells the truth.

```
 run_service ── body(config, stopping) ──raises──> transient(error)? ── yes: Outage.failed
      ^                                                  │ no: exit 2 (MvsinkError) or 1
      └──── after Backoff.next() (capped, jittered) ─────┘

 Health: probes Kafka and S3 every PROBE_INTERVAL on its own thread; the body reports its
 frontier and target (`report`) and beats (every `Stopping.stopped` check)
   /healthz  live:  the body's loop checked in within `live_bound` (or is backing off)
   /readyz   ready: the last probes of Kafka and S3 answered, no outage is being ridden
                    through, the frontier moved within `ready_bound` whenever it was
                    behind its target, and nothing blocks the work until an operator acts
                    (`blocked`: e.g. desired records a write task needs were deleted)
```

An unavailable Kafka or S3 is transient: the service never exits for it. The body is started
again from what Kafka and S3 hold (the path every restart takes, so no state of the failed run is
trusted), after a capped exponential backoff with full jitter. An outage is logged once when it
starts and once when it ends (a probe of each dependency answering again, and the body running),
never per retry. What no retry can fix still stops the service: a configuration or contract
error (exit 2), or an error nobody classified as transient (exit 1, with its traceback). A
client whose own state is lost for good (`StartAgain`: a transactional producer's fatal error
that is not a fencing) is transient too: the body starts again with new clients.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import Gauge

if TYPE_CHECKING:
    from mvsink.io.config import Config

log = logging.getLogger("mvsink.io.health")

#: Seconds between probes of Kafka and S3, and each probe's timeout.
PROBE_INTERVAL, PROBE_TIMEOUT = 2.0, 2.0

SINCE_OK = Gauge(
    "mvsink_dependency_seconds_since_ok",
    "Seconds since the last successful call to a dependency",
    ["service", "dependency"],
)
SINCE_MOVED = Gauge(
    "mvsink_frontier_seconds_since_moved",
    "Seconds since the service's frontier last moved",
    ["service"],
)
READY = Gauge("mvsink_ready", "1 when the service is ready (see /readyz)", ["service"])
OUTAGE = Gauge("mvsink_outage", "1 while the service rides through an outage", ["service"])
SINK_READY = Gauge(
    "mvsink_sink_ready",
    "1 when a sink a host serves is ready (its frontier moves when behind, its loop runs)",
    ["service", "sink"],
)

#: librdkafka error names that mean "the cluster is not reachable right now".
_KAFKA_TRANSIENT = {
    "_TRANSPORT",
    "_ALL_BROKERS_DOWN",
    "_TIMED_OUT",
    "_MSG_TIMED_OUT",
    "_RESOLVE",
    "REQUEST_TIMED_OUT",
    "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION",
    "NOT_ENOUGH_REPLICAS",
    "_WAIT_COORD",
    "BROKER_NOT_AVAILABLE",
    "NETWORK_EXCEPTION",
    # a request waited on a broker handle librdkafka replaced (after a restart,
    # the bootstrap handle gives way to the learned broker)
    "_DESTROY_BROKER",
}
#: S3 error codes of a server that is there but not serving.
_S3_TRANSIENT = {
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "XMinioServerNotInitialized",
    "XMinioStorageFull",
}
#: What a failed Spark job's text holds when its task failed on an unreachable Kafka or S3.
_SPARK_TRANSIENT = (
    "MaxRetryError",
    "NewConnectionError",
    "ProtocolError",
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ConnectionRefusedError",
    "Connection refused",
    "IndefiniteWrite",
    "S3RequestError",
    "KafkaException",
    "_TRANSPORT",
    "_ALL_BROKERS_DOWN",
    "_TIMED_OUT",
)
_SPARK_FATAL = ("ConfigError", "ContractError", "FrontierError", "InvalidUsage", "DecodeError")


class StartAgain(Exception):
    """The body's clients are unusable for good, by no fault of the configuration (e.g. a
    transactional producer's fatal error that is not a fencing, `mvsink.io.kafka.is_fencing`):
    start the body again, which makes new ones (`transient`)."""


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def transient(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is an unreachable or unavailable Kafka or S3: worth
    retrying, never worth exiting for. Contract and configuration errors never are."""
    from confluent_kafka import KafkaError, KafkaException
    from minio.error import S3Error
    from urllib3.exceptions import HTTPError

    from mvsink.core.errors import ConfigError, ContractError, FrontierError, InvalidUsage
    from mvsink.io.s3 import IndefiniteWrite, S3RequestError

    for cause in _chain(error):
        if isinstance(cause, StartAgain):
            return True
        if isinstance(cause, ConfigError | ContractError | FrontierError | InvalidUsage):
            return False
        if isinstance(cause, HTTPError | ConnectionError | TimeoutError | IndefiniteWrite):
            return True
        if isinstance(cause, S3RequestError):
            return cause.status >= 500  # the server is unwell; a 4xx is ours to fix
        if isinstance(cause, S3Error) and cause.code in _S3_TRANSIENT:
            return True
        if isinstance(cause, OSError) and cause.errno in (
            errno.ECONNREFUSED,
            errno.ECONNRESET,
            errno.EHOSTUNREACH,
            errno.ETIMEDOUT,
        ):
            return True
        if isinstance(cause, KafkaException) and cause.args:
            kafka_error = cause.args[0]
            if isinstance(kafka_error, KafkaError):
                if kafka_error.fatal():
                    return False
                if kafka_error.retriable() or kafka_error.txn_requires_abort():
                    return True
                if kafka_error.name() in _KAFKA_TRANSIENT:
                    return True
        if type(cause).__name__ == "Py4JJavaError":  # a failed Spark job: judge by its tasks
            text = str(cause)
            if any(marker in text for marker in _SPARK_FATAL):
                return False
            return any(marker in text for marker in _SPARK_TRANSIENT)
    return False


def _describe(error: BaseException) -> str:
    """One short line: the error's type and the first line of its text."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


@dataclass
class Backoff:
    """Capped exponential backoff with full jitter (AWS's "full jitter"): the n-th wait is
    uniform in `[0, min(cap, base * 2^n)]`."""

    base: float = 0.5
    cap: float = 30.0
    attempt: int = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.base * 2**self.attempt)
        self.attempt += 1
        return random.uniform(0, ceiling)

    def reset(self) -> None:
        self.attempt = 0


class FrontierProgress:
    """A frontier's progress towards its target: the process's, or one hosted sink's."""

    def __init__(self, now: float) -> None:
        self.frontier: int | None = None
        self.target: int | None = None
        self.moved = now
        self.behind_since: float | None = None
        self.beat = now
        #: A condition that stops the work until an operator acts (`Health.blocked`).
        self.blocked: str | None = None

    def report(self, frontier: int | None, target: int | None, now: float) -> None:
        if frontier != self.frontier:
            self.frontier, self.moved = frontier, now
        self.target = target
        self.beat = now
        behind = target is not None and (frontier is not None and frontier < target)
        if not behind:
            self.behind_since = None
        elif self.behind_since is None:
            self.behind_since = now

    def unready(self, now: float, bound: float) -> str | None:
        """Why the work is not ready: blocked, or behind its target and unmoved past `bound`."""
        reasons = []
        if self.behind_since is not None:
            stuck = now - max(self.moved, self.behind_since)
            if stuck > bound:
                reasons.append(
                    f"frontier {self.frontier} behind its target {self.target} "
                    f"and unmoved for {stuck:.0f}s (bound {bound:.0f}s)"
                )
        if self.blocked is not None:
            reasons.append(self.blocked)
        return "; ".join(reasons) if reasons else None

    def described(self) -> str:
        return f"frontier {self.frontier}"


class Health:
    """Liveness and readiness of one service process (module docs). Thread-safe."""

    def __init__(
        self,
        service: str,
        live_bound: float,
        ready_bound: float,
        probes: dict[str, Callable[[], Any]] | None = None,
    ) -> None:
        self.service = service
        self.live_bound, self.ready_bound = live_bound, ready_bound
        self.probes = probes or {}
        now = time.monotonic()
        self._lock = threading.Lock()
        self._beat = now
        self._last_ok = dict.fromkeys(self.probes, now)
        self._down: dict[str, str] = {}
        self._outage: str | None = None
        self._outage_since = 0.0
        #: The process's own progress; a host's per sink (`report(..., sink=)`).
        self._progress = FrontierProgress(now)
        self._sinks: dict[str, FrontierProgress] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._probe_loop, name="health", daemon=True)
        OUTAGE.labels(service).set(0)
        READY.labels(service).set(0)

    # -- what the service tells ------------------------------------------------------------------

    def beat(self, sink: str | None = None) -> None:
        """The body's loop is running (`sink`: a host's unit of that sink, whose loop counts for
        the process too)."""
        now = time.monotonic()
        self._beat = now
        if sink is not None:
            with self._lock:
                self._of(sink, now).beat = now

    def report(self, frontier: int | None, target: int | None, sink: str | None = None) -> None:
        """The service's frontier (`None`: closed) and where it is heading (`None`: no work);
        `sink`: a host's unit of that sink (judged on its own: a stuck sink is named, the
        process stays ready)."""
        now = time.monotonic()
        with self._lock:
            progress = self._progress if sink is None else self._of(sink, now)
            progress.report(frontier, target, now)
        self._leave_outage_if_well()

    def blocked(self, reason: str | None, sink: str | None = None) -> None:
        """The service cannot do its work until an operator acts (`reason`), or can again
        (`None`); not ready meanwhile, with the reason (`sink`: only that sink is not)."""
        with self._lock:
            progress = self._progress if sink is None else self._of(sink, time.monotonic())
            progress.blocked = reason

    def forget(self, sink: str) -> None:
        """A host no longer serves `sink`."""
        with self._lock:
            self._sinks.pop(sink, None)
        with contextlib.suppress(KeyError):  # never exported
            SINK_READY.remove(self.service, sink)

    def _of(self, sink: str, now: float) -> FrontierProgress:
        progress = self._sinks.get(sink)
        if progress is None:
            progress = self._sinks[sink] = FrontierProgress(now)
        return progress

    def failed(self, error: BaseException) -> None:
        """The body stopped on a transient error; logged only when an outage starts."""
        with self._lock:
            entering = self._outage is None
            self._outage = _describe(error)
            if entering:
                self._outage_since = time.monotonic()
        if entering:
            log.warning(
                "%s: Kafka or S3 unavailable, retrying with backoff until it is back: %s",
                self.service,
                self._outage,
            )
        OUTAGE.labels(self.service).set(1)
        self.beat()

    # -- probes -----------------------------------------------------------------------------------

    def start(self) -> None:
        if self.probes:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _probe_loop(self) -> None:
        while not self._stop.is_set():
            self.probe_once()
            self._stop.wait(PROBE_INTERVAL)

    def probe_once(self) -> None:
        """Call every probe once; log a dependency going away and coming back."""
        for name, probe in self.probes.items():
            try:
                probe()
            except Exception as error:
                with self._lock:
                    went = name not in self._down
                    self._down[name] = _describe(error)
                if went:
                    log.warning("%s: %s unreachable: %s", self.service, name, self._down[name])
            else:
                with self._lock:
                    back = self._down.pop(name, None) is not None
                    self._last_ok[name] = time.monotonic()
                if back:
                    log.info("%s: %s reachable again", self.service, name)
        self._leave_outage_if_well()
        self.export()

    def _leave_outage_if_well(self) -> None:
        with self._lock:
            if (
                self._outage is None
                or self._down
                or time.monotonic() - self._beat > PROBE_INTERVAL * 3
            ):
                return
            took, self._outage = time.monotonic() - self._outage_since, None
        log.info(
            "%s: outage over after %.1fs: Kafka and S3 answer, the loop runs", self.service, took
        )
        OUTAGE.labels(self.service).set(0)

    # -- verdicts ---------------------------------------------------------------------------------

    def liveness(self) -> tuple[bool, str]:
        """Whether the loop runs (checked in within `live_bound`, or backing off)."""
        quiet = time.monotonic() - self._beat
        if quiet > self.live_bound:
            return (
                False,
                f"the loop has not checked in for {quiet:.0f}s (bound {self.live_bound:.0f}s)",
            )
        return True, f"the loop checked in {quiet:.1f}s ago"

    def readiness(self) -> tuple[bool, str]:
        """Whether the service can do its work now (module docs); the reason either way."""
        now = time.monotonic()
        with self._lock:
            reasons = [
                f"{name} unreachable for {now - self._last_ok[name]:.0f}s ({why})"
                for name, why in sorted(self._down.items())
            ]
            if self._outage is not None:
                reasons.append(
                    f"riding through an outage for {now - self._outage_since:.0f}s ({self._outage})"
                )
            own = self._progress.unready(now, self.ready_bound)
            if own is not None:
                reasons.append(own)
            stuck = self._stuck_sinks(now)
        live, why = self.liveness()
        if not live:
            reasons.append(why)
        named = f"; sinks not ready: {'; '.join(stuck)}" if stuck else ""
        if reasons:
            return False, "; ".join(reasons) + named
        return True, f"ready: Kafka and S3 answer; {self._progress.described()}{named}"

    def _stuck_sinks(self, now: float) -> list[str]:
        """Each served sink that is not ready, with why (under the lock)."""
        found = []
        for sink, progress in sorted(self._sinks.items()):
            reasons = [progress.unready(now, self.ready_bound)]
            if now - progress.beat > self.live_bound:
                reasons.append(f"its loop has not checked in for {now - progress.beat:.0f}s")
            if any(reasons):
                found.append(f"{sink}: {'; '.join(r for r in reasons if r)}")
        return found

    def sinks_ready(self) -> dict[str, bool]:
        """Each served sink: whether it is ready (`readiness` names those that are not)."""
        now = time.monotonic()
        with self._lock:
            stuck = {line.split(":", 1)[0] for line in self._stuck_sinks(now)}
            return {sink: sink not in stuck for sink in self._sinks}

    def export(self) -> None:
        """The gauges."""
        now = time.monotonic()
        for name, at in list(self._last_ok.items()):
            SINCE_OK.labels(self.service, name).set(now - at)
        SINCE_MOVED.labels(self.service).set(now - self._progress.moved)
        READY.labels(self.service).set(1 if self.readiness()[0] else 0)
        for sink, ready in self.sinks_ready().items():
            SINK_READY.labels(self.service, sink).set(1 if ready else 0)


def dependency_probes(config: Config) -> dict[str, Callable[[], Any]]:
    """A cheap call to each dependency, failing within `PROBE_TIMEOUT` when it is away or
    stalled: Kafka's metadata, and the S3 bucket's existence (no retries of its own)."""
    import urllib3
    from confluent_kafka.admin import AdminClient

    from mvsink.io.kafka import client_config
    from mvsink.io.s3 import s3_client

    admin = AdminClient(client_config(config.kafka_bootstrap, **{"socket.timeout.ms": 2000}))
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=PROBE_TIMEOUT, read=PROBE_TIMEOUT), retries=False
    )
    s3 = s3_client(config.s3, http)
    return {
        "kafka": lambda: admin.list_topics(timeout=PROBE_TIMEOUT),
        "s3": lambda: s3.bucket_exists(config.s3.bucket),
    }

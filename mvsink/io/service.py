"""What every service process shares: logging with frontiers, graceful shutdown on SIGTERM,
the metrics and health endpoint (`/metrics`, `/healthz`, `/readyz`), riding through Kafka and S3
outages (`mvsink.io.health`), and one entry point that turns errors into clear exits.

Exit codes: 0 clean stop (SIGTERM/SIGINT, or a mint fenced by a newer one), 2 configuration
or contract error (an object store that ignores conditional writes included: a service that
writes to it probes them before it starts), 1 anything unexpected (with its traceback in the
log). An unavailable Kafka
or S3 is never a reason to exit: the service body starts again after a backoff.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from mvsink.core.errors import MvsinkError
from mvsink.io.config import Config, load_config, settings_help
from mvsink.io.health import Backoff, Health, dependency_probes, transient
from mvsink.io.s3 import probe_conditional_writes


class Stopping:
    """A service's run: its stop flag, set by SIGTERM/SIGINT (loops poll `stopped` and wait
    with `wait`), and its health (`mvsink.io.health.Health`, None outside a service), which the
    service body reports its progress to (`report`, `blocked`). `run_service` makes it and
    hands it to the body."""

    def __init__(self, health: Health | None = None, sink: str | None = None) -> None:
        self._event = threading.Event()
        self.health = health
        #: The sink of a host's unit (`unit`): health is reported as that sink's.
        self.sink = sink
        self._units: set[Stopping] = set()
        #: Why the stop was asked for, when not by a signal (`set`).
        self.why: str | None = None
        self._periodic: set[str] = set()
        self._lock = threading.Lock()

    def install(self) -> None:
        """Route SIGTERM and SIGINT here (main thread only)."""
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        logging.getLogger("mvsink").info("received %s: stopping", signal.Signals(signum).name)
        self.set()

    def set(self, why: str | None = None) -> None:
        """Ask the loop to stop (`why`: the reason a body may act on, kept in `why`), and
        every unit's (`unit`)."""
        if why is not None:
            self.why = why
        self._event.set()
        with self._lock:
            units = list(self._units)
        for unit in units:
            unit.set()

    def unit(self, sink: str) -> Stopping:
        """The run of a host's unit serving `sink`: stopped with this one (or alone, `set`),
        its health reported as `sink`'s (`Health.report(..., sink=)`)."""
        unit = Stopping(self.health, sink)
        with self._lock:
            self._units.add(unit)
        if self._event.is_set():
            unit.set()
        return unit

    def release(self, unit: Stopping) -> None:
        """`unit` ended: forget it, and its sink's health."""
        with self._lock:
            self._units.discard(unit)
        if self.health is not None and unit.sink is not None:
            self.health.forget(unit.sink)

    def every(self, name: str, interval: float, check: Callable[[], None]) -> None:
        """Run `check` every `interval` seconds on a daemon thread `name` until the stop; once
        per name, however often a body that starts again asks. `check` handles its errors."""
        with self._lock:
            if name in self._periodic:
                return
            self._periodic.add(name)

        def loop() -> None:
            while not self._event.wait(interval):
                check()

        threading.Thread(target=loop, name=name, daemon=True).start()

    @property
    def stopped(self) -> bool:
        """Whether a stop was asked for (every loop checks: the service's heartbeat too)."""
        if self.health is not None:
            self.health.beat(self.sink)
        return self._event.is_set()

    def report(self, frontier: int | None, target: int | None) -> None:
        """The service's frontier and target (`Health.report`; no-op without a health)."""
        if self.health is not None:
            self.health.report(frontier, target, self.sink)

    def blocked(self, reason: str | None) -> None:
        """The service is blocked until an operator acts, or no longer (`Health.blocked`;
        no-op without a health)."""
        if self.health is not None:
            self.health.blocked(reason, self.sink)

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking early on stop; whether stopping."""
        return self._event.wait(seconds)


#: The thread name prefix of a host's unit (`mvsink.io.host`): `unit:<sink>`.
UNIT_THREAD = "unit:"


def _name_unit(record: logging.LogRecord) -> bool:
    """Name the sink of a line a host's unit logs (`[sink]` after the service)."""
    thread = record.threadName or ""
    record.unit = f" [{thread.removeprefix(UNIT_THREAD)}]" if thread.startswith(UNIT_THREAD) else ""
    return True


def configure_logging(service: str, level: str) -> None:
    """One line per record: time, level, service (and the sink, on a host's unit's thread),
    logger, message (frontiers included)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_name_unit)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s {service}%(unit)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if level.upper() != "DEBUG":
        quiet_retries()


def quiet_retries() -> None:
    """One line per outage (`mvsink.io.health`), not one per retry: drop urllib3's retry warnings
    and librdkafka's reconnect failures."""
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    librdkafka = logging.getLogger("mvsink.librdkafka")
    if _not_a_reconnect not in librdkafka.filters:
        librdkafka.addFilter(_not_a_reconnect)


def _not_a_reconnect(record: logging.LogRecord) -> bool:
    """librdkafka's `FAIL` lines: a connection refused or dropped, logged at every attempt."""
    return not record.getMessage().startswith("FAIL ")


def writer_identity(config: Config, service: str) -> str:
    """This process's id in part keys, logs and metrics."""
    return config.writer_id or f"{service}-{socket.gethostname()}-{os.getpid()}"


class _Endpoint(BaseHTTPRequestHandler):
    """`/metrics` (Prometheus), `/healthz` (liveness) and `/readyz` (readiness, the reason in
    the body): 200 or 503."""

    health: Health

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._answer(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            return
        verdicts = {"/healthz": self.health.liveness, "/readyz": self.health.readiness}
        if path not in verdicts:
            self._answer(404, b"not found: /metrics, /healthz, /readyz\n", "text/plain")
            return
        ok, why = verdicts[path]()
        self._answer(200 if ok else 503, f"{why}\n".encode(), "text/plain; charset=utf-8")

    def _answer(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None  # scraped every few seconds: not worth a log line


def serve_metrics(config: Config, health: Health) -> int:
    """Start the metrics and health endpoint on its own thread; the port it listens on."""
    handler = type("Endpoint", (_Endpoint,), {"health": health})
    server = ThreadingHTTPServer((config.metrics_addr, config.metrics_port), handler)
    server.daemon_threads = True
    port = int(server.server_address[1])
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    logging.getLogger("mvsink").info(
        "metrics on http://%s:%d/metrics (health: /healthz, /readyz)", config.metrics_addr, port
    )
    return port


EXIT_CODES = """exit codes: 0 stopped by SIGTERM/SIGINT (or a mint fenced by a newer one),
2 a configuration or contract error (the message names the setting; also an object store that
ignores conditional writes, probed at start), 1 anything unexpected
(its traceback is in the log). An unavailable Kafka or S3 is retried with backoff, never an
exit; /healthz (liveness) and /readyz (readiness, the reason in the body) are served next to
/metrics."""


def say(message: str) -> None:
    """Progress output of an operator command: stderr, flushed, timestamped."""
    # One write per line, so lines from parallel steps (builds) never interleave.
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def module_process(module: str, env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run `python -m <module>` from the code this
    process runs: the package root first on the path and the working directory not on it
    (`-P`), so another checkout's or folder's `services` package is never picked up, and a
    relative `MVSINK_CONFIG` made absolute."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    if env.get("MVSINK_CONFIG"):
        env["MVSINK_CONFIG"] = str(Path(env["MVSINK_CONFIG"]).resolve())
    return [sys.executable, "-P", "-m", module], env


def run_module(module: str, args: list[str], env: Mapping[str, str]) -> int:
    """Run `python -m <module> ARGS` (`module_process`) in the foreground, this process's stdin
    and output its own: its exit status, 128 + n if signal n ended it."""
    command, env = module_process(module, env)
    status = subprocess.call([*command, *args], env=env)
    return 128 - status if status < 0 else status


def run_command(command: Callable[[], int]) -> int:
    """Run an operator command's body: its exit status; a `MvsinkError` is printed as one
    `mvsink: error:` line (2), an interrupt is 130."""
    try:
        return command()
    except MvsinkError as error:
        print(f"mvsink: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def service_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The command line of `python -m services.<name>`: `--config FILE`, and a `--help` with
    what the service does (the first paragraph and picture of its module docs `doc`), every
    setting it reads with its default, and the exit codes. Needs no running stack."""
    parser = argparse.ArgumentParser(
        prog=f"python -m services.{name}",
        description=_summary(doc or name),
        epilog=f"{settings_help()}\n\n{EXIT_CODES}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", metavar="FILE", help="a TOML settings file (default: $MVSINK_CONFIG)"
    )
    return parser


def _summary(doc: str) -> str:
    """The first paragraph of module docs, and the picture right after it if there is one."""
    head, _, rest = doc.strip().partition("\n\n")
    if rest.startswith("```"):
        return f"{head}\n{rest.split('```')[1].rstrip()}"
    return head


def probe_store(config: Config, name: str) -> None:
    """What a service that writes to object storage does first, once its own configuration
    checked out: make sure the store honours conditional writes (`probe_conditional_writes`
    at `probes/<name>-<nonce>`), which its compare-and-sets rest on. Run at every start of
    the body: an unavailable store is an outage like any other.

    Raises:
        ConditionalWritesIgnored: the store wrote where a condition should have refused (exit 2).
    """
    probe_conditional_writes(config.s3, f"probes/{name}-{uuid.uuid4().hex}")


def run_service(
    name: str,
    body: Callable[[Config, Stopping], int],
    doc: str | None = None,
    argv: list[str] | None = None,
    endpoints: Callable[[], Mapping[str, Any]] | None = None,
) -> int:
    """Parse the command line (`service_parser`), load the configuration (with the values
    `endpoints` gives, `load_config`'s source 2: the entry point passes the embedded stack's),
    set up logging, signals and metrics, run `body`."""
    args = service_parser(name, doc).parse_args(argv)
    try:
        config = load_config(args.config, endpoints=endpoints() if endpoints else None)
    except MvsinkError as error:
        print(f"{name}: configuration error: {error}", file=sys.stderr)
        return 2
    configure_logging(name, config.log_level)
    health = Health(name, config.live_bound, config.ready_bound, dependency_probes(config))
    stopping = Stopping(health)
    stopping.install()
    log = logging.getLogger("mvsink")
    backoff = Backoff()
    try:
        serve_metrics(config, health)
        health.start()
        while True:
            started = time.monotonic()
            try:
                return body(config, stopping)
            except Exception as error:
                if not transient(error):
                    raise
                if stopping.stopped:
                    return 0
                health.failed(error)
                if time.monotonic() - started > 60:
                    backoff.reset()  # it ran a while: a new outage, not the same one
                wait = backoff.next()
                log.debug("%s: starting again in %.1fs after %r", name, wait, error)
                if stopping.wait(wait):
                    return 0
    except MvsinkError as error:
        log.error("%s stopped: %s", name, error)
        return 2
    except Exception:
        log.exception("%s failed", name)
        return 1
    finally:
        health.stop()

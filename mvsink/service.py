"""What every service process shares: logging with frontiers, graceful shutdown on SIGTERM,
the Prometheus metrics endpoint, and one entry point that turns errors into clear exits.

Exit codes: 0 clean stop (SIGTERM/SIGINT, or a mint fenced by a newer one), 2 configuration
or contract error, 1 anything unexpected (with its traceback in the log).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType

from prometheus_client import start_http_server

from mvsink.config import Config, load_config
from mvsink.errors import MvsinkError


class Stopping:
    """A stop flag set by SIGTERM/SIGINT; loops poll `stopped` and wait with `wait`."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def install(self) -> None:
        """Route SIGTERM and SIGINT here (main thread only)."""
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        logging.getLogger("mvsink").info("received %s: stopping", signal.Signals(signum).name)
        self._event.set()

    def set(self) -> None:
        """Ask the loop to stop."""
        self._event.set()

    @property
    def stopped(self) -> bool:
        """Whether a stop was asked for."""
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking early on stop; whether stopping."""
        return self._event.wait(seconds)


def configure_logging(service: str, level: str) -> None:
    """One line per record: time, level, service, logger, message (frontiers included)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def writer_identity(config: Config, service: str) -> str:
    """This process's id in part keys, logs and metrics."""
    return config.writer_id or f"{service}-{socket.gethostname()}-{os.getpid()}"


def serve_metrics(config: Config) -> int:
    """Start the Prometheus endpoint; the port it listens on."""
    port = config.metrics_port
    if port == 0:
        with socket.socket() as probe:
            probe.bind((config.metrics_addr, 0))
            port = int(probe.getsockname()[1])
    start_http_server(port, addr=config.metrics_addr)
    logging.getLogger("mvsink").info("metrics on http://%s:%d/metrics", config.metrics_addr, port)
    return port


def run_service(name: str, body: Callable[[Config, Stopping], int]) -> int:
    """Load the configuration, set up logging, signals and metrics, run `body`."""
    try:
        config = load_config()
    except MvsinkError as error:
        print(f"{name}: configuration error: {error}", file=sys.stderr)
        return 2
    configure_logging(name, config.log_level)
    stopping = Stopping()
    stopping.install()
    log = logging.getLogger("mvsink")
    try:
        serve_metrics(config)
        return body(config, stopping)
    except MvsinkError as error:
        log.error("%s stopped: %s", name, error)
        return 2
    except Exception:
        log.exception("%s failed", name)
        return 1

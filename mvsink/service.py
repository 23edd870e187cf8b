"""What every service process shares: logging with frontiers, graceful shutdown on SIGTERM,
the Prometheus metrics endpoint, and one entry point that turns errors into clear exits.

Exit codes: 0 clean stop (SIGTERM/SIGINT, or a mint fenced by a newer one), 2 configuration
or contract error, 1 anything unexpected (with its traceback in the log).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType

from prometheus_client import start_http_server

from mvsink.config import Config, load_config, settings_help
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


EXIT_CODES = """exit codes: 0 stopped by SIGTERM/SIGINT (or a mint fenced by a newer one),
2 a configuration or contract error (the message names the setting), 1 anything unexpected
(its traceback is in the log)."""


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
    parser.add_argument("--config", metavar="FILE",
                        help="a TOML settings file (default: $MVSINK_CONFIG)")  # fmt: skip
    return parser


def _summary(doc: str) -> str:
    """The first paragraph of module docs, and the picture right after it if there is one."""
    head, _, rest = doc.strip().partition("\n\n")
    if rest.startswith("```"):
        return f"{head}\n{rest.split('```')[1].rstrip()}"
    return head


def run_service(
    name: str, body: Callable[[Config, Stopping], int], doc: str | None = None,
    argv: list[str] | None = None,
) -> int:  # fmt: skip
    """Parse the command line (`service_parser`), load the configuration, set up logging,
    signals and metrics, run `body`."""
    args = service_parser(name, doc).parse_args(argv)
    try:
        config = load_config(args.config)
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

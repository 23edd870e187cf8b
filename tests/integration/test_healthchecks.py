"""The compose deployment's healthcheck scripts against the real services: `kafka-ready` asks
the broker an ApiVersions round trip, `http-ready` asks MinIO's readiness (and, given a text,
looks for it in the body). Each check is the command `docker-compose.yaml` runs, pointed at this
run's ports; what a check must refuse (a port that speaks HTTP, a closed one, a body without the
text, a 404) is tried too. (The Spark daemons' checks: `test_spark_cluster.py`.)"""

from __future__ import annotations

import http.server
import threading
from typing import Any

import pytest
from sinkkit import compose_check, run_check

from mvsink.io.config import S3Settings
from mvsink.stack.procs import free_ports

pytestmark = pytest.mark.integration


def _port(address: str) -> int:
    """The port of a `host:port` address (a Kafka bootstrap server, the S3 endpoint)."""
    return int(address.rsplit(":", 1)[1])


def test_kafka_ready_passes_on_the_broker_only(
    kafka_bootstrap: str, s3_settings: S3Settings
) -> None:
    check = compose_check("kafka")
    assert check[0] == "kafka-ready"
    ok = run_check(check, _port(kafka_bootstrap.split(",")[0]))
    assert ok.returncode == 0, ok.stderr
    http = run_check(check, _port(s3_settings.endpoint))
    assert http.returncode == 1 and "no ApiVersions answer" in http.stderr, http
    closed = run_check(check, free_ports(1)[0])
    assert closed.returncode == 1, closed


def test_http_ready_passes_on_a_ready_minio_and_checks_the_body(s3_settings: S3Settings) -> None:
    check = compose_check("minio")
    port = _port(s3_settings.endpoint)
    ok = run_check(check, port)
    assert ok.returncode == 0, ok.stderr
    _, _, path = check
    # The health path answers 200 with an empty body: a text is looked for in the body, never
    # in the headers (`Server: MinIO` is one).
    absent = run_check(["http-ready", "PORT", path, "MinIO"], port)
    assert absent.returncode == 1 and "no 'MinIO'" in absent.stderr, absent
    missing = run_check(["http-ready", "PORT", "/minio/health/nothing-here"], port)
    assert missing.returncode == 1, missing
    closed = run_check(check, free_ports(1)[0])
    assert closed.returncode == 1, closed


def _echo_server(body: bytes) -> http.server.HTTPServer:
    """A one-shot HTTP server here that answers 200 with `body`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.handle_request, daemon=True).start()
    return server


@pytest.mark.parametrize(
    ("body", "passes"),
    [
        (b'{\n  "status" : "ALIVE",\n  "workers" : [ ]\n}', True),
        (b'{"status":"ALIVE"}', True),
        (b'{\n  "status" : "STANDBY"\n}', False),
        (b"", False),
    ],
)
def test_http_ready_finds_its_text_whatever_the_white_space(body: bytes, passes: bool) -> None:
    check = compose_check("spark-master")
    server = _echo_server(body)
    try:
        result = run_check(check, server.server_address[1])
    finally:
        server.server_close()
    assert (result.returncode == 0) == passes, result

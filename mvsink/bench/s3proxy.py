"""A reverse proxy in front of an S3 endpoint that counts the requests passing through it, by
method and by what the key is (`kind`): how the benchmarks tell what each replica asks of the
store (every process of it, Spark's Python workers included, since they all reach the store
at the endpoint their configuration names). It can also drop request headers, which is how a
test makes a store that ignores conditional writes.

    with S3Proxy(settings.endpoint) as proxy:
        counted = replace(settings, endpoint=proxy.endpoint)
        ...
        proxy.total()

It listens on a free port of 127.0.0.1, one thread per client connection, each with one
upstream connection kept open; bodies are read whole (parts and checkpoints are a few MB).
`ProxyProcess` runs one in a process of its own, for the benchmarks.
"""

from __future__ import annotations

import bisect
import http.client
import json
import subprocess
import sys
import threading
import time
from array import array
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

#: Response headers the proxy sets itself.
_HOP = frozenset({"content-length", "transfer-encoding", "connection"})


def kind(path: str) -> str:
    """What a request's key is: `state` (shard state versions), `parts`, `checkpoints` (the
    write service's), `bucket` (a LIST or a bucket call), `other`."""
    key = unquote(urlsplit(path).path).lstrip("/").partition("/")[2]
    if not key:
        return "bucket"
    if "/state/" in key:
        return "state"
    if "/parts/" in key:
        return "parts"
    if key.startswith("sinks/") and "/write/" in key:
        return "checkpoints"
    return "other"


class S3Proxy:
    """The proxy (module docs): `endpoint` to give clients, `counts` by (method, kind)."""

    def __init__(self, upstream: str, drop: frozenset[str] = frozenset()) -> None:
        self.upstream = upstream
        self.drop = frozenset(h.lower() for h in drop)
        self.counts: Counter[tuple[str, str]] = Counter()
        #: When each request came (`time.monotonic`, in order; 8 bytes each, for long soaks).
        self.times = array("d")
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.endpoint = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="mvsink-s3-proxy", daemon=True
        )

    def total(self) -> int:
        """Requests forwarded so far."""
        with self._lock:
            return sum(self.counts.values())

    def snapshot(self) -> dict[str, int]:
        """The counts so far, as `METHOD kind` -> requests."""
        with self._lock:
            return {f"{m} {k}": n for (m, k), n in sorted(self.counts.items())}

    def between(self, start: float, end: float) -> int:
        """Requests that came between `start` and `end` (`time.monotonic`)."""
        with self._lock:
            return bisect.bisect_right(self.times, end) - bisect.bisect_left(self.times, start)

    def per_hour(self, start: float, end: float) -> float | None:
        """The request rate between `start` and `end`, per hour (None for an empty span)."""
        return self.between(start, end) * 3600 / (end - start) if end > start else None

    def count(self, method: str, path: str) -> None:
        with self._lock:
            self.counts[(method, kind(path))] += 1
            self.times.append(time.monotonic())

    def __enter__(self) -> S3Proxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind_: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()


#: The proxy's own path: `?start=S&end=E` (`time.monotonic`) answers its counts as JSON.
COUNTS_PATH = "/_mvsink/counts"


class ProxyProcess:
    """An `S3Proxy` in a process of its own (`python -m mvsink.bench.s3proxy UPSTREAM`), so
    that forwarding a replica's requests takes no turns from the benchmark's own threads (its
    feeder and sampler): the same `endpoint`, `per_hour` and `snapshot`, asked over HTTP.
    `time.monotonic` is the system's monotonic clock, the same in both processes."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.endpoint = ""
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> ProxyProcess:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "mvsink.bench.s3proxy", self.upstream],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.startswith("listening on "):
            self._process.kill()
            raise RuntimeError(f"the S3 proxy did not start: {line!r}")
        self.endpoint = line.removeprefix("listening on ")
        return self

    def _ask(self, start: float = 0.0, end: float = 0.0) -> dict[str, Any]:
        connection = http.client.HTTPConnection(self.endpoint, timeout=30)
        try:
            connection.request("GET", f"{COUNTS_PATH}?start={start!r}&end={end!r}")
            return cast(dict[str, Any], json.loads(connection.getresponse().read()))
        finally:
            connection.close()

    def per_hour(self, start: float, end: float) -> float | None:
        """As `S3Proxy.per_hour`."""
        return float(self._ask(start, end)["per_hour"]) if end > start else None

    def snapshot(self) -> dict[str, int]:
        """As `S3Proxy.snapshot`."""
        return cast(dict[str, int], self._ask()["counts"])

    def __exit__(
        self,
        kind_: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(30)


def _handler(proxy: S3Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # A reply's headers and body go out in two writes: with Nagle's algorithm on, the
        # second waits for the client's delayed ACK (40 ms a request on a kept connection).
        disable_nagle_algorithm = True
        upstream: http.client.HTTPConnection | None = None

        def _counts(self) -> None:
            query = parse_qs(urlsplit(self.path).query)
            start, end = (float(query.get(k, ["0"])[0]) for k in ("start", "end"))
            body = json.dumps(
                {"per_hour": proxy.per_hour(start, end), "counts": proxy.snapshot()}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self) -> None:
            if self.path.startswith(COUNTS_PATH):
                self._counts()
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in proxy.drop}
            proxy.count(self.command, self.path)
            for attempt in (1, 2):  # once more on a kept connection the store closed
                if self.upstream is None:
                    self.upstream = http.client.HTTPConnection(proxy.upstream, timeout=60)
                try:
                    self.upstream.request(self.command, self.path, body=body, headers=headers)
                    response = self.upstream.getresponse()
                    data = response.read()
                    break
                except (http.client.HTTPException, ConnectionError):
                    self.upstream.close()
                    self.upstream = None
                    if attempt == 2:
                        raise
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in _HOP:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _forward

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def main(argv: list[str] | None = None) -> int:
    """`python -m mvsink.bench.s3proxy UPSTREAM`: serve until terminated (`ProxyProcess`)."""
    import signal

    args = sys.argv[1:] if argv is None else argv
    with S3Proxy(args[0]) as proxy:
        print(f"listening on {proxy.endpoint}", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())

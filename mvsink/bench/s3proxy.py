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
"""

from __future__ import annotations

import bisect
import http.client
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import unquote, urlsplit

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
        #: When each request came (`time.monotonic`, in order).
        self.times: list[float] = []
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


def _handler(proxy: S3Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        upstream: http.client.HTTPConnection | None = None

        def _forward(self) -> None:
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

"""Toxiproxy (Shopify's TCP proxy with injectable faults), built from its Go module with
`go install`, on loopback: `mvsink bench faults` routes the services' S3 traffic through it to
slow MinIO down (`minio-slow`), which killing or stopping a process cannot do.

API (`http://127.0.0.1:<port>`): `POST /proxies` makes a proxy, `POST
/proxies/<name>/toxics` adds a toxic (here `latency`), `DELETE /proxies/<name>/toxics/<toxic>`
removes it.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mvsink.stack import procs
from mvsink.stack.component import Component

TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
TOXIPROXY_VERSION = "v2.5.0"


def ensure_binary(cache: Path, say: procs.Say) -> Path:
    """The `server` executable of Toxiproxy, built with `go install` into the cache if needed."""
    return procs.go_install(
        TOXIPROXY_MODULE,
        TOXIPROXY_VERSION,
        "server",
        cache / "toxiproxy" / TOXIPROXY_VERSION,
        say,
        "Toxiproxy",
    )


@dataclass
class Toxiproxy(Component):
    """One Toxiproxy server, its API on `port`; it runs as `pid` once started (not recorded in
    `stack.json`: the fault matrix that starts it stops it)."""

    LOG = "toxiproxy.log"

    pid: int | None = None

    def start(self, binary: Path, say: procs.Say) -> Toxiproxy:
        """Launch the server and wait until its API answers."""
        say(f"starting Toxiproxy (API on {self.address}) ...")
        self.home.mkdir(parents=True, exist_ok=True)
        self.pid = procs.spawn(
            [str(binary), "-host", procs.LOOPBACK, "-port", str(self.port)],
            log=self.log,
            env=procs.base_env(),
            cwd=self.home,
        )
        procs.wait_ready("Toxiproxy", self.ready, pid=self.pid, log=self.log, timeout=30)
        return self

    def ready(self) -> bool:
        """Whether its API accepts connections."""
        return procs.accepts_connections(self.port)

    def stop(self) -> None:
        if self.pid is not None:
            procs.stop(self.pid)
            self.pid = None

    def proxy(self, name: str, listen_port: int, upstream: str) -> str:
        """A proxy `name` from `127.0.0.1:listen_port` to `upstream` (`host:port`); its address."""
        listen = f"{procs.LOOPBACK}:{listen_port}"
        self._call(
            "POST",
            "/proxies",
            {"name": name, "listen": listen, "upstream": upstream, "enabled": True},
        )
        return listen

    def add_latency(self, name: str, toxic: str, latency_ms: int) -> None:
        """Delay every chunk of `name`'s responses by `latency_ms`."""
        self._call(
            "POST",
            f"/proxies/{name}/toxics",
            {
                "name": toxic,
                "type": "latency",
                "stream": "downstream",
                "toxicity": 1.0,
                "attributes": {"latency": latency_ms, "jitter": 0},
            },
        )

    def remove(self, name: str, toxic: str) -> None:
        self._call("DELETE", f"/proxies/{name}/toxics/{toxic}")

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> None:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://{self.address}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

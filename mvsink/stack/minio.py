"""Embedded S3: a MinIO server built from its Go module with `go install`, on loopback.

The pin is a commit of github.com/minio/minio later than RELEASE.2025-10-15T17-29-55Z (the
release that fixed `If-None-Match: *`; RELEASE.2025-09-06 breaks it). The module proxy serves
it as a pseudo-version. The binary reports `DEVELOPMENT.GOGET`. Nothing in mvsink depends on
MinIO beyond S3 plus conditional writes, so any such S3 endpoint can replace it.
"""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mvsink.stack import procs
from mvsink.stack.component import Component

MINIO_MODULE = "github.com/minio/minio"
#: Commit 7aac2a2c5b7c of 2026-02-12 (after RELEASE.2025-10-15T17-29-55Z).
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"


def ensure_binary(cache: Path, say: procs.Say) -> Path:
    """The `minio` executable, built with `go install` into the cache if not there yet."""
    return procs.go_install(
        MINIO_MODULE, MINIO_VERSION, "minio", cache / "minio" / MINIO_VERSION, say, "MinIO"
    )


@dataclass
class MinioNode(Component):
    """One single-drive MinIO server: the S3 API on its `address` (`port`), the console on
    `console_port`."""

    PORTS = ("port", "console_port")
    LOG = "minio.log"

    console_port: int

    def start(self, binary: Path, access_key: str, secret_key: str, say: procs.Say) -> int:
        """Launch the server; its pid (not yet ready)."""
        data = self.home / "data"
        data.mkdir(parents=True, exist_ok=True)
        env = dict(
            procs.base_env(),
            MINIO_ROOT_USER=access_key,
            MINIO_ROOT_PASSWORD=secret_key,
            MINIO_BROWSER="off",
            MINIO_UPDATE="off",
            MINIO_CI_CD="1",
        )
        say(f"starting MinIO on http://{self.address} ...")
        return procs.spawn(
            [
                str(binary),
                "server",
                str(data),
                "--quiet",
                "--address",
                self.address,
                "--console-address",
                f"{procs.LOOPBACK}:{self.console_port}",
            ],
            log=self.log,
            env=env,
            cwd=self.home,
        )

    def ready(self) -> bool:
        """Whether the server is ready (`minio_ready`)."""
        return minio_ready(self.address)


def minio_ready(endpoint: str) -> bool:
    """Whether the MinIO at `host:port` answers 200 on `/minio/health/cluster`."""
    with urllib.request.urlopen(f"http://{endpoint}/minio/health/cluster", timeout=2) as response:
        return bool(response.status == 200)

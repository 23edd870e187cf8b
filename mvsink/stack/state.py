"""The embedded stack's record on disk: what `mvsink stack up` started, where, with which pid.

Layout under the stack home (default `<state dir>/stack`)::

    stack.json              components: pid, ports, address, log
    credentials/s3-access-key, credentials/s3-secret-key   (mode 0600, generated once)
    kafka/                  server.properties, data/, kafka.log
    minio/                  data/, minio.log
    registry/               registry.log, work/   (only with `up --registry`; storage in memory)
    spark/                  master.log, spark-worker-<i>/ (worker.log, work/: executors' logs)

`down` stops only the pids recorded here, so it never touches anything it did not start.

`stack_config` is the configuration with the running stack's endpoints injected (source 2 of
`mvsink.io.config`): what the `mvsink` command, the tools and the services' entry points load.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mvsink.io.config import Config, load_config, state_dir
from mvsink.stack import procs


@dataclass
class ComponentRecord:
    """One started component."""

    name: str
    pid: int
    address: str
    ports: dict[str, int]
    log: str

    @property
    def alive(self) -> bool:
        """Whether its process still runs."""
        return procs.pid_alive(self.pid)


def stack_home(state_dir: Path) -> Path:
    """Where `mvsink stack up` keeps the stack it starts for this checkout."""
    return state_dir / "stack"


def load_records(home: Path) -> dict[str, ComponentRecord]:
    """The components recorded under `home` (empty if none)."""
    path = home / "stack.json"
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {name: ComponentRecord(**fields) for name, fields in raw.get("components", {}).items()}


def save_records(home: Path, records: dict[str, ComponentRecord]) -> None:
    """Write the records atomically (write then rename)."""
    home.mkdir(parents=True, exist_ok=True)
    tmp = home / "stack.json.tmp"
    tmp.write_text(json.dumps({"components": {n: asdict(r) for n, r in records.items()}}, indent=2))
    tmp.replace(home / "stack.json")


def credentials(home: Path) -> tuple[str, str]:
    """The embedded MinIO's access and secret key, generated on first use, stored 0600."""
    folder = home / "credentials"
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    fresh = {
        "s3-access-key": "mvsink-" + secrets.token_hex(4),
        "s3-secret-key": secrets.token_urlsafe(24),
    }
    values = []
    for name, value in fresh.items():
        path = folder / name
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(value)
        values.append(path.read_text().strip())
    return values[0], values[1]


def running_endpoints(state_dir: Path) -> dict[str, str]:
    """Config values pointing at this checkout's running embedded stack, or `{}` if none runs;
    `schema_registry_url` only while its optional Schema Registry runs."""
    home = stack_home(state_dir)
    records = load_records(home)
    kafka, minio = records.get("kafka"), records.get("minio")
    if kafka is None or minio is None or not (kafka.alive and minio.alive):
        return {}
    access_key, secret_key = credentials(home)
    endpoints = {
        "kafka_bootstrap": kafka.address,
        "s3_endpoint": minio.address,
        "s3_access_key": access_key,
        "s3_secret_key": secret_key,
    }
    registry = records.get("registry")
    if registry is not None and registry.alive:
        endpoints["schema_registry_url"] = registry_url(registry.address)
    return endpoints


#: Where the embedded Schema Registry (Apicurio, `mvsink.stack.registry`) serves the Confluent-
#: compatible API.
CCOMPAT_PATH = "/apis/ccompat/v7"


def registry_url(address: str) -> str:
    """The Confluent-compatible API's base URL of the embedded Schema Registry at `host:port`."""
    return f"http://{address}{CCOMPAT_PATH}"


def stack_endpoints(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`running_endpoints` of the state directory of `env` (`os.environ` unless given)."""
    return dict(running_endpoints(state_dir(env)))


def stack_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """`load_config(path, env)` with the endpoints and credentials of the embedded stack running
    under the state directory of `env`, if one runs (`stack_endpoints`)."""
    return load_config(path, env, endpoints=stack_endpoints(env))

"""What every component of the embedded stack is: one process under its own `home` directory
(config, data, log), listening on loopback ports.

A component's `start` launches its process detached and returns before it is ready (the
manager records the pid first, so `down` can stop a start that never finishes); `ready` is what
`procs.wait_ready` polls; `record` is its entry in `stack.json` (`mvsink.stack.state`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from mvsink.stack import procs
from mvsink.stack.state import ComponentRecord


@dataclass
class Component(ABC):
    """One process of the stack under `home`, serving on 127.0.0.1:`port`."""

    #: The names of its port fields, as `stack.json` records them (`port` first).
    PORTS: ClassVar[tuple[str, ...]] = ("port",)
    #: Its log file's name under `home`.
    LOG: ClassVar[str]

    home: Path
    port: int

    @property
    def address(self) -> str:
        """Where clients reach it: `host:port`."""
        return f"{procs.LOOPBACK}:{self.port}"

    @property
    def log(self) -> Path:
        """Its log file."""
        return self.home / self.LOG

    @abstractmethod
    def ready(self) -> bool:
        """Whether it serves (polled after `start` until true)."""

    def record(self, name: str, pid: int) -> ComponentRecord:
        """Its entry in `stack.json` as component `name`, running as `pid`."""
        ports = {field: int(getattr(self, field)) for field in self.PORTS}
        return ComponentRecord(name, pid, self.address, ports, str(self.log))

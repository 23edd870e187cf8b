"""The embedded stack through its CLI, as a user runs it: up, status, env, demo, down; and a
component that cannot start fails loudly with its log tail."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from sinkkit import clean_env, mvsink_cli

from mvsink.core.errors import StackError
from mvsink.io.config import cache_dir
from mvsink.stack import minio, procs
from mvsink.stack.manager import Stack
from mvsink.stack.state import load_records

pytestmark = pytest.mark.integration


def test_cli_stack_up_status_env_demo_down(tmp_path: Path) -> None:
    env = clean_env(tmp_path / "state")
    try:
        up = mvsink_cli(["stack", "up"], env)
        assert up.returncode == 0, up.stderr
        assert "topics created: demo.desired" in up.stderr
        assert "demo-smoke" not in up.stderr
        status = mvsink_cli(["stack", "status"], env)
        assert status.stdout.count(" running ") == 2, status.stdout
        exports = mvsink_cli(["stack", "env"], env).stdout
        assert "MVSINK_KAFKA_BOOTSTRAP=127.0.0.1:" in exports
        assert "MVSINK_S3_SECRET_KEY_FILE=" in exports and "SECRET_KEY=" not in exports.replace(
            "SECRET_KEY_FILE=", ""
        )

        demo = mvsink_cli(["smoke"], env)
        assert demo.returncode == 0, demo.stderr
        assert "smoke demo OK" in demo.stderr
    finally:
        records = load_records(tmp_path / "state" / "stack")
        down = mvsink_cli(["stack", "down"], env)
    assert down.returncode == 0 and "kafka" in down.stdout and "minio" in down.stdout
    assert records and not any(procs.pid_alive(r.pid) for r in records.values())
    assert mvsink_cli(["stack", "status"], env).stdout.count(" stopped ") == 2


def test_down_stops_nothing_it_did_not_start(tmp_path: Path) -> None:
    assert Stack(tmp_path / "empty", cache_dir()).down() == []


def test_component_that_cannot_start_fails_with_its_log_tail(tmp_path: Path) -> None:
    binary = minio.ensure_binary(cache_dir(), lambda _: None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        node = minio.MinioNode(tmp_path / "minio", taken.getsockname()[1], procs.free_ports(1)[0])
        pid = node.start(binary, "access-key", "secret-key-123", lambda _: None)
        with pytest.raises(
            StackError, match=r"MinIO exited during start; log .*minio.log"
        ) as caught:
            procs.wait_ready("MinIO", node.ready, pid=pid, log=node.log, timeout=60)
        procs.stop(pid)
    assert "port is already in use" in str(caught.value).lower()  # the tail of its own log


def test_cli_error_is_one_clear_line(tmp_path: Path) -> None:
    env = {**os.environ, "MVSINK_STATE_DIR": str(tmp_path / "nothing")}
    result = mvsink_cli(["stack", "env"], env)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "mvsink: error: the embedded stack is not running: run `mvsink stack up` first"
    )

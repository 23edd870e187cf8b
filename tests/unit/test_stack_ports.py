"""A killed component's port is free again for its restart while its connections linger in
TIME_WAIT, and a port something listens on is never free."""

from __future__ import annotations

import errno
import socket
import time

import pytest

from mvsink.stack.procs import LOOPBACK, port_is_free


def _time_wait_port() -> int:
    """A port whose server closed first (its side of the connection is in TIME_WAIT)."""
    server = socket.create_server((LOOPBACK, 0))
    port = int(server.getsockname()[1])
    client = socket.create_connection((LOOPBACK, port))
    accepted, _ = server.accept()
    accepted.close()  # the server closes first: its side goes to TIME_WAIT
    assert client.recv(1) == b""
    client.close()
    server.close()
    time.sleep(0.1)
    return port


def test_a_port_in_time_wait_is_free_for_a_restart() -> None:
    port = _time_wait_port()
    with socket.socket() as plain, pytest.raises(OSError) as refused:
        plain.bind((LOOPBACK, port))  # a bind without address reuse
    assert refused.value.errno == errno.EADDRINUSE
    assert port_is_free(port)


def test_a_port_with_a_listener_is_taken() -> None:
    with socket.create_server((LOOPBACK, 0)) as server:
        assert not port_is_free(int(server.getsockname()[1]))

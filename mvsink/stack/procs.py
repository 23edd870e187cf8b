"""Process plumbing for the embedded stack: free ports, detached processes, readiness, stopping,
and the download/build cache's fills.

Every listener binds 127.0.0.1. A component that does not become ready raises `StackError`
carrying the tail of its log, so a failed start is never silent. A cache entry is filled under
`filling`, so processes sharing the cache (the test suite's workers, two commands of one clone)
fill it once, and none uses one half-filled.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from mvsink import Say as Say  # re-exported for the stack modules
from mvsink.core.errors import StackError

LOOPBACK = "127.0.0.1"


def base_env() -> dict[str, str]:
    """Environment for stack children: ours, minus mvsink credentials they have no use for."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MVSINK_S3_")}


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that are free right now (the OS picks them)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_is_free(port: int) -> bool:
    """Whether a server can listen on 127.0.0.1:`port`. Bound with address reuse, as Kafka (the
    JVM) and MinIO (Go) bind their listeners: connections of a killed server still in TIME_WAIT
    do not make its port taken, so a restarted component gets the address its clients know."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def accepts_connections(port: int) -> bool:
    """Whether something listens on 127.0.0.1:`port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((LOOPBACK, port)) == 0


def pid_alive(pid: int | None) -> bool:
    """Whether a process with `pid` exists (and is not a zombie)."""
    if not pid:
        return False
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap our own exited children so they read as gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        status = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0]
    except OSError:
        return True
    return status != "Z"


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file, or a note that there is none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def require_tool(name: str, hint: str) -> str:
    """The path of executable `name`, or a `StackError` saying how to install it."""
    found = shutil.which(name)
    if found is None:
        raise StackError(f"`{name}` is not installed or not on PATH: {hint}")
    return found


def java() -> str:
    """The `java` every embedded server runs on (Kafka, the Schema Registry): a JDK 17+."""
    return require_tool("java", "install a JDK 17 (e.g. `apt-get install openjdk-17-jre-headless`)")


@contextlib.contextmanager
def filling(entry: Path) -> Iterator[None]:
    """Held while the cache entry `entry` is filled: an exclusive `flock` on a lock file beside
    it, freed when the holder ends however it ends. A filler checks again, once it holds it,
    whether another process filled the entry while it waited."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(entry.parent / f".{entry.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def go_install(module: str, version: str, binary: str, bindir: Path, say: Say, what: str) -> Path:
    """The executable `binary` of Go package `module@version`, built with `go install` into
    `bindir` (the download/build cache) if not there yet. It is built in a directory of its
    own and renamed into `bindir`, so `bindir/binary` exists only whole."""
    path = bindir / binary
    if path.exists():
        return path
    with filling(path):
        if path.exists():
            return path
        go = require_tool(
            "go", "install Go >= 1.24 (https://go.dev/doc/install or your package manager)"
        )
        say(f"building {what} {version} with `go install` into {bindir} (first run only) ...")
        building = bindir / f".{binary}.{os.getpid()}.build"
        building.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, GOBIN=str(building), CGO_ENABLED="0", GOFLAGS="-buildvcs=false")
        try:
            run_checked(
                [go, "install", f"{module}@{version}"],
                log=bindir / "go-install.log",
                env=env,
                what=f"building {what} with go install",
            )
            if not (building / binary).exists():
                raise StackError(f"go install finished but {building / binary} is missing")
            (building / binary).replace(path)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return path


def run_checked(
    cmd: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    what: str,
    cwd: Path | None = None,
) -> None:
    """Run a build/setup command to completion (in `cwd`), logging to `log`; raise with its
    tail on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        result = subprocess.run(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, env=dict(env or os.environ), cwd=cwd
        )
    if result.returncode != 0:
        raise StackError(f"{what} failed (exit {result.returncode}); log {log}:\n{log_tail(log)}")


def spawn(cmd: Sequence[str], *, log: Path, env: Mapping[str, str], cwd: Path) -> int:
    """Start `cmd` detached (own session, survives this process), output to `log`; its pid."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    return proc.pid


def wait_ready(
    what: str, ready: Callable[[], bool], *, pid: int, log: Path, timeout: float
) -> None:
    """Poll `ready()` until true; raise `StackError` with the log tail if the process dies or
    `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            raise StackError(f"{what} exited during start; log {log}:\n{log_tail(log)}")
        try:
            if ready():
                return
        except Exception:
            pass
        time.sleep(0.25)
    raise StackError(f"{what} not ready after {timeout:.0f}s; log {log}:\n{log_tail(log)}")


def stop(pid: int, *, grace: float = 15.0) -> None:
    """SIGTERM the process group of `pid`, then SIGKILL after `grace` seconds."""
    if not pid_alive(pid):
        return
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        time.sleep(0.1)
    _signal_group(pid, signal.SIGKILL)
    while pid_alive(pid):
        time.sleep(0.05)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

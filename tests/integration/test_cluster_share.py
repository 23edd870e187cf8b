"""Applications share the embedded Spark cluster: the cluster flow of docs/operations.md §2 ("On
a Spark cluster"), as a new user runs it, converges.

`mvsink stack up --spark-workers 2` (two workers of one core), `eval "$(mvsink stack env)"`,
`mvsink demo --ticks 6`: the demo's view job and its write driver are two applications of the
one master. Each must get executors while the other runs — neither may take every core — or
the write driver waits for an executor and the shard never reaches the view's frontier."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sinkkit import clean_env, mvsink_cli

from mvsink.stack.spark import cluster_status
from mvsink.stack.state import load_records

pytestmark = pytest.mark.integration


@pytest.fixture
def user_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A new user's shell: a state directory of its own (the shared download cache), no
    `MVSINK_*` settings; what `stack up` started is stopped afterwards."""
    env = clean_env(tmp_path / "state")
    try:
        yield env
    finally:
        down = mvsink_cli(["stack", "down"], env)
        print(down.stdout, down.stderr)


def _exports(text: str) -> dict[str, str]:
    """What `eval "$(mvsink stack env)"` sets."""
    found = {}
    for line in text.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        if line.startswith("export ") and name:
            found[name] = value
    return found


def test_the_readme_cluster_flow_converges(user_env: dict[str, str], tmp_path: Path) -> None:
    env = user_env
    up = mvsink_cli(["stack", "up", "--spark-workers", "2"], env)
    assert up.returncode == 0, up.stderr[-3000:]
    exports = _exports(mvsink_cli(["stack", "env"], env).stdout)
    assert exports["MVSINK_SPARK_MASTER"].startswith("spark://127.0.0.1:"), exports
    env.update(exports)
    master = load_records(tmp_path / "state" / "stack")["spark-master"]
    status = cluster_status(master.ports["ui_port"])
    assert status["aliveworkers"] == 2 and status["cores"] == 2, status

    log = tmp_path / "demo.log"
    #: application name -> the most cores it held; and whether the view job and the write
    #: driver ever held cores at the same time
    held: dict[str, int] = {}
    together = False
    started = time.monotonic()
    with log.open("w") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "mvsink.cli", "demo", "--ticks", "6"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            while demo.poll() is None and time.monotonic() - started < 900:
                try:
                    apps = cluster_status(master.ports["ui_port"]).get("activeapps", [])
                except OSError:
                    apps = []
                assert isinstance(apps, list)
                running = {str(a["name"]): int(a["cores"]) for a in apps}
                for name, cores in running.items():
                    held[name] = max(held.get(name, 0), cores)
                kinds = {n.split("-")[1] for n, c in running.items() if c > 0}
                together = together or {"view", "write"} <= kinds
                time.sleep(1)
        finally:
            if demo.poll() is None:
                demo.kill()
            demo.wait(60)
    text = log.read_text(errors="replace")
    print(f"demo ran {time.monotonic() - started:.0f}s; cores held per application: {held}")
    assert demo.returncode == 0, text[-4000:]
    assert "demo OK: shard == view" in text, text[-4000:]
    assert {name.split("-")[1] for name in held} == {"view", "write"}, held
    assert all(0 < cores <= 1 for cores in held.values()), held
    assert together, held

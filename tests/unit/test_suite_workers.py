"""`./run test`'s workers (pytest-xdist, `--dist loadgroup`) keep an `xdist_group` on one worker:
the tests that take the machine's benchmark lock rely on it (`sinkkit.BENCH`), and a pytest or
xdist release that stops grouping would fail them only when two of them happen to meet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: Two modules: grouped tests in both (as the benchmark tests are), and ungrouped ones beside
#: them. Each test records the worker that ran it.
MODULE = """
import os, time, pytest

def _record(name):
    time.sleep(0.2)  # long enough that both workers take tests
    with open(os.environ["RECORD"], "a") as out:
        out.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.mark.xdist_group("bench")
@pytest.mark.parametrize("i", range(3))
def test_grouped(i):
    _record(f"grouped-{__name__}-{i}")

@pytest.mark.parametrize("i", range(6))
def test_free(i):
    _record(f"free-{__name__}-{i}")
"""


def test_a_group_runs_on_one_worker_and_the_rest_on_both(tmp_path: Path) -> None:
    for name in ("test_one.py", "test_two.py"):
        (tmp_path / name).write_text(MODULE)
    record = tmp_path / "record"
    pytest = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup"]
    alone = ["-p", "no:cacheprovider", "-c", "/dev/null", "--rootdir", str(tmp_path)]
    ran = subprocess.run(
        [*pytest, *alone, str(tmp_path)],
        cwd=tmp_path,
        env={"RECORD": str(record), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    workers: dict[str, set[str]] = {"grouped": set(), "free": set()}
    lines = record.read_text().split("\n")[:-1]
    for line in lines:
        name, worker = line.split()
        workers[name.split("-")[0]].add(worker)
    assert len(lines) == 18
    assert len(workers["grouped"]) == 1, record.read_text()
    assert workers["free"] == {"gw0", "gw1"}, record.read_text()

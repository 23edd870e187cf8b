"""The benchmark's process-tree figures (`mvsink.bench.rss`) on real processes: a parent whose
child burns CPU and holds memory."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from mvsink.bench.rss import RssSampler, cpu_seconds

# A parent that starts a child which touches 200 MiB, then spins until it is killed.
CHILD = (
    "block = bytearray(200 * 2**20); block[::4096] = b'x' * len(block[::4096]); n = 0\n"
    "while True:\n    n += 1"
)
PARENT = (
    "import subprocess, sys; "
    f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}]); child.wait()"
)


def test_a_trees_cpu_and_peak_rss_count_its_descendants() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    try:
        sampler = RssSampler({"tree": parent.pid})
        time.sleep(1.0)  # the child starts, fills its block, burns
        child = int(Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()[0])
        before = cpu_seconds({"tree": parent.pid, "child": child, "gone": 2**22 + 1})
        time.sleep(1.0)
        after = cpu_seconds({"tree": parent.pid, "child": child})
        peak = sampler.stop()
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.wait(10)
    # the child's spinning loop, counted in its parent's tree: what the child burnt (its share
    # of a core, less when other work shares the machine's cores), and at most about a core
    burnt = after["child"] - before["child"]
    assert 0.1 < burnt < 1.6
    assert abs((after["tree"] - before["tree"]) - burnt) < 0.1  # the parent only waits
    assert before["gone"] == 0.0  # a pid that does not exist counts nothing
    assert peak["tree"] > 200

"""The benchmark's process-tree figures (`mvsink.bench.rss`) on real processes: a parent whose
child burns CPU and holds memory."""

from __future__ import annotations

import subprocess
import sys
import time

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
        before = cpu_seconds({"tree": parent.pid, "gone": 2**22 + 1})
        time.sleep(1.0)
        after = cpu_seconds({"tree": parent.pid})
        peak = sampler.stop()
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.wait(10)
    # the child's spinning loop: about a core, counted in its parent's tree
    assert 0.5 < after["tree"] - before["tree"] < 1.6
    assert before["gone"] == 0.0  # a pid that does not exist counts nothing
    assert peak["tree"] > 200

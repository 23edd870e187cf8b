"""One benchmark at a time on a machine (`mvsink.cli.bench.alone`): a second one is refused
with the first one's name while it runs, and the lock goes with the first one's process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mvsink.cli.bench import alone
from mvsink.core.errors import MvsinkError

HOLDER = textwrap.dedent(
    """
    import pathlib, sys, time
    from mvsink.cli.bench import alone

    held = alone(pathlib.Path(sys.argv[1]))
    held.__enter__()
    print("held", flush=True)
    time.sleep(600)
    """
)


def test_a_second_benchmark_is_refused_while_one_runs_and_not_once_it_is_killed(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "bench.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refused = rf"another benchmark .*\(pid {holder.pid} since "
        with pytest.raises(MvsinkError, match=refused), alone(lock):
            pass
        # a refusal leaves the holder's lock in place
        with pytest.raises(MvsinkError, match=refused), alone(lock):
            pass
    finally:
        holder.kill()  # as a benchmark may end: its lock ends with it
        holder.wait()
    with alone(lock):
        assert f"pid {os.getpid()} since " in lock.read_text()
    with alone(lock):  # released on the way out
        pass

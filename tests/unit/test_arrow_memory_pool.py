"""Importing mvsink makes Arrow allocate with jemalloc, in its own process and in the ones it
starts, unless `ARROW_DEFAULT_MEMORY_POOL` already names a pool."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

PROBE = """
import subprocess, sys
import pyarrow as pa
before = pa.default_memory_pool().backend_name
import mvsink
child = subprocess.run(
    [sys.executable, "-c", "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"],
    capture_output=True, text=True, check=True,
).stdout.strip()
print(before, pa.default_memory_pool().backend_name, child)
"""


def probe(**env: str) -> list[str]:
    """(the pool before `import mvsink`, after it, in a child started after it)."""
    clean = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.skipif(
    "jemalloc" not in pa.supported_memory_backends(), reason="this pyarrow has no jemalloc"
)
def test_import_switches_this_process_and_its_children_to_jemalloc() -> None:
    before, after, child = probe()
    assert before != "jemalloc"  # pyarrow's own default: the import is what changes it
    assert (after, child) == ("jemalloc", "jemalloc")


def test_a_pool_named_in_the_environment_is_kept() -> None:
    assert probe(ARROW_DEFAULT_MEMORY_POOL="system") == ["system"] * 3

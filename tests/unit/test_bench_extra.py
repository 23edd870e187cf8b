"""The benchmarks are an optional extra (`pip install 'mvsink[bench]'`): the runtime
dependencies leave its matplotlib out, and `mvsink bench` without it stops at once naming the
extra."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import tomllib
from importlib.machinery import ModuleSpec

import pytest

from mvsink.bench import EXTRA, require_extra
from mvsink.core.errors import MvsinkError
from mvsink.io.config import REPO_ROOT

# `mvsink bench shard` in a process where matplotlib cannot be found.
WITHOUT_MATPLOTLIB = textwrap.dedent(
    """
    import importlib.util, sys
    found = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *a: None if name == "matplotlib" else found(name, *a)
    from mvsink.cli import main
    sys.exit(main(["bench", "shard"]))
    """
)


def test_the_runtime_dependencies_leave_the_bench_extra_out_and_dev_pulls_it_in() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    names = {
        dep.split(">")[0].split("=")[0].split("[")[0].strip() for dep in project["dependencies"]
    }
    assert "matplotlib" not in names
    extras = project["optional-dependencies"]
    assert set(EXTRA.values()) <= {dep.split(">")[0] for dep in extras["bench"]}
    assert "mvsink[bench]" in extras["dev"]  # `./run` installs `.[dev]` for the tests


def test_require_extra_names_the_missing_distribution_and_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_extra()  # the test environment has the extra
    found = importlib.util.find_spec

    def without_matplotlib(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "matplotlib" else found(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_matplotlib)
    with pytest.raises(
        MvsinkError, match=r"matplotlib not installed.*pip install 'mvsink\[bench\]'"
    ):
        require_extra()


def test_mvsink_bench_without_the_extra_stops_at_once_naming_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'mvsink[bench]'" in done.stderr

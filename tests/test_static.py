"""Static checks as tests: ruff (lint + format) and mypy --strict over the project's code."""

from __future__ import annotations

import subprocess
import sys

from mvsink.io.config import REPO_ROOT

PATHS = ["mvsink", "services", "tests"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO_ROOT, text=True, capture_output=True, timeout=300
    )


def test_ruff_lint() -> None:
    result = _run("ruff", "check", *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = _run("ruff", "format", "--check", *PATHS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict() -> None:
    result = _run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr

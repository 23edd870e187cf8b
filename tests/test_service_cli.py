"""Each service is a program an operator can ask about: `python -m services.<name> --help`
prints what it does, `--config FILE`, every setting it reads with its TOML key, environment
variable and default, and exits 0 with no stack running and no `MVSINK_*` variable set; a
missing or wrong setting still exits 2 with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mvsink.io.config import DEFAULTS, FIELDS, MEANINGS, REPO_ROOT

SERVICES = ("mint", "write", "append", "ct")


def _run(service: str, *args: str, state: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MVSINK_")}
    env["MVSINK_STATE_DIR"] = str(state)  # an empty home: no embedded stack to find
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", f"services.{service}", *args],
        cwd=REPO_ROOT,
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
    )


@pytest.mark.parametrize("service", SERVICES)
def test_help_prints_usage_and_every_setting(service: str, tmp_path: Path) -> None:
    result = _run(service, "--help", state=tmp_path)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith(f"usage: python -m services.{service} [-h] [--config FILE]")
    assert f"{service}: " in text  # the first paragraph of the service's module docs
    assert "exit codes:" in text and "MVSINK_CONFIG" in text
    lines = {line.split()[2]: line for line in text.splitlines() if line.startswith("  [")}
    for spec in FIELDS:
        env = f"{spec.env}[_FILE]" if spec.secret else spec.env
        line = next((row for row in text.splitlines() if f" {env} " in row), None)
        assert line is not None, f"{spec.env} missing from --help"
        assert line.strip().startswith(f"[{spec.section}] {spec.key} "), line
        assert MEANINGS[spec.name] in line
        default = DEFAULTS[spec.name]
        if default not in ("", None):
            shown = str(default).lower() if isinstance(default, bool) else str(default)
            assert f" {shown} " in line, (line, shown)
    assert len(lines) == len(FIELDS)


def test_every_setting_has_a_meaning() -> None:
    assert set(MEANINGS) == {spec.name for spec in FIELDS}


@pytest.mark.parametrize("service", SERVICES)
def test_a_missing_setting_still_gets_the_clear_error(service: str, tmp_path: Path) -> None:
    result = _run(service, state=tmp_path)
    assert result.returncode == 2
    assert f"{service}: configuration error: kafka bootstrap servers not set" in result.stderr


def test_a_missing_config_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    result = _run("mint", "--config", str(missing), state=tmp_path)
    assert result.returncode == 2
    assert f"config file {missing} does not exist" in result.stderr


def test_a_setting_from_the_config_file_is_read(tmp_path: Path) -> None:
    config = tmp_path / "sink.toml"
    config.write_text('[sink]\npartitions = "many"\n')
    result = _run("append", "--config", str(config), state=tmp_path)
    assert result.returncode == 2
    assert f"{config} [sink] partitions" in result.stderr


def test_an_unknown_option_is_refused_with_the_usage(tmp_path: Path) -> None:
    result = _run("write", "--partitions", "3", state=tmp_path)
    assert result.returncode == 2
    assert "usage: python -m services.write" in result.stderr


def test_the_ct_service_names_what_is_wrong_with_its_task(tmp_path: Path) -> None:
    endpoints = {"MVSINK_KAFKA_BOOTSTRAP": "127.0.0.1:9", "MVSINK_S3_ENDPOINT": "127.0.0.1:9"}
    result = _run("ct", state=tmp_path, **endpoints)
    assert result.returncode == 2
    assert "no continual task: set [ct] task or MVSINK_CT_TASK" in result.stderr
    task = tmp_path / "task.toml"
    task.write_text(
        'name = "t"\nlogic = ["UPDATE out SET a = 1"]\n[inputs]\nsrc = "in"\n'
        '[output]\nname = "out"\nshard = "out"\nschema = "a long"\n'
    )
    result = _run("ct", state=tmp_path, MVSINK_CT_TASK=str(task), **endpoints)
    assert result.returncode == 2
    assert f"{task}: logic statement 'UPDATE out SET a = 1': use INSERT INTO out" in result.stderr


def test_a_choice_of_sinks_other_than_one_or_all_is_named(tmp_path: Path) -> None:
    endpoints = {"MVSINK_KAFKA_BOOTSTRAP": "127.0.0.1:9", "MVSINK_S3_ENDPOINT": "127.0.0.1:9"}
    result = _run("mint", state=tmp_path, MVSINK_SERVICE_SINKS="many", **endpoints)
    assert result.returncode == 2
    assert "sinks 'many': use `one` or `all`" in result.stderr
